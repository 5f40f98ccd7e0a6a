//! Ingresses → the plan of HTTPRoutes (one per Ingress and host, canaries folded in), then the
//! HTTPRoute objects.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressServiceBackend};
use serde_json::{Value, json};

use super::ingress::{self, IngressOptions};
use super::notes::{self, Note, Outcome, Settings};
use super::paths::{self, PathConv};
use crate::annotations::backends::{CanaryRules, canary};
use crate::annotations::{both, traffic};
use crate::world::World;

/// A Service port a rule sends to (the route's namespace).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Backend {
    pub(super) name: String,
    pub(super) port: u16,
}

impl Backend {
    pub(super) fn json(&self, weight: Option<u32>) -> Value {
        let mut v = json!({"name": self.name, "port": self.port});
        if let Some(w) = weight {
            v["weight"] = json!(w);
        }
        v
    }
}

/// One Ingress path.
#[derive(Debug, Clone)]
pub(super) struct RuleConv {
    /// The path and pathType as written (canaries find their rule by them).
    pub(super) written: (String, String),
    pub(super) path: PathConv,
    pub(super) backend: Backend,
    pub(super) canary: Option<(Backend, CanaryRules)>,
}

/// One HTTPRoute to be (two for a host with TLS: its HTTPS listener's and `http`'s).
#[derive(Debug, Clone)]
pub(super) struct HostRoute {
    pub(super) namespace: String,
    /// The base name of the route(s).
    pub(super) name: String,
    /// `Ingress ns/name`.
    pub(super) from: String,
    /// The host (`None`: every host).
    pub(super) host: Option<String>,
    pub(super) aliases: Vec<String>,
    pub(super) rules: Vec<RuleConv>,
    pub(super) app_root: Option<String>,
    pub(super) redirect: Option<Value>,
    pub(super) vhost: Option<String>,
    pub(super) forwarded_prefix: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) ssl_redirect: Option<bool>,
    pub(super) force_ssl_redirect: bool,
    /// The default backend's route: every host, every listener.
    pub(super) catch_all: bool,
    /// Access control the Gateway API cannot express: the rules are printed without backends
    /// (they answer 500) rather than open.
    pub(super) closed: bool,
}

/// A TLS host and the Secret its listener serves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct TlsHost {
    /// The host (wildcards as written).
    pub host: String,
    /// The Secret's namespace and name.
    pub secret: (String, String),
}

/// Everything the objects are made from.
#[derive(Debug, Default)]
pub(super) struct Plan {
    pub(super) routes: Vec<HostRoute>,
    /// TLS hosts, one Secret each (the oldest Ingress's).
    pub tls: Vec<TlsHost>,
}

fn ann(ing: &Ingress) -> BTreeMap<String, String> {
    ing.metadata.annotations.clone().unwrap_or_default()
}

fn object(ing: &Ingress) -> String {
    let (ns, name) = crate::world::key_of(&ing.metadata);
    format!("Ingress {ns}/{name}")
}

/// A name part from a host: lower case, `*` spelled out.
pub(super) fn host_part(host: &str) -> String {
    host.to_ascii_lowercase().replace('*', "wildcard")
}

/// The Service port of a backend, by number or by the Service's port name.
fn backend(world: &World, namespace: &str, svc: &IngressServiceBackend) -> Result<Backend, String> {
    let port = svc.port.as_ref();
    if let Some(n) = port.and_then(|p| p.number) {
        return u16::try_from(n)
            .map(|port| Backend {
                name: svc.name.clone(),
                port,
            })
            .map_err(|_| format!("port {n} is not a port number"));
    }
    let Some(name) = port.and_then(|p| p.name.as_deref()) else {
        return Err("the backend names no port".into());
    };
    let found = world
        .services
        .get(&(namespace.to_string(), svc.name.clone()))
        .and_then(|s| {
            s.spec
                .as_ref()?
                .ports
                .as_ref()?
                .iter()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.port)
        });
    match found.and_then(|p| u16::try_from(p).ok()) {
        Some(port) => Ok(Backend {
            name: svc.name.clone(),
            port,
        }),
        None => Err(format!(
            "port {name:?} of Service {namespace}/{} is not in the input: an HTTPRoute names the port by number (give the Service too)",
            svc.name
        )),
    }
}

