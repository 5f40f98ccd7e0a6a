//! HTTPRoutes: which listeners each attaches to (parentRefs, `allowedRoutes`, hostname
//! intersection), and its rules compiled (matches, filters, weighted backends).

use std::collections::BTreeMap;

use super::listeners::GatewayPlan;
use super::refs::{BackendRef, resolve_backend};
use super::status::{Cond, ParentKey, ParentState, RouteState};
use crate::gateway_api::httproutes::{
    HttpRouteParentRefs, HttpRouteRules, HttpRouteRulesFilters, HttpRouteRulesFiltersType,
    HttpRouteRulesMatches, HttpRouteRulesMatchesHeadersType, HttpRouteRulesMatchesPathType,
    HttpRouteRulesMatchesQueryParamsType,
};
use crate::gateway_api::{GROUP, HTTPRoute};
use crate::gateway_model::hostname::Hostname;
use crate::gateway_model::{
    BackendTarget, Filters, GatewayRule, HeaderEdits, PathModifier, PathRule, Pattern,
    RedirectFilter, RewriteFilter, ValueMatch, ValueRule, WeightedBackend,
};
use crate::model::{BalancePolicy, ClusterKey, ClusterSpec, ObjectRef};
use crate::world::{Key, World};

/// A [`BackendRef`] from a backendRef of whichever generated type (a rule's backendRefs and a
/// mirror filter's have types of their own with the same fields).
macro_rules! backend_ref {
    ($b:expr) => {
        BackendRef {
            group: $b.group.as_deref(),
            kind: $b.kind.as_deref(),
            name: &$b.name,
            namespace: $b.namespace.as_deref(),
            port: $b.port,
        }
    };
}

/// A compiled match with its precedence key.
#[derive(Debug)]
pub(super) struct Ranked {
    pub rank: Rank,
    /// Shared: a route placed on several listeners and hosts holds one copy, and the data
    /// plane keeps a rule's compiled backends while the snapshot hands it the same rule.
    pub rule: std::sync::Arc<GatewayRule>,
}

/// The spec's precedence, smallest first: Exact paths, then (regular expressions and)
/// prefixes by length; a method; more header matches; more query matches; the older route;
/// the route first by namespace/name; the rule and match in list order.
pub(super) type Rank = (
    u8,
    std::cmp::Reverse<usize>,
    bool,
    std::cmp::Reverse<usize>,
    std::cmp::Reverse<usize>,
    RouteAge,
    u32,
    u32,
);

/// Creation time and key of a route (older first, then alphabetical).
pub(super) type RouteAge = (Option<k8s_openapi::jiff::Timestamp>, Key);

/// Where a route's rules go: `(gateway index, listener index, effective hostname)`.
pub(super) type Placement = (usize, usize, Hostname);

/// What one route contributes (shared with the memo that may hand it to the next
/// translation).
#[derive(Debug)]
pub(super) struct RouteOutcome {
    pub status: std::sync::Arc<RouteState>,
    pub placements: Vec<Placement>,
    /// The listeners whose attached-route count it added one to, once per count.
    pub counted: Vec<(usize, usize)>,
    /// Its rules and pools.
    pub compiled: std::sync::Arc<Compiled>,
}

/// Compiles a route's rules: its matches, filters and backends (what does not depend on the
/// Gateways it attaches to).
pub(super) fn compile(
    world: &World,
    r: &HTTPRoute,
    pool: (&BalancePolicy, Option<u32>),
    kind: &'static str,
) -> Compiled {
    let key = crate::world::key_of(&r.metadata);
    let src = ObjectRef::new(kind, key.0.clone(), key.1.clone());
    let age: RouteAge = (
        r.metadata.creation_timestamp.as_ref().map(|t| t.0),
        key.clone(),
    );
    compile_rules(
        world,
        &src,
        &key.0,
        r.spec.rules.as_deref().unwrap_or_default(),
        &age,
        pool,
    )
}

