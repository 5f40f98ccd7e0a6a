//! The authentication of an Ingress, resolved against the world: `auth-type: basic` finds its
//! Secret and reads the users; `auth-url` becomes a pool for the Service it names. Whatever
//! cannot be resolved keeps the Ingress's routes closed (503) and says why, as an Error.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::networking::v1::{IngressBackend, IngressServiceBackend, ServiceBackendPort};

use crate::annotations::auth::{self, AuthHost, AuthSpec};
use crate::annotations::client_cert::{self as tls_annotations, ClientCertSpec};
use crate::htpasswd::{DigestUsers, Users};
use crate::model::{ObjectRef, RouteAction, Severity};
use crate::route_policy::{Auth, AuthTarget, BasicAuth, ClientCertAuth, DigestAuth, ExternalAuth};
use crate::world::World;

use super::Problems;
use super::backend::{PoolAnnotations, Resolver};
use super::options::annotations_of;
use super::tls::secret_data;

const FIELD: &str = "metadata.annotations";

/// The users of a basic-auth Secret: key `auth` (an htpasswd file), or every key (`auth-map`).
fn users(s: &Secret, map: bool) -> Result<(Users, Vec<String>), String> {
    if map {
        let mut entries: Vec<(&str, &[u8])> = Vec::new();
        if let Some(d) = &s.data {
            entries.extend(d.iter().map(|(k, v)| (k.as_str(), v.0.as_slice())));
        }
        if let Some(d) = &s.string_data {
            entries.extend(d.iter().map(|(k, v)| (k.as_str(), v.as_bytes())));
        }
        let text: Vec<(&str, &str)> = entries
            .into_iter()
            .map(|(k, v)| (k, std::str::from_utf8(v).unwrap_or("")))
            .collect();
        return Ok(Users::parse_map(text.into_iter()));
    }
    let file = secret_data(s, "auth").ok_or("has no key \"auth\" (the htpasswd file)")?;
    let text = std::str::from_utf8(file).map_err(|_| "key \"auth\" is not UTF-8 text")?;
    Ok(Users::parse_file(text))
}

/// The users of a digest-auth Secret: key `auth`, an htdigest file for `realm`.
fn digest_users(s: &Secret, realm: &str) -> Result<(DigestUsers, Vec<String>), String> {
    let file = secret_data(s, "auth").ok_or("has no key \"auth\" (the htdigest file)")?;
    let text = std::str::from_utf8(file).map_err(|_| "key \"auth\" is not UTF-8 text")?;
    Ok(DigestUsers::parse_file(text, realm))
}

/// Resolves the Ingress's authentication. `Ok(None)`: none asked for. `Err`: the route must stay
/// closed (the reason is reported already).
pub(super) fn resolve(
    ing: &Ingress,
    src: &ObjectRef,
    world: &World,
    (reach, allow): (super::reach::Reach, &crate::route_policy::AuthUrlAllow),
    backends: &mut Resolver<'_>,
    p: &mut Problems,
) -> Result<Option<Auth>, String> {
    // An unreadable value is reported by `options::fail_closed`, which closes the route.
    let Ok(spec) = auth::auth(annotations_of(ing)) else {
        return Err("authentication annotations cannot be read".into());
    };
    match spec {
        None => Ok(None),
        Some(AuthSpec::Basic {
            digest,
            secret,
            map,
            realm,
        }) => {
            let ns = secret.namespace.unwrap_or_else(|| src.namespace.clone());
            reach.check(src, ("Secret", &ns, &secret.name), FIELD, p)?;
            let sref = ObjectRef::new("Secret", &ns, &secret.name);
            let Some(s) = world.secrets.get(&(ns.clone(), secret.name.clone())) else {
                let msg = format!("auth-secret: {sref} not found; the routes answer 503");
                p.report(Severity::Error, "AuthSecretNotFound", src, FIELD, &msg);
                return Err(msg);
            };
            let read = if digest {
                digest_users(s, &realm)
                    .map(|(u, e)| (Auth::Digest(DigestAuth { realm, users: u }), e))
            } else {
                users(s, map).map(|(u, e)| (Auth::Basic(BasicAuth { realm, users: u }), e))
            };
            let (auth, errors) = read.map_err(|why| {
                let msg = format!("auth-secret: {sref} {why}; the routes answer 503");
                p.report(Severity::Error, "InvalidAuthSecret", src, FIELD, &msg);
                msg
            })?;
            if !errors.is_empty() {
                p.report(
                    Severity::Warning,
                    "InvalidAuthSecret",
                    &sref,
                    if map { "data" } else { "data[auth]" },
                    format!("these entries cannot log in: {}", errors.join("; ")),
                );
            }
            Ok(Some(auth))
        }
        Some(AuthSpec::External { url, options }) => {
            let target = match &url.target {
                AuthHost::Routed(host) => AuthTarget::Routed(host.clone()),
                AuthHost::Service {
                    service,
                    namespace,
                    port,
                } => {
                    reach.check(src, ("Service", namespace, service), FIELD, p)?;
                    let backend = IngressBackend {
                        resource: None,
                        service: Some(IngressServiceBackend {
                            name: service.clone(),
                            port: Some(ServiceBackendPort {
                                name: None,
                                number: Some(i32::from(*port)),
                            }),
                        }),
                    };
                    let action = backends.resolve_in(
                        namespace,
                        src,
                        "metadata.annotations[nginx.ingress.kubernetes.io/auth-url]",
                        &backend,
                        &PoolAnnotations::default(),
                        p,
                    );
                    if let RouteAction::Unavailable(why) = &action {
                        return Err(format!("auth-url: {why}"));
                    }
                    AuthTarget::Pool(action)
                }
            };
            let remote = url.origin.as_ref().and_then(|o| allow.remote(o));
            Ok(Some(Auth::External(Box::new(ExternalAuth {
                target,
                url: url.url,
                path: url.path,
                options: *options,
                remote,
            }))))
        }
    }
}

