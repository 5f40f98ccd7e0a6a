//! Three ingress-nginx rules that act on the merged hosts after every Ingress was read: canary
//! Ingresses attach to the main route with the same host and path; a host where any Ingress
//! uses `use-regex` or `rewrite-target` has all its paths read as regular expressions; and
//! `from-to-www-redirect` adds the `www.`/bare twin of a host, redirecting, unless an Ingress
//! defines it.

use std::collections::BTreeMap;

use crate::annotations::backends::CanaryRules;
use crate::annotations::traffic::path_regex;
use crate::model::{HostMatch, ObjectRef, PathKind, PathMatch, Route, RouteAction, Severity};
use crate::route_policy::Canary;

use super::Problems;

/// A canary Ingress's path, waiting for its main route.
#[derive(Debug)]
pub(super) struct PendingCanary {
    pub(super) host: HostMatch,
    pub(super) path: PathMatch,
    pub(super) field: String,
    pub(super) action: RouteAction,
    pub(super) source: ObjectRef,
    pub(super) rules: CanaryRules,
}

/// Attaches each canary to its main route. As in ingress-nginx, a canary without a main route
/// is ignored, and a main route takes one canary (the oldest Ingress's; the others are
/// reported).
pub(super) fn attach(
    hosts: &mut BTreeMap<HostMatch, super::HostRoutes>,
    pending: Vec<PendingCanary>,
    p: &mut Problems,
) {
    for c in pending {
        let Some(route) = hosts.get_mut(&c.host).and_then(|r| r.get_mut(&c.path)) else {
            p.report(
                Severity::Warning,
                "CanaryWithoutMain",
                &c.source,
                c.field,
                format!(
                    "canary for host {} path {:?}: no other Ingress serves that host and path, so the canary is ignored",
                    c.host, c.path.path
                ),
            );
            continue;
        };
        if let Some(existing) = &route.canary {
            p.report(
                Severity::Warning,
                "Conflict",
                &c.source,
                c.field,
                format!(
                    "host {} path {:?} already has the canary {}; ignored here",
                    c.host, c.path.path, existing.source
                ),
            );
            continue;
        }
        route.canary = Some(Box::new(Canary {
            action: c.action,
            source: c.source,
            header: c.rules.header,
            cookie: c.rules.cookie,
            weight: c.rules.weight,
            weight_total: c.rules.weight_total,
        }));
    }
}

/// Rewrites a host's routes as regular-expression routes (ingress-nginx puts every location of
/// such a server, Exact ones too, behind `~* "^path"`). `raw` has each route's path as
/// written. A path that does not compile is reported and dropped; two paths that become the
/// same expression keep the first in path order (Exact before Prefix), the other is reported.
pub(super) fn regex_routes(
    host: &HostMatch,
    routes: super::HostRoutes,
    raw: &BTreeMap<(HostMatch, PathMatch), (String, String)>,
    p: &mut Problems,
) -> super::HostRoutes {
    let mut out = super::HostRoutes::new();
    for (key, mut route) in routes {
        let Some((written, field)) = raw.get(&(host.clone(), key)) else {
            continue;
        };
        if let Err(e) = path_regex(written) {
            p.report(
                Severity::Error,
                "InvalidPath",
                &route.source,
                format!("{field}.path"),
                format!("{e}; path ignored (host {host} uses regex paths)"),
            );
            continue;
        }
        route.path = PathMatch {
            kind: PathKind::Regex,
            path: written.clone(),
        };
        if let Some(existing) = out.get(&route.path) {
            let older = existing.source.clone();
            p.report(
                Severity::Warning,
                "Conflict",
                &route.source,
                field.clone(),
                format!(
                    "host {host} regex path {written:?} is already defined by {older}; ignored here"
                ),
            );
            continue;
        }
        out.insert(route.path.clone(), route);
    }
    out
}

/// The `www.` twin of a host (`www.a.test` ⇄ `a.test`).
pub(super) fn www_twin(host: &str) -> String {
    match host.strip_prefix("www.") {
        Some(bare) => bare.to_string(),
        None => format!("www.{host}"),
    }
}

/// Adds a redirecting virtual host for each `(twin, target, source)` that no Ingress defines
/// (ingress-nginx omits the redirect when one does).
pub(super) fn www_redirects(
    hosts: &mut BTreeMap<HostMatch, super::HostRoutes>,
    twins: Vec<(String, String, ObjectRef, crate::model::RouteOptions)>,
) {
    for (twin, target, source, options) in twins {
        let host = HostMatch::Exact(twin);
        if hosts.contains_key(&host) {
            continue;
        }
        let path = PathMatch {
            kind: PathKind::Prefix,
            path: String::new(),
        };
        let mut options = options;
        options.edits.host_redirect = Some(target);
        let route = Route {
            path: path.clone(),
            action: RouteAction::Unavailable("from-to-www-redirect".into()),
            source,
            options,
            canary: None,
            fallback: None,
        };
        hosts.insert(host, BTreeMap::from([(path, Box::new(route))]));
    }
}

/// `server-alias`: each alias serves a copy of its host's routes, unless an Ingress defines
/// the alias as a host (ingress-nginx ignores such an alias). The first alias of a name wins.
pub(super) fn aliases(
    hosts: &mut BTreeMap<HostMatch, super::HostRoutes>,
    alias_of: Vec<(String, String)>,
) {
    let defined: std::collections::BTreeSet<HostMatch> = hosts.keys().cloned().collect();
    for (alias, target) in alias_of {
        let alias = HostMatch::Exact(alias);
        if defined.contains(&alias) || hosts.contains_key(&alias) {
            continue;
        }
        if let Some(routes) = hosts.get(&HostMatch::Exact(target)).cloned() {
            hosts.insert(alias, routes);
        }
    }
}