/// Attaches one route, its rules compiled, to the planned Gateways (counting its attachments
/// on them).
pub(super) fn route(
    world: &World,
    plans: &mut [GatewayPlan<'_>],
    r: &HTTPRoute,
    compiled: std::sync::Arc<Compiled>,
    kind: &'static str,
) -> Option<RouteOutcome> {
    let key = crate::world::key_of(&r.metadata);
    let hostnames: Vec<Hostname> = match r.spec.hostnames.as_deref() {
        None | Some([]) => vec![Hostname::Any],
        Some(h) => h.iter().map(|h| Hostname::parse(Some(h))).collect(),
    };
    let mut parents = Vec::new();
    let mut placements = Vec::new();
    let mut counted = Vec::new();
    for p in r.spec.parent_refs.as_deref().unwrap_or_default() {
        if p.group.as_deref().unwrap_or(GROUP) != GROUP
            || p.kind.as_deref().unwrap_or("Gateway") != "Gateway"
        {
            continue;
        }
        let gw_ns = p.namespace.clone().unwrap_or_else(|| key.0.clone());
        let Some(gi) = plans
            .iter()
            .position(|g| g.key.0 == gw_ns && g.key.1 == p.name)
        else {
            continue;
        };
        let accepted = match attach(
            world,
            &mut plans[gi],
            gi,
            p,
            (kind, &key.0),
            &hostnames,
            (compiled.unsupported.as_ref(), &mut counted),
        ) {
            Ok(mut placed) => {
                placements.append(&mut placed);
                Cond::ok("Accepted")
            }
            Err(c) => c,
        };
        parents.push(ParentState {
            parent: ParentKey {
                group: Some(GROUP.to_string()),
                kind: Some("Gateway".to_string()),
                namespace: Some(gw_ns),
                name: p.name.clone(),
                section_name: p.section_name.clone(),
                port: p.port,
            },
            conditions: vec![accepted, compiled.resolved.clone()],
        });
    }
    if parents.is_empty() {
        return None;
    }
    Some(RouteOutcome {
        status: std::sync::Arc::new(RouteState {
            generation: r.metadata.generation.unwrap_or_default(),
            parents,
        }),
        placements,
        counted,
        compiled,
    })
}

/// Attaches the route to the listeners one parentRef selects; `Err` is the `Accepted=False`
/// condition saying why it attached nowhere.
fn attach(
    world: &World,
    gw: &mut GatewayPlan<'_>,
    gi: usize,
    p: &HttpRouteParentRefs,
    (kind, route_ns): (&'static str, &str),
    hostnames: &[Hostname],
    (unsupported, counted): (Option<&Cond>, &mut Vec<(usize, usize)>),
) -> Result<Vec<Placement>, Cond> {
    let candidates: Vec<usize> = gw
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| p.section_name.as_deref().is_none_or(|s| s == l.spec.name))
        .filter(|(_, l)| p.port.is_none_or(|port| port == l.spec.port))
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() {
        return Err(Cond::new(
            "Accepted",
            false,
            "NoMatchingParent",
            "no listener of the Gateway has this sectionName and port",
        ));
    }
    let gw_ns = gw.key.0.clone();
    let allowed: Vec<usize> = candidates
        .into_iter()
        .filter(|&i| {
            let l = &gw.listeners[i];
            l.attachable
                && l.kinds.iter().any(|(g, k)| g == GROUP && k == kind)
                && namespace_allowed(world, l.spec, &gw_ns, route_ns)
        })
        .collect();
    if allowed.is_empty() {
        return Err(Cond::new(
            "Accepted",
            false,
            "NotAllowedByListeners",
            "the listeners' allowedRoutes do not admit this route",
        ));
    }
    let mut placed: Vec<Placement> = Vec::new();
    for &i in &allowed {
        for h in hostnames {
            if let Some(eff) = gw.listeners[i].hostname.intersect(h)
                && !placed
                    .iter()
                    .any(|(g, li, e)| *g == gi && *li == i && *e == eff)
            {
                placed.push((gi, i, eff));
            }
        }
    }
    if placed.is_empty() {
        return Err(Cond::new(
            "Accepted",
            false,
            "NoMatchingListenerHostname",
            "no listener hostname intersects the route's hostnames",
        ));
    }
    if let Some(c) = unsupported {
        // A route sluice cannot serve in full is not accepted, and not counted.
        return Err(c.clone());
    }
    for &i in &allowed {
        if placed.iter().any(|(_, li, _)| *li == i) {
            gw.listeners[i].attached += 1;
            counted.push((gi, i));
        }
    }
    Ok(placed)
}

fn namespace_allowed(
    world: &World,
    l: &crate::gateway_api::gateways::GatewayListeners,
    gw_ns: &str,
    route_ns: &str,
) -> bool {
    use crate::gateway_api::gateways::GatewayListenersAllowedRoutesNamespacesFrom as F;
    let ns = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    match ns.and_then(|n| n.from.as_ref()).unwrap_or(&F::Same) {
        F::Same => gw_ns == route_ns,
        F::All => true,
        F::Selector => {
            let Some(sel) = ns.and_then(|n| n.selector.as_ref()) else {
                return false;
            };
            let empty = BTreeMap::new();
            let labels = world
                .namespaces
                .get(&(String::new(), route_ns.to_string()))
                .and_then(|n| n.metadata.labels.as_ref())
                .unwrap_or(&empty);
            sel.match_labels
                .iter()
                .flatten()
                .all(|(k, v)| labels.get(k) == Some(v))
                && sel.match_expressions.iter().flatten().all(|e| {
                    let vals = e.values.as_deref().unwrap_or_default();
                    let have = labels.get(&e.key);
                    match e.operator.as_str() {
                        "In" => have.is_some_and(|v| vals.contains(v)),
                        "NotIn" => have.is_none_or(|v| !vals.contains(v)),
                        "Exists" => have.is_some(),
                        "DoesNotExist" => have.is_none(),
                        _ => false,
                    }
                })
        }
    }
}

/// A route's rules compiled.
#[derive(Debug)]
pub(super) struct Compiled {
    pub rules: Vec<Ranked>,
    resolved: Cond,
    unsupported: Option<Cond>,
    pub clusters: Vec<std::sync::Arc<ClusterSpec>>,
    /// The Services (`(namespace, name)`) its backendRefs and mirrors named, found or not:
    /// what besides the route its rules depend on (with the ReferenceGrants and pool settings).
    pub deps: Vec<Key>,
}

/// The Service a backendRef of a route in `ns` names.
fn dep(r: BackendRef<'_>, ns: &str) -> Key {
    (r.namespace.unwrap_or(ns).to_string(), r.name.to_string())
}

fn compile_rules(
    world: &World,
    src: &ObjectRef,
    ns: &str,
    rules: &[HttpRouteRules],
    age: &RouteAge,
    (balance, max): (&BalancePolicy, Option<u32>),
) -> Compiled {
    let mut out = Compiled {
        rules: Vec::new(),
        resolved: Cond::ok("ResolvedRefs"),
        unsupported: None,
        clusters: Vec::new(),
        deps: Vec::new(),
    };
    for (ri, rule) in rules.iter().enumerate() {
        let filters = match filters(rule.filters.as_deref().unwrap_or_default()) {
            Ok(mut f) => {
                f.mirrors = mirrors(world, (src.kind, ns), rule, (balance, max), &mut out);
                f
            }
            Err(msg) => {
                out.unsupported.get_or_insert(Cond::new(
                    "Accepted",
                    false,
                    "UnsupportedValue",
                    format!("spec.rules[{ri}]: {msg}"),
                ));
                continue;
            }
        };
        let mut backends = Vec::new();
        for (bi, b) in rule.backend_refs.iter().flatten().enumerate() {
            let own = match backend_filters(b.filters.as_deref().unwrap_or_default()) {
                Ok(f) => f,
                Err(msg) => {
                    out.unsupported.get_or_insert(Cond::new(
                        "Accepted",
                        false,
                        "UnsupportedValue",
                        format!("spec.rules[{ri}].backendRefs[{bi}].filters: {msg}"),
                    ));
                    Filters::default()
                }
            };
            let weight = u32::try_from(b.weight.unwrap_or(1)).unwrap_or(0);
            let r = backend_ref!(b);
            out.deps.push(dep(r, ns));
            let target = match resolve_backend(world, (src.kind, ns), r, balance, max) {
                Ok(spec) => {
                    let key: ClusterKey = spec.key.clone();
                    out.clusters.push(std::sync::Arc::new(spec));
                    BackendTarget::Cluster(key)
                }
                Err(e) => {
                    if out.resolved.status {
                        out.resolved =
                            Cond::new("ResolvedRefs", false, e.reason, e.message.clone());
                    }
                    BackendTarget::Invalid(e.message)
                }
            };
            backends.push(WeightedBackend {
                target,
                weight,
                filters: own,
            });
        }
        let timeout = match timeouts(rule.timeouts.as_ref()) {
            Ok(t) => t,
            Err(msg) => {
                out.unsupported.get_or_insert(Cond::new(
                    "Accepted",
                    false,
                    "UnsupportedValue",
                    format!("spec.rules[{ri}].timeouts: {msg}"),
                ));
                continue;
            }
        };
        let default_match = [HttpRouteRulesMatches {
            headers: None,
            method: None,
            path: None,
            query_params: None,
        }];
        let matches = match rule.matches.as_deref() {
            None | Some([]) => &default_match[..],
            Some(m) => m,
        };
        for (mi, m) in matches.iter().enumerate() {
            match compile_match(m) {
                Ok((path, method, headers, query)) => {
                    let (kind, len) = match &path {
                        PathRule::Exact(p) => (0, p.len()),
                        PathRule::Regex(p) => (1, p.source().len()),
                        PathRule::Prefix(p) => (2, p.len()),
                    };
                    let rank: Rank = (
                        kind,
                        std::cmp::Reverse(len),
                        method.is_none(),
                        std::cmp::Reverse(headers.len()),
                        std::cmp::Reverse(query.len()),
                        age.clone(),
                        ri as u32,
                        mi as u32,
                    );
                    out.rules.push(Ranked {
                        rank,
                        rule: std::sync::Arc::new(GatewayRule {
                            source: src.clone(),
                            rule: ri as u32,
                            path,
                            method,
                            headers,
                            query,
                            filters: filters.clone(),
                            backends: backends.clone(),
                            timeout,
                        }),
                    });
                }
                Err(msg) => {
                    out.unsupported.get_or_insert(Cond::new(
                        "Accepted",
                        false,
                        "UnsupportedValue",
                        format!("spec.rules[{ri}].matches[{mi}]: {msg}"),
                    ));
                }
            }
        }
    }
    out
}

type MatchParts = (PathRule, Option<String>, Vec<ValueMatch>, Vec<ValueMatch>);

fn compile_match(m: &HttpRouteRulesMatches) -> Result<MatchParts, String> {
    let path = match &m.path {
        None => PathRule::Prefix(String::new()),
        Some(p) => {
            let v = p.value.as_deref().unwrap_or("/");
            match p
                .r#type
                .as_ref()
                .unwrap_or(&HttpRouteRulesMatchesPathType::PathPrefix)
            {
                HttpRouteRulesMatchesPathType::Exact => PathRule::Exact(v.to_string()),
                HttpRouteRulesMatchesPathType::PathPrefix => {
                    PathRule::Prefix(v.trim_end_matches('/').to_string())
                }
                HttpRouteRulesMatchesPathType::RegularExpression => PathRule::Regex(
                    Pattern::new(v).map_err(|e| format!("path regular expression: {e}"))?,
                ),
            }
        }
    };
    let method = m.method.as_ref().map(|x| {
        serde_json::to_value(x)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    });
    let mut headers = Vec::new();
    for h in m.headers.iter().flatten() {
        let value = match h
            .r#type
            .as_ref()
            .unwrap_or(&HttpRouteRulesMatchesHeadersType::Exact)
        {
            HttpRouteRulesMatchesHeadersType::Exact => ValueRule::Exact(h.value.clone()),
            HttpRouteRulesMatchesHeadersType::RegularExpression => ValueRule::Regex(
                Pattern::new(&h.value).map_err(|e| format!("header regular expression: {e}"))?,
            ),
        };
        headers.push(ValueMatch {
            name: h.name.to_ascii_lowercase(),
            value,
        });
    }
    let mut query = Vec::new();
    for q in m.query_params.iter().flatten() {
        let value = match q
            .r#type
            .as_ref()
            .unwrap_or(&HttpRouteRulesMatchesQueryParamsType::Exact)
        {
            HttpRouteRulesMatchesQueryParamsType::Exact => ValueRule::Exact(q.value.clone()),
            HttpRouteRulesMatchesQueryParamsType::RegularExpression => ValueRule::Regex(
                Pattern::new(&q.value).map_err(|e| format!("query regular expression: {e}"))?,
            ),
        };
        query.push(ValueMatch {
            name: q.name.clone(),
            value,
        });
    }
    Ok((path, method, headers, query))
}

/// The edits of a `RequestHeaderModifier` or `ResponseHeaderModifier`, of whichever generated
/// type (a rule's filters and a backendRef's have types of their own with the same fields).
macro_rules! header_edits {
    ($m:expr) => {
        edits(
            $m.set
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
            $m.add
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
            $m.remove.as_ref(),
        )
    };
}

fn edits(
    set: Vec<(String, String)>,
    add: Vec<(String, String)>,
    remove: Option<&Vec<String>>,
) -> HeaderEdits {
    let lower = |v: Vec<(String, String)>| {
        v.into_iter()
            .map(|(n, x)| (n.to_ascii_lowercase(), x))
            .collect()
    };
    HeaderEdits {
        set: lower(set),
        add: lower(add),
        remove: remove
            .into_iter()
            .flatten()
            .map(|n| n.to_ascii_lowercase())
            .collect(),
    }
}

fn path_modifier(full: Option<&String>, prefix: Option<&String>) -> Option<PathModifier> {
    match (full, prefix) {
        (Some(f), _) => Some(PathModifier::Full(f.clone())),
        (None, Some(p)) => Some(PathModifier::Prefix(p.clone())),
        (None, None) => None,
    }
}

fn filters(list: &[HttpRouteRulesFilters]) -> Result<Filters, String> {
    let mut out = Filters::default();
    for f in list {
        match f.r#type {
            HttpRouteRulesFiltersType::RequestHeaderModifier => {
                let m = f
                    .request_header_modifier
                    .as_ref()
                    .ok_or("RequestHeaderModifier without its settings")?;
                out.request_headers = header_edits!(m);
            }
            HttpRouteRulesFiltersType::ResponseHeaderModifier => {
                let m = f
                    .response_header_modifier
                    .as_ref()
                    .ok_or("ResponseHeaderModifier without its settings")?;
                out.response_headers = header_edits!(m);
            }
            HttpRouteRulesFiltersType::RequestRedirect => {
                let r = f
                    .request_redirect
                    .as_ref()
                    .ok_or("RequestRedirect without its settings")?;
                let status = u16::try_from(r.status_code.unwrap_or(302)).unwrap_or(302);
                out.redirect = Some(RedirectFilter {
                    scheme: r.scheme.as_ref().map(|s| {
                        serde_json::to_value(s)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    }),
                    hostname: r.hostname.clone(),
                    port: r.port.and_then(|p| u16::try_from(p).ok()),
                    path: r.path.as_ref().and_then(|p| {
                        path_modifier(
                            p.replace_full_path.as_ref(),
                            p.replace_prefix_match.as_ref(),
                        )
                    }),
                    status,
                });
            }
            HttpRouteRulesFiltersType::UrlRewrite => {
                let r = f
                    .url_rewrite
                    .as_ref()
                    .ok_or("URLRewrite without its settings")?;
                out.rewrite = Some(RewriteFilter {
                    hostname: r.hostname.clone(),
                    path: r.path.as_ref().and_then(|p| {
                        path_modifier(
                            p.replace_full_path.as_ref(),
                            p.replace_prefix_match.as_ref(),
                        )
                    }),
                });
            }
            // Resolved with the backends (`mirrors`): it names a Service.
            HttpRouteRulesFiltersType::RequestMirror => {}
            ref other => return Err(format!("filter {other:?} is not supported")),
        }
    }
    Ok(out)
}

