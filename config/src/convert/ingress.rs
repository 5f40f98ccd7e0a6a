//! What an Ingress's annotations ask of all its routes, read once per Ingress, with what each
//! annotation became.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::notes::{Outcome, Settings};
use crate::annotations::{self, both, catalog, traffic};

/// The route-wide options of one Ingress.
#[derive(Debug, Clone, Default)]
pub(super) struct IngressOptions {
    /// `rewrite-target`.
    pub rewrite: Option<String>,
    /// `permanent-redirect` / `temporal-redirect` as a `RequestRedirect`.
    pub redirect: Option<Value>,
    /// `app-root`.
    pub app_root: Option<String>,
    /// `upstream-vhost`.
    pub vhost: Option<String>,
    /// `x-forwarded-prefix`.
    pub forwarded_prefix: Option<String>,
    /// `server-alias`.
    pub aliases: Vec<String>,
    /// `proxy-read-timeout` as a Gateway API duration.
    pub timeout: Option<String>,
    /// `ssl-redirect`, when set.
    pub ssl_redirect: Option<bool>,
    /// `force-ssl-redirect`.
    pub force_ssl_redirect: bool,
    /// Access control with no equivalent: the routes are printed closed.
    pub closed: bool,
}

/// Whether an annotation decides who may reach the backend (converted routes that lose it
/// are printed closed).
fn access_control(name: &str) -> bool {
    name.starts_with("auth-") || name.ends_with("-source-range") || name == "satisfy"
}

/// Reads an annotation value: `None` when absent or invalid (an invalid one is noted; sluice
/// ignores it too).
fn read<T>(
    v: Result<Option<T>, annotations::AnnotationError>,
    handled: &mut BTreeMap<&'static str, Outcome>,
    name: &'static str,
) -> Option<T> {
    match v {
        Ok(v) => v,
        Err(e) => {
            handled.insert(
                name,
                Outcome::NoEquivalent(format!(
                    "invalid ({}): ignored, as sluice ignores it",
                    e.message
                )),
            );
            None
        }
    }
}

/// A redirect annotation's `RequestRedirect`, or why there is none.
fn redirect_filter(r: &crate::route_policy::Redirect) -> Result<Value, String> {
    if !matches!(r.code, 301 | 302 | 303 | 307 | 308) {
        return Err(format!(
            "status {} is not one a Gateway API redirect has (301, 302, 303, 307, 308)",
            r.code
        ));
    }
    let url = &r.location;
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url:?} is not an absolute URL"))?;
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if path.contains(['?', '#']) {
        return Err(format!(
            "{url:?} has a query or fragment: a Gateway API redirect keeps the request's own query"
        ));
    }
    if authority.contains('@') || authority.is_empty() {
        return Err(format!("{url:?} has no plain host"));
    }
    let (host, port) = match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') => {
            let p = authority[i + 1..]
                .parse::<u16>()
                .map_err(|_| format!("{url:?} has no valid port"))?;
            (&authority[..i], Some(p))
        }
        _ => (authority, None),
    };
    let mut v =
        json!({"statusCode": r.code, "scheme": scheme.to_ascii_lowercase(), "hostname": host});
    if let Some(p) = port {
        v["port"] = json!(p);
    }
    v["path"] = json!({"type": "ReplaceFullPath", "replaceFullPath": if path.is_empty() { "/" } else { path }});
    Ok(v)
}