/// Resolves the Ingress's `auth-tls-*`: the CA bundle from the Secret's `ca.crt`. `Err`: the
/// route must stay closed (reported already). A `ca.crl` is refused: sluice does not check
/// revocation, and ignoring the list would admit the certificates it revokes.
pub(super) fn client_cert(
    ing: &Ingress,
    src: &ObjectRef,
    world: &World,
    reach: super::reach::Reach,
    p: &mut Problems,
) -> Result<Option<ClientCertAuth>, String> {
    let Ok(spec) = tls_annotations::client_cert(annotations_of(ing)) else {
        return Err("client certificate annotations cannot be read".into());
    };
    let Some(ClientCertSpec {
        secret,
        verify,
        depth,
        error_page,
        pass_certificate,
        match_cn,
    }) = spec
    else {
        return Ok(None);
    };
    let ns = secret.namespace.unwrap_or_else(|| src.namespace.clone());
    reach.check(src, ("Secret", &ns, &secret.name), FIELD, p)?;
    let sref = ObjectRef::new("Secret", &ns, &secret.name);
    let mut fail = |reason: &'static str, why: String| {
        let msg = format!("auth-tls-secret: {sref} {why}; the routes answer 503");
        p.report(Severity::Error, reason, src, FIELD, &msg);
        msg
    };
    let Some(s) = world.secrets.get(&(ns.clone(), secret.name.clone())) else {
        return Err(fail("AuthSecretNotFound", "not found".into()));
    };
    if secret_data(s, "ca.crl").is_some_and(|c| !c.is_empty()) {
        return Err(fail(
            "UnsupportedCRL",
            "has a ca.crl: sluice does not check revocation lists".into(),
        ));
    }
    let Some(ca) = secret_data(s, "ca.crt").filter(|c| !c.is_empty()) else {
        return Err(fail("InvalidAuthSecret", "has no key \"ca.crt\"".into()));
    };
    if let Err(e) = crate::pem::check_certificates(ca) {
        let why = match e {
            crate::pem::PemError::BadCertificate(m) => m,
            other => other.to_string(),
        };
        return Err(fail("InvalidAuthSecret", format!("ca.crt: {why}")));
    }
    Ok(Some(ClientCertAuth {
        ca_pem: ca.to_vec(),
        ca_source: sref,
        verify,
        depth,
        error_page,
        pass_certificate,
        match_cn,
    }))
}