fn is_canary(ing: &Ingress) -> bool {
    traffic::flag(&ann(ing), &both!("canary")) == Ok(Some(true))
}

/// Ingresses oldest first (sluice and ingress-nginx let the oldest win a conflict), then by
/// namespace and name.
fn by_age(world: &World) -> Vec<&Arc<Ingress>> {
    let mut v: Vec<&Arc<Ingress>> = world.ingresses.values().collect();
    v.sort_by(|a, b| {
        let at = |i: &Ingress| i.metadata.creation_timestamp.as_ref().map(|t| t.0);
        at(a)
            .cmp(&at(b))
            .then_with(|| crate::world::key_of(&a.metadata).cmp(&crate::world::key_of(&b.metadata)))
    });
    v
}

/// Whether an Ingress makes its hosts' paths regular expressions.
fn regex_ingress(a: &BTreeMap<String, String>) -> bool {
    traffic::flag(a, &both!("use-regex")) == Ok(Some(true))
        || matches!(traffic::rewrite_target(a), Ok(Some(_)))
}

/// The worst of two outcomes (no equivalent > approximated > converted).
fn worse(a: Option<Outcome>, b: Outcome) -> Outcome {
    let rank = |o: &Outcome| match o {
        Outcome::Converted(_) => 0,
        Outcome::Approximated(_) => 1,
        Outcome::NoEquivalent(_) => 2,
    };
    match a {
        Some(a) if rank(&a) >= rank(&b) => a,
        _ => b,
    }
}