/// Reads the route-wide annotations of an Ingress; `handled` says what each became (the others
/// are reported as without equivalent by [`super::notes::annotations`]).
pub(super) fn read_options(
    a: &BTreeMap<String, String>,
    settings: &Settings,
) -> (IngressOptions, BTreeMap<&'static str, Outcome>) {
    let mut handled: BTreeMap<&'static str, Outcome> = BTreeMap::new();
    let rewrite = read(traffic::rewrite_target(a), &mut handled, "rewrite-target");
    let redirect = read(traffic::redirect(a), &mut handled, "permanent-redirect");
    let redirect = match redirect.as_ref().map(redirect_filter) {
        None => None,
        Some(Ok(v)) => {
            let how = Outcome::Approximated(
                "a RequestRedirect on every rule; a Gateway API redirect keeps the request's query string, where ingress-nginx sends the URL as written".into(),
            );
            for n in [
                "permanent-redirect",
                "temporal-redirect",
                "permanent-redirect-code",
                "temporal-redirect-code",
            ] {
                handled.insert(n, how.clone());
            }
            Some(v)
        }
        Some(Err(why)) => {
            for n in [
                "permanent-redirect",
                "temporal-redirect",
                "permanent-redirect-code",
                "temporal-redirect-code",
            ] {
                handled.insert(n, Outcome::NoEquivalent(why.clone()));
            }
            None
        }
    };
    let app_root = read(traffic::app_root(a), &mut handled, "app-root");
    if let Some(r) = &app_root {
        handled.insert(
            "app-root",
            Outcome::Converted(format!("a rule for exactly / redirecting (302) to {r}")),
        );
    }
    let vhost = read(traffic::upstream_vhost(a), &mut handled, "upstream-vhost");
    if vhost.is_some() {
        handled.insert(
            "upstream-vhost",
            Outcome::Converted("URLRewrite hostname".into()),
        );
    }
    let forwarded_prefix = read(
        traffic::forwarded_prefix(a),
        &mut handled,
        "x-forwarded-prefix",
    );
    if forwarded_prefix.is_some() {
        handled.insert(
            "x-forwarded-prefix",
            Outcome::Converted("RequestHeaderModifier set X-Forwarded-Prefix".into()),
        );
    }
    let aliases = read(
        traffic::server_aliases(a).map(Some),
        &mut handled,
        "server-alias",
    )
    .unwrap_or_default();
    if !aliases.is_empty() {
        handled.insert(
            "server-alias",
            Outcome::Converted("more hostnames on the host's route".into()),
        );
    }
    let timeout = read(traffic::read_timeout(a), &mut handled, "proxy-read-timeout")
        .map(|d| format!("{}s", d.as_secs()));
    if let Some(t) = &timeout {
        handled.insert(
            "proxy-read-timeout",
            Outcome::Converted(format!(
                "timeouts.backendRequest {t}: in sluice both bound the wait for the response head (504 after it); other Gateway API implementations may bound the whole exchange"
            )),
        );
    }
    for n in ["proxy-send-timeout", "proxy-connect-timeout"] {
        if a.contains_key(&format!("nginx.ingress.kubernetes.io/{n}"))
            || a.contains_key(&format!("sluice.dev/{n}"))
        {
            handled.insert(
                n,
                Outcome::Converted(
                    "nothing to write: sluice applies its own global deadline here, to Ingresses and HTTPRoutes alike (the Gateway API has no such field)".into(),
                ),
            );
        }
    }
    let ssl_redirect = read(annotations::ssl_redirect(a), &mut handled, "ssl-redirect");
    if ssl_redirect.is_some() {
        handled.insert(
            "ssl-redirect",
            Outcome::Converted(
                "the host's route on the http listener redirects (308) or serves".into(),
            ),
        );
    }
    let force_ssl_redirect = read(
        traffic::flag(a, &both!("force-ssl-redirect")),
        &mut handled,
        "force-ssl-redirect",
    ) == Some(true);
    if force_ssl_redirect {
        handled.insert(
            "force-ssl-redirect",
            Outcome::Converted("the route on the http listener redirects (308) to https".into()),
        );
    }
    if traffic::flag(a, &both!("use-regex")) == Ok(Some(true)) {
        handled.insert("use-regex", Outcome::Converted("the host's paths became RegularExpression matches (case-insensitive, anchored at the start as nginx's)".into()));
    }
    match a
        .get("nginx.ingress.kubernetes.io/backend-protocol")
        .or(a.get("sluice.dev/backend-protocol"))
        .map(|v| v.to_ascii_uppercase())
    {
        None => {}
        Some(p) if p == "HTTP" => {
            handled.insert(
                "backend-protocol",
                Outcome::Converted("HTTP is the default".into()),
            );
        }
        Some(p) if p == "GRPC" || p == "H2C" => {
            handled.insert("backend-protocol", Outcome::NoEquivalent("the Gateway API reads the backend protocol from the Service: set appProtocol: kubernetes.io/h2c on its port".into()));
        }
        Some(_) => {
            handled.insert(
                "backend-protocol",
                Outcome::NoEquivalent(
                    "TLS to the backend needs a BackendTLSPolicy, which sluice does not serve yet"
                        .into(),
                ),
            );
        }
    }

    // Access control with no equivalent closes the routes: converting never opens them.
    let access: Vec<&'static str> = a
        .keys()
        .filter_map(|k| match catalog::lookup(k) {
            Some(Ok(e)) if access_control(e.name) => Some(e.name),
            _ => None,
        })
        .collect();
    let global_auth =
        settings.global_auth && traffic::flag(a, &both!("enable-global-auth")) != Ok(Some(false));
    let closed = !access.is_empty() || global_auth;
    for n in access {
        handled.insert(n, Outcome::NoEquivalent(format!(
            "access control ({n}) has no Gateway API equivalent sluice serves: the routes are printed closed (rules without backendRefs answer 500), never open; protect them another way, then add the backendRefs"
        )));
    }

    let options = IngressOptions {
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
    };
    (options, handled)
}