/// The Ingress with the controller ConfigMap's `global-auth-*` as its `auth-*` annotations,
/// when global authentication applies to it: it is configured, and the Ingress has no
/// `auth-url`/`auth-type` of its own and does not say `enable-global-auth: "false"` (an
/// unreadable value of that keeps global authentication on). `None`: the Ingress as it is.
pub(super) fn with_global_auth(
    ing: &Ingress,
    settings: &crate::model::Settings,
) -> Option<Ingress> {
    if settings.global_auth.is_empty() {
        return None;
    }
    let own = annotations_of(ing);
    let enabled =
        crate::annotations::traffic::flag(own, &crate::annotations::both!("enable-global-auth"));
    if enabled == Ok(Some(false)) {
        return None;
    }
    let has_own = ["auth-url", "auth-type"].iter().any(|n| {
        own.contains_key(&format!("nginx.ingress.kubernetes.io/{n}"))
            || own.contains_key(&format!("sluice.dev/{n}"))
    });
    if has_own {
        return None;
    }
    let mut merged = ing.clone();
    let ann = merged
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    for (k, v) in &settings.global_auth {
        ann.entry(k.clone()).or_insert_with(|| v.clone());
    }
    Some(merged)
}

/// Whether a route's path is one of `no-auth-locations` (global authentication skips it).
pub(super) fn skips_global_auth(
    path: &crate::model::PathMatch,
    settings: &crate::model::Settings,
) -> bool {
    let p = if path.path.is_empty() {
        "/"
    } else {
        path.path.as_str()
    };
    settings
        .no_auth_locations
        .iter()
        .any(|l| p.starts_with(l.as_str()))
}

/// Whether the Ingress asks for client certificates (`auth-tls-secret`), readable or not.
pub(super) fn asks_client_cert(ing: &Ingress) -> bool {
    !matches!(tls_annotations::client_cert(annotations_of(ing)), Ok(None))
}

/// Closes every route of a host whose client-certificate rule cannot be enforced (the oldest
/// Ingress that sets `auth-tls-*` on it is closed for a missing Secret, a `ca.crl`, bad PEM or
/// any other reason): as the rule covers the whole host, another Ingress's path on it must
/// not serve without it. Each other Ingress so closed is told why, as an Error.
pub(super) fn close_hosts_without_their_cert_rule(
    hosts: &mut std::collections::BTreeMap<crate::model::HostMatch, super::HostRoutes>,
    locks: &std::collections::BTreeMap<crate::model::HostMatch, (ObjectRef, String)>,
    p: &mut Problems,
) {
    let mut told = std::collections::BTreeSet::new();
    for (host, (owner, why)) in locks {
        for route in hosts.get_mut(host).into_iter().flat_map(|r| r.values_mut()) {
            if route.source != *owner && told.insert(route.source.clone()) {
                p.report(
                    Severity::Error,
                    "HostClientCertNotEnforced",
                    &route.source,
                    FIELD,
                    format!(
                        "host {host}: the client-certificate rule of {owner}, which covers the whole host, cannot be enforced; every route of the host answers 503"
                    ),
                );
            }
            route.action = RouteAction::Unavailable(format!(
                "host {host}: client-certificate rule of {owner} not enforced: {why}"
            ));
            route.fallback = None;
            route.canary = None;
        }
    }
}

/// Gives every route of a host its host's client-certificate rules (the oldest Ingress's that
/// sets any), as ingress-nginx applies `auth-tls-*` to the whole server: another Ingress's
/// path on that host needs the certificate too, and never forwards a client's own
/// `ssl-client-*` fields. An Ingress on the host whose own rules differ is told they were
/// ignored.
pub(super) fn client_cert_per_host(
    hosts: &mut std::collections::BTreeMap<crate::model::HostMatch, super::HostRoutes>,
    host_certs: &std::collections::BTreeMap<crate::model::HostMatch, (ObjectRef, ClientCertAuth)>,
    p: &mut Problems,
) {
    let mut told = std::collections::BTreeSet::new();
    for (host, (owner, rules)) in host_certs {
        for route in hosts.get_mut(host).into_iter().flat_map(|r| r.values_mut()) {
            let own = &mut route.options.edits.client_cert;
            if own.as_ref().is_some_and(|c| c != rules) && told.insert(route.source.clone()) {
                p.report(
                    Severity::Warning,
                    "Conflict",
                    &route.source,
                    FIELD,
                    format!(
                        "auth-tls settings for host {host} ignored: {owner} is older and sets others, which cover the whole host"
                    ),
                );
            }
            *own = Some(rules.clone());
        }
    }
}
