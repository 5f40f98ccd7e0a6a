//! The report: what each annotation, ConfigMap key and field became, and the controller-wide
//! settings (`ssl-redirect`, `hsts`) the routes follow.

use std::collections::BTreeMap;

use serde::Serialize;

use super::ConvertOptions;
use crate::annotations::catalog;
use crate::model::Settings as ControllerSettings;
use crate::world::World;

/// What one annotation, key or field became.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "kebab-case")]
pub enum Outcome {
    /// An exact equivalent (how).
    Converted(String),
    /// A near equivalent, converted; the difference.
    Approximated(String),
    /// Left out: the Gateway API (and sluice's policies for HTTPRoutes) has nothing that does
    /// it (why, and what to do instead where there is something).
    NoEquivalent(String),
}

impl Outcome {
    /// The one-word name.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Converted(_) => "converted",
            Outcome::Approximated(_) => "approximated",
            Outcome::NoEquivalent(_) => "no equivalent",
        }
    }

    /// The detail.
    pub fn detail(&self) -> &str {
        match self {
            Outcome::Converted(s) | Outcome::Approximated(s) | Outcome::NoEquivalent(s) => s,
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    /// `Ingress ns/name`, `ConfigMap ns/name` or a generated object.
    pub object: String,
    /// The annotation, key or field.
    pub item: String,
    /// What it became.
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl Note {
    /// A note.
    pub fn new(object: &str, item: &str, outcome: Outcome) -> Self {
        Self {
            object: object.into(),
            item: item.into(),
            outcome,
        }
    }
}

/// The controller-wide settings the generated routes carry.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    /// `ssl-redirect` (default true): HTTP requests for hosts with TLS are redirected.
    pub ssl_redirect: bool,
    /// `hsts` (default off in sluice): the header value HTTPS answers get.
    pub hsts: Option<String>,
    /// `global-auth-url` is set: every route not opting out is printed closed.
    pub global_auth: bool,
}

/// ConfigMap keys a route carries, and how.
const ROUTE_KEYS: &[(&str, &str)] = &[
    (
        "ssl-redirect",
        "each host with TLS gets an HTTPRoute on the `http` listener that redirects (308) or serves, as the key says",
    ),
    (
        "hsts",
        "a ResponseHeaderModifier setting Strict-Transport-Security on the routes of HTTPS listeners",
    ),
    ("hsts-max-age", "in the Strict-Transport-Security value"),
    (
        "hsts-include-subdomains",
        "in the Strict-Transport-Security value",
    ),
    ("hsts-preload", "in the Strict-Transport-Security value"),
];

/// Reads `ssl-redirect` and `hsts*` from the controller ConfigMap (ingress-nginx's defaults
/// without one) and notes every key.
pub(super) fn settings(world: &World, opts: &ConvertOptions, notes: &mut Vec<Note>) -> Settings {
    let mut s = ControllerSettings::default();
    if let Some(key) = &opts.config_map {
        let object = format!("ConfigMap {}/{}", key.0, key.1);
        match world.config_maps.get(key) {
            None => notes.push(Note::new(
                &object,
                "(object)",
                Outcome::NoEquivalent("not in the input: ingress-nginx's defaults used".into()),
            )),
            Some(cm) => {
                let empty = BTreeMap::new();
                let data = cm.data.as_ref().unwrap_or(&empty);
                let applied = crate::configmap::apply(data, &mut s);
                for key in data.keys() {
                    let invalid = applied.invalid.iter().find(|(k, _)| k == key);
                    let outcome = match (invalid, ROUTE_KEYS.iter().find(|(k, _)| k == key)) {
                        (Some((_, why)), _) => Outcome::NoEquivalent(format!("invalid: {why}")),
                        (None, _) if key.starts_with("global-auth-") => Outcome::NoEquivalent(
                            "global authentication has no Gateway API equivalent sluice serves: the routes of every Ingress without enable-global-auth: \"false\" are printed closed (500), never open".into(),
                        ),
                        (None, Some((_, how))) => Outcome::Converted((*how).into()),
                        (None, None) => Outcome::NoEquivalent(
                            "controller-wide: not part of any route; sluice keeps applying it from its ConfigMap (or flags) to every listener"
                                .into(),
                        ),
                    };
                    notes.push(Note::new(&object, key, outcome));
                }
            }
        }
    }
    let hsts = s.hsts.map(|h| {
        let mut v = format!("max-age={}", h.max_age);
        if h.include_subdomains {
            v.push_str("; includeSubDomains");
        }
        if h.preload {
            v.push_str("; preload");
        }
        v
    });
    Settings {
        ssl_redirect: s.ssl_redirect,
        hsts,
        global_auth: !s.global_auth.is_empty(),
    }
}

/// Why an annotation the route code does not handle has no equivalent.
fn no_equivalent(name: &str) -> String {
    let why = match name {
        n if n.starts_with("limit-") || n == "global-rate-limit" => {
            "rate and connection limits have no Gateway API equivalent (and no sluice policy for HTTPRoutes yet)"
        }
        "whitelist-source-range" | "allowlist-source-range" | "denylist-source-range" => {
            "client-address allow and deny lists have no Gateway API equivalent"
        }
        n if n.starts_with("auth-tls-") => {
            "client certificates per route are not in the Gateway API (frontend validation is per listener and not served by sluice yet)"
        }
        n if n.starts_with("auth-") || n == "enable-global-auth" || n == "satisfy" => {
            "authentication has no Gateway API equivalent sluice serves (ExternalAuth is experimental): the route would be open"
        }
        n if n == "enable-cors" || n.starts_with("cors-") => {
            "the HTTPRoute CORS filter is experimental and sluice does not serve it yet"
        }
        n if n == "affinity" || n == "affinity-mode" || n.starts_with("session-cookie-") => {
            "cookie session affinity is not in the Gateway API sluice serves (session persistence is experimental)"
        }
        "proxy-body-size" | "client-body-buffer-size" => {
            "request body limits have no Gateway API equivalent: sluice's --max-request-body applies"
        }
        "load-balance" | "upstream-hash-by" | "upstream-max-connections" => {
            "the balancing policy is not part of the Gateway API: sluice's default (least request) applies"
        }
        n if n.starts_with("proxy-next-upstream") => {
            "HTTPRoute retries are experimental and sluice does not serve them yet: sluice's own retry of idempotent requests applies"
        }
        "custom-http-errors" | "default-backend" => {
            "error pages from another backend have no Gateway API equivalent"
        }
        n if n.ends_with("-snippet") || n == "configuration-snippet" => {
            "raw nginx configuration: no equivalent (sluice refuses it for Ingresses too)"
        }
        "ssl-passthrough" => "TLS passthrough needs a TLSRoute, which sluice does not serve yet",
        n if n.starts_with("proxy-ssl-") => {
            "TLS to the backend needs a BackendTLSPolicy, which sluice does not serve yet"
        }
        "service-upstream" => {
            "sluice routes to endpoints; the Gateway API leaves this to the implementation"
        }
        _ => "no Gateway API field or sluice policy for HTTPRoutes does this",
    };
    why.into()
}

/// Notes for every ingress-nginx or sluice annotation of an Ingress: what the route code
/// recorded in `handled` (by bare name), or why it has no equivalent.
pub(super) fn annotations(
    object: &str,
    annotations: Option<&BTreeMap<String, String>>,
    handled: &BTreeMap<&'static str, Outcome>,
    notes: &mut Vec<Note>,
) {
    for key in annotations.into_iter().flat_map(BTreeMap::keys) {
        let name = match catalog::lookup(key) {
            None => continue,
            Some(Ok(e)) => e.name,
            Some(Err(name)) => name,
        };
        let outcome = handled
            .get(name)
            .cloned()
            .unwrap_or_else(|| Outcome::NoEquivalent(no_equivalent(name)));
        notes.push(Note::new(object, key, outcome));
    }
}
