//! Two ingress-nginx rules that act on a host's merged routes after every Ingress was read:
//! canary Ingresses attach to the main route with the same host and path, and a host where any
//! Ingress uses `use-regex` or `rewrite-target` has all its paths read as regular expressions.

use std::collections::BTreeMap;

use crate::annotations::backends::CanaryRules;
use crate::annotations::traffic::path_regex;
use crate::behaviour::Canary;
use crate::model::{HostMatch, ObjectRef, PathKind, PathMatch, Route, RouteAction, Severity};

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
    hosts: &mut BTreeMap<HostMatch, BTreeMap<PathMatch, Route>>,
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
    routes: BTreeMap<PathMatch, Route>,
    raw: &BTreeMap<(HostMatch, PathMatch), (String, String)>,
    p: &mut Problems,
) -> BTreeMap<PathMatch, Route> {
    let mut out: BTreeMap<PathMatch, Route> = BTreeMap::new();
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