/// Plans the routes of the main (not canary) Ingresses, then folds the canaries in.
pub(super) fn plan(world: &World, settings: &Settings, notes: &mut Vec<Note>) -> Plan {
    let ingresses = by_age(world);
    let regex_hosts: BTreeSet<(String, Option<String>)> = ingresses
        .iter()
        .filter(|i| !is_canary(i) && regex_ingress(&ann(i)))
        .flat_map(|i| {
            let ns = i.metadata.namespace.clone().unwrap_or_default();
            i.spec
                .iter()
                .flat_map(|s| s.rules.iter().flatten())
                .map(move |r| (ns.clone(), r.host.clone().filter(|h| !h.is_empty())))
        })
        .collect();
    let mut plan = Plan::default();
    let mut tls_seen: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut default_taken = false;
    let mut canaries = Vec::new();
    for ing in ingresses {
        if is_canary(ing) {
            canaries.push(ing);
            continue;
        }
        let from = object(ing);
        let (ns, name) = crate::world::key_of(&ing.metadata);
        let a = ann(ing);
        let (options, mut handled) = ingress::read_options(&a, settings);
        let IngressOptions {
            rewrite,
            redirect,
            app_root,
            vhost,
            forwarded_prefix,
            aliases,
            timeout,
            ssl_redirect,
            force_ssl_redirect,
            closed,
        } = options;
        // TLS hosts (a TLS entry without hosts covers the Ingress's own hosts).
        let spec = ing.spec.clone().unwrap_or_default();
        let own_hosts: Vec<String> = spec
            .rules
            .iter()
            .flatten()
            .filter_map(|r| r.host.clone())
            .filter(|h| !h.is_empty())
            .collect();
        for t in spec.tls.iter().flatten() {
            let Some(secret) = t.secret_name.clone().filter(|s| !s.is_empty()) else {
                notes.push(Note::new(&from, "spec.tls", Outcome::NoEquivalent("an entry without secretName uses sluice's default certificate: the Gateway's listeners name their certificates".into())));
                continue;
            };
            let hosts = t
                .hosts
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| own_hosts.clone());
            for h in hosts {
                match tls_seen.get(&h) {
                    Some(s) if *s == (ns.clone(), secret.clone()) => {}
                    Some(s) => notes.push(Note::new(&from, "spec.tls", Outcome::Approximated(format!("host {h} already has Secret {}/{} from an older Ingress; {ns}/{secret} is not used", s.0, s.1)))),
                    None => {
                        tls_seen.insert(h.clone(), (ns.clone(), secret.clone()));
                        plan.tls.push(TlsHost { host: h, secret: (ns.clone(), secret.clone()) });
                    }
                }
            }
        }

        if let Some(db) = &spec.default_backend {
            match db.service.as_ref().map(|s| backend(world, &ns, s)) {
                _ if default_taken => notes.push(Note::new(&from, "spec.defaultBackend", Outcome::NoEquivalent("an older Ingress's defaultBackend serves; this one is not used (as in sluice)".into()))),
                Some(Ok(b)) => {
                    default_taken = true;
                    plan.routes.push(HostRoute {
                        namespace: ns.clone(),
                        name: format!("{name}-default-backend"),
                        from: from.clone(),
                        host: None,
                        aliases: Vec::new(),
                        rules: vec![RuleConv { written: ("/".into(), "Prefix".into()), path: PathConv { path: json!({"type": "PathPrefix", "value": "/"}), rewrite: None }, backend: b, canary: None }],
                        app_root: None,
                        redirect: None,
                        vhost: None,
                        forwarded_prefix: None,
                        timeout: None,
                        ssl_redirect: Some(false),
                        force_ssl_redirect: false,
                        catch_all: true,
                        closed: false,
                    });
                    notes.push(Note::new(&from, "spec.defaultBackend", Outcome::Converted("an HTTPRoute without hostnames on every listener, PathPrefix /".into())));
                }
                Some(Err(why)) => notes.push(Note::new(&from, "spec.defaultBackend", Outcome::NoEquivalent(why))),
                None => notes.push(Note::new(&from, "spec.defaultBackend", Outcome::NoEquivalent("a resource backend has no Gateway API equivalent".into()))),
            }
        }

        // One route per host, in the order the hosts first appear.
        let mut by_host: Vec<(Option<String>, Vec<RuleConv>)> = Vec::new();
        for (i, rule) in spec.rules.iter().flatten().enumerate() {
            let host = rule.host.clone().filter(|h| !h.is_empty());
            let regex = regex_hosts.contains(&(ns.clone(), host.clone()));
            for (j, p) in rule.http.iter().flat_map(|h| &h.paths).enumerate() {
                let field = format!("spec.rules[{i}].http.paths[{j}]");
                let written = (
                    p.path.clone().unwrap_or_else(|| "/".into()),
                    p.path_type.clone(),
                );
                let b = match p.backend.service.as_ref().map(|s| backend(world, &ns, s)) {
                    Some(Ok(b)) => b,
                    Some(Err(why)) => {
                        notes.push(Note::new(
                            &from,
                            &field,
                            Outcome::NoEquivalent(format!("{why}; the path is left out")),
                        ));
                        continue;
                    }
                    None => {
                        notes.push(Note::new(&from, &field, Outcome::NoEquivalent("a resource backend has no Gateway API equivalent; the path is left out".into())));
                        continue;
                    }
                };
                let (path, outcome) =
                    paths::convert(&written.0, &written.1, regex, rewrite.as_deref());
                if let Some(o) = outcome {
                    let prev = handled.remove("rewrite-target");
                    handled.insert("rewrite-target", worse(prev, o));
                }
                let conv = RuleConv {
                    written,
                    path,
                    backend: b,
                    canary: None,
                };
                match by_host.iter_mut().find(|(h, _)| *h == host) {
                    Some((_, rules)) => rules.push(conv),
                    None => by_host.push((host.clone(), vec![conv])),
                }
            }
        }
        let several = by_host.len() > 1;
        let mut names = Vec::new();
        for (host, _) in &by_host {
            if let Some(h) = host.as_deref().filter(|h| h.starts_with("*.")) {
                notes.push(Note::new(&from, &format!("host {h}"), Outcome::Approximated(format!(
                    "a Gateway API wildcard hostname also matches names more than one label deep (x.y{}), an Ingress wildcard one label only",
                    &h[1..]
                ))));
            }
        }
        for (host, rules) in by_host {
            let route_name = if several {
                format!(
                    "{name}-{}",
                    host.as_deref()
                        .map_or_else(|| "any-host".to_string(), host_part)
                )
            } else {
                name.clone()
            };
            plan.routes.push(HostRoute {
                namespace: ns.clone(),
                name: route_name.clone(),
                from: from.clone(),
                host,
                aliases: aliases.clone(),
                rules,
                app_root: app_root.clone(),
                redirect: redirect.clone(),
                vhost: vhost.clone(),
                forwarded_prefix: forwarded_prefix.clone(),
                timeout: timeout.clone(),
                ssl_redirect,
                force_ssl_redirect,
                catch_all: false,
                closed,
            });
            names.push(format!("HTTPRoute {ns}/{route_name}"));
        }
        if !names.is_empty() {
            notes.push(Note::new(
                &from,
                "spec.rules",
                Outcome::Converted(format!(
                    "{} (a host with TLS also gets its -http route)",
                    names.join(", ")
                )),
            ));
        }
        notes::annotations(&from, ing.metadata.annotations.as_ref(), &handled, notes);
    }
    for ing in canaries {
        fold_canary(world, ing, &mut plan, notes);
    }
    plan
}