/// A rule's `RequestMirror` filters, their backends resolved like backendRefs (one that
/// cannot be used sets `ResolvedRefs` and mirrors nothing).
fn mirrors(
    world: &World,
    (kind, ns): (&'static str, &str),
    rule: &HttpRouteRules,
    (balance, max): (&BalancePolicy, Option<u32>),
    out: &mut Compiled,
) -> Vec<crate::gateway_model::MirrorFilter> {
    let mut found = Vec::new();
    for f in rule.filters.iter().flatten() {
        let Some(m) = f.request_mirror.as_ref() else {
            continue;
        };
        let b = &m.backend_ref;
        let r = backend_ref!(b);
        out.deps.push(dep(r, ns));
        match resolve_backend(world, (kind, ns), r, balance, max) {
            Ok(spec) => {
                let (numerator, denominator) = match (&m.fraction, m.percent) {
                    (Some(fr), _) => (fr.numerator, fr.denominator.unwrap_or(100)),
                    (None, Some(p)) => (p, 100),
                    (None, None) => (1, 1),
                };
                let denominator = u32::try_from(denominator).unwrap_or(100).max(1);
                found.push(crate::gateway_model::MirrorFilter {
                    target: spec.key.clone(),
                    numerator: u32::try_from(numerator).unwrap_or(0).min(denominator),
                    denominator,
                });
                out.clusters.push(std::sync::Arc::new(spec));
            }
            Err(e) => {
                if out.resolved.status {
                    out.resolved = Cond::new("ResolvedRefs", false, e.reason, e.message);
                }
            }
        }
    }
    found
}

/// A Gateway API duration (`1h30m`, `500ms`, `0s`: one to four number–unit pairs).
pub(super) fn duration(v: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{v:?} is not a duration (such as 500ms, 10s or 1h30m)");
    let mut total = std::time::Duration::ZERO;
    let mut rest = v;
    let mut pairs = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (std::time::Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (std::time::Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (std::time::Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (std::time::Duration::from_secs(1), 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += unit * u32::try_from(n).map_err(|_| bad())?;
        pairs += 1;
    }
    if pairs == 0 || pairs > 4 {
        return Err(bad());
    }
    Ok(total)
}

/// A rule's `timeouts` as the one limit sluice enforces: the time to the response head, the
/// shorter of `request` and `backendRequest` (a zero one is no limit).
fn timeouts(
    t: Option<&crate::gateway_api::httproutes::HttpRouteRulesTimeouts>,
) -> Result<Option<std::time::Duration>, String> {
    let Some(t) = t else {
        return Ok(None);
    };
    let request = t.request.as_deref().map(duration).transpose()?;
    let backend = t.backend_request.as_deref().map(duration).transpose()?;
    let limit = |d: Option<std::time::Duration>| d.filter(|d| !d.is_zero());
    Ok(match (request, backend) {
        (None, None) => None,
        (r, b) => match (limit(r), limit(b)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (Some(a), None) | (None, Some(a)) => Some(a),
            (None, None) => Some(std::time::Duration::ZERO),
        },
    })
}

/// A backendRef's own filters: header modifiers only.
fn backend_filters(
    list: &[crate::gateway_api::httproutes::HttpRouteRulesBackendRefsFilters],
) -> Result<Filters, String> {
    use crate::gateway_api::httproutes::HttpRouteRulesBackendRefsFiltersType as T;
    let mut out = Filters::default();
    for f in list {
        match f.r#type {
            T::RequestHeaderModifier => {
                let m = f
                    .request_header_modifier
                    .as_ref()
                    .ok_or("RequestHeaderModifier without its settings")?;
                out.request_headers = header_edits!(m);
            }
            T::ResponseHeaderModifier => {
                let m = f
                    .response_header_modifier
                    .as_ref()
                    .ok_or("ResponseHeaderModifier without its settings")?;
                out.response_headers = header_edits!(m);
            }
            ref other => return Err(format!("filter {other:?} is not supported on a backendRef")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod duration_tests {
    use super::duration;
    use std::time::Duration;

    #[test]
    fn gateway_durations() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        assert_eq!(duration("1m1s1ms"), Ok(Duration::from_millis(61_001)));
        for bad in ["", "10", "1d", "s", "123456s", "1h1h1h1h1h", "-1s"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }
}
