//! The compiled route index: host → virtual host → path, answered with hash lookups only.
//!
//! Lookup order for a normalized request host: the exact host's routes, then the one-label
//! wildcard covering it, then the host-less routes, then the default backend. A request that
//! matches no path in a more specific virtual host falls through to the less specific ones (so a
//! host-less `/` rule still serves a host that only defined `/api`). Within a virtual host the
//! longest path wins and `Exact` beats `Prefix` on a tie.
//!
//! Cost per lookup: one hash lookup per host level plus, for prefix rules, one per `/` in the
//! request path up to the longest configured prefix — a client's long path cannot make it
//! quadratic (each probe hashes at most that many bytes, and only that many bytes are probed).
//! No allocation and no scan over all hosts or all routes.

use std::collections::HashMap;

/// Host and path maps. foldhash instead of SipHash: these are looked up on every request
/// (the host once, the path at each element boundary), the keys come from configuration and
/// the seed is random per process, so SipHash's flood resistance buys nothing here.
type Map = HashMap<Box<str>, u32, foldhash::fast::RandomState>;

use crate::model::{HostMatch, PathKind, VirtualHost};

/// What a lookup found: a route of a virtual host, or the default backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteRef {
    /// `virtual_hosts[vhost].routes[route]` of the snapshot.
    Rule {
        /// Index of the virtual host.
        vhost: u32,
        /// Index of the route within it.
        route: u32,
    },
    /// The `defaultBackend`.
    Default,
}

/// The path rules of one virtual host, indexed.
#[derive(Debug, Default, Clone)]
struct PathTable {
    exact: Map,
    prefix: Map,
    /// A host in regex mode (ingress-nginx's `use-regex`/`rewrite-target`): every route is a
    /// case-insensitive expression anchored at the start, tried in ingress-nginx's order (path
    /// text descending), the first match wins. The `regex` crate matches in time linear in the
    /// request path, so a client cannot make this slow.
    regex: Vec<(regex::Regex, u32)>,
    /// Longest exact path, in bytes: a longer request path cannot match one.
    max_exact: usize,
    /// Longest prefix, in bytes: no boundary past it can match.
    max_prefix: usize,
}

impl PathTable {
    fn lookup(&self, path: &str) -> Option<u32> {
        if !self.regex.is_empty() {
            return self
                .regex
                .iter()
                .find(|(re, _)| re.is_match(path))
                .map(|&(_, r)| r);
        }
        if path.len() <= self.max_exact
            && let Some(&r) = self.exact.get(path)
        {
            // An exact hit has the full request length: nothing can be longer, and Exact wins ties.
            return Some(r);
        }
        if self.prefix.is_empty() {
            return None;
        }
        if path.len() <= self.max_prefix
            && let Some(&r) = self.prefix.get(path)
        {
            return Some(r);
        }
        // Try every element boundary up to the longest prefix, longest first. `/` is stored as
        // "", found at index 0.
        let bytes = path.as_bytes();
        let mut i = bytes.len().min(self.max_prefix + 1);
        while i > 0 {
            i -= 1;
            if bytes[i] == b'/'
                && let Some(&r) = self.prefix.get(&path[..i])
            {
                return Some(r);
            }
        }
        None
    }
}

/// Host and path index over a list of virtual hosts.
#[derive(Debug, Default, Clone)]
pub struct RouteIndex {
    exact: Map,
    wildcard: Map,
    any: Option<u32>,
    tables: Vec<PathTable>,
    has_default: bool,
}

impl RouteIndex {
    /// Builds the index. `vhosts` must hold at most one entry per [`HostMatch`] and at most one
    /// route per path match (translation guarantees both; later duplicates are ignored).
    pub fn build(vhosts: &[VirtualHost], has_default: bool) -> Self {
        let mut index = RouteIndex {
            has_default,
            ..Default::default()
        };
        for (vi, vh) in vhosts.iter().enumerate() {
            let vi = vi as u32;
            let mut table = PathTable::default();
            let mut regex: Vec<(&str, regex::Regex, u32)> = Vec::new();
            for (ri, route) in vh.routes.iter().enumerate() {
                let len = route.path.path.len();
                let map = match route.path.kind {
                    PathKind::Regex => {
                        // Translation only keeps expressions that compile.
                        if let Ok(re) = crate::path::path_regex(&route.path.path) {
                            regex.push((&route.path.path, re, ri as u32));
                        }
                        continue;
                    }
                    PathKind::Exact => {
                        table.max_exact = table.max_exact.max(len);
                        &mut table.exact
                    }
                    PathKind::Prefix => {
                        table.max_prefix = table.max_prefix.max(len);
                        &mut table.prefix
                    }
                };
                map.entry(route.path.path.clone().into_boxed_str())
                    .or_insert(ri as u32);
            }
            regex.sort_by(|a, b| b.0.cmp(a.0));
            table.regex = regex.into_iter().map(|(_, re, ri)| (re, ri)).collect();
            index.tables.push(table);
            match &vh.host {
                HostMatch::Exact(h) => {
                    index.exact.entry(h.clone().into_boxed_str()).or_insert(vi);
                }
                HostMatch::Wildcard(s) => {
                    index
                        .wildcard
                        .entry(s.clone().into_boxed_str())
                        .or_insert(vi);
                }
                HostMatch::Any => {
                    index.any.get_or_insert(vi);
                }
            }
        }
        index
    }

    fn in_vhost(&self, vhost: u32, path: &str) -> Option<RouteRef> {
        let table = self.tables.get(vhost as usize)?;
        table
            .lookup(path)
            .map(|route| RouteRef::Rule { vhost, route })
    }

    /// Finds the route for `path` within one virtual host only, with no fall-through to less
    /// specific hosts or the default backend: a route that names another route by the request's
    /// host (`auth-url: http://$host/…`) must find it where the request itself was matched,
    /// never in another host's rules.
    pub fn lookup_in(&self, vhost: u32, path: &str) -> Option<RouteRef> {
        self.in_vhost(vhost, path)
    }

    /// Finds the route for `path` on a host an annotation names (`auth-url:
    /// https://auth.example.com/…`): that host's own rules, exact then wildcard, and nothing
    /// else — no host-less rule and no default backend, which anyone may define, can answer
    /// for a named host.
    pub fn lookup_named(&self, host: &str, path: &str) -> Option<RouteRef> {
        if let Some(&v) = self.exact.get(host)
            && let Some(r) = self.in_vhost(v, path)
        {
            return Some(r);
        }
        let dot = host.find('.').filter(|d| *d > 0)?;
        let v = *self.wildcard.get(&host[dot..])?;
        self.in_vhost(v, path)
    }

    /// Finds the route for a normalized host (see [`crate::host::normalize_request_host`];
    /// `None` when the request has no usable host) and a path without its query string.
    pub fn lookup(&self, host: Option<&str>, path: &str) -> Option<RouteRef> {
        if let Some(host) = host {
            if let Some(&v) = self.exact.get(host)
                && let Some(r) = self.in_vhost(v, path)
            {
                return Some(r);
            }
            if !self.wildcard.is_empty()
                && let Some(dot) = host.find('.')
                && dot > 0
                && let Some(&v) = self.wildcard.get(&host[dot..])
                && let Some(r) = self.in_vhost(v, path)
            {
                return Some(r);
            }
        }
        if let Some(v) = self.any
            && let Some(r) = self.in_vhost(v, path)
        {
            return Some(r);
        }
        self.has_default.then_some(RouteRef::Default)
    }
}