/// Folds a canary Ingress into the rules of the main routes with the same host and path.
fn fold_canary(world: &World, ing: &Ingress, plan: &mut Plan, notes: &mut Vec<Note>) {
    let from = object(ing);
    let (ns, _) = crate::world::key_of(&ing.metadata);
    let a = ann(ing);
    let mut handled: BTreeMap<&'static str, Outcome> = BTreeMap::new();
    let rules = match canary(&a) {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            handled.insert(
                "canary",
                Outcome::NoEquivalent(format!(
                    "invalid canary annotations ({}): sluice gives it no traffic either",
                    e.message
                )),
            );
            notes::annotations(&from, ing.metadata.annotations.as_ref(), &handled, notes);
            return;
        }
    };
    let mut folded = Vec::new();
    let mut missed = Vec::new();
    for rule in ing.spec.iter().flat_map(|s| s.rules.iter().flatten()) {
        let host = rule.host.clone().filter(|h| !h.is_empty());
        for p in rule.http.iter().flat_map(|h| &h.paths) {
            let written = (
                p.path.clone().unwrap_or_else(|| "/".into()),
                p.path_type.clone(),
            );
            let Some(b) = p
                .backend
                .service
                .as_ref()
                .and_then(|s| backend(world, &ns, s).ok())
            else {
                missed.push(format!("{} {}", host.as_deref().unwrap_or("*"), written.0));
                continue;
            };
            let target = plan
                .routes
                .iter_mut()
                .filter(|r| r.namespace == ns && r.host == host && !r.catch_all)
                .flat_map(|r| {
                    let name = r.name.clone();
                    r.rules.iter_mut().map(move |x| (name.clone(), x))
                })
                .find(|(_, x)| x.written == written && x.canary.is_none());
            match target {
                Some((route, x)) => {
                    x.canary = Some((b, rules.clone()));
                    folded.push(format!("HTTPRoute {ns}/{route}"));
                }
                None => missed.push(format!("{} {}", host.as_deref().unwrap_or("*"), written.0)),
            }
        }
    }
    folded.dedup();
    let into = if folded.is_empty() {
        Outcome::NoEquivalent(format!(
            "no Ingress of namespace {ns} has this canary's hosts and paths ({}): nothing to fold it into",
            missed.join(", ")
        ))
    } else if missed.is_empty() {
        Outcome::Converted(format!(
            "folded into {} as backend weights and header matches",
            folded.join(", ")
        ))
    } else {
        Outcome::Approximated(format!(
            "folded into {}; {} match no main Ingress and are left out",
            folded.join(", "),
            missed.join(", ")
        ))
    };
    for n in [
        "canary",
        "canary-weight",
        "canary-weight-total",
        "canary-by-header",
        "canary-by-header-value",
        "canary-by-header-pattern",
    ] {
        handled.insert(n, into.clone());
    }
    if rules.cookie.is_some() {
        handled.insert("canary-by-cookie", Outcome::Approximated("a RegularExpression match on the Cookie header (one Cookie header; several are not joined first)".into()));
    }
    notes::annotations(&from, ing.metadata.annotations.as_ref(), &handled, notes);
}
