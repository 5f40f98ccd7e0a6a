//! ingress-nginx's `ssl-passthrough`: with `--enable-ssl-passthrough`, each exact host of the
//! Ingress hands its TLS connections to the backend of its `/` path (else its first path)
//! untouched. TLS works on the host name alone, so paths and the other annotations do not
//! apply to those connections; plain HTTP to the host is routed as usual.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::Ingress;

use crate::annotations::traffic;
use crate::host::parse_rule_host;
use crate::model::{HostMatch, ObjectRef, Passthrough, Severity};

use super::backend::{PoolAnnotations, Resolver};
use super::{Problems, TranslateOptions, options};

const KEYS: [&str; 2] = [
    "sluice.dev/ssl-passthrough",
    "nginx.ingress.kubernetes.io/ssl-passthrough",
];

/// Adds the Ingress's passthrough hosts (the oldest Ingress keeps a host).
pub(super) fn collect(
    ing: &Ingress,
    src: &ObjectRef,
    opts: &TranslateOptions,
    (backends, pool): (&mut Resolver<'_>, &PoolAnnotations),
    out: &mut BTreeMap<String, Passthrough>,
    p: &mut Problems,
) {
    match traffic::flag(options::annotations_of(ing), &KEYS) {
        Ok(Some(true)) => {}
        Ok(_) => return,
        Err(e) => {
            p.invalid_annotation(src, &e);
            return;
        }
    }
    if !opts.ssl_passthrough {
        p.report(
            Severity::Warning,
            "SslPassthroughDisabled",
            src,
            "metadata.annotations[nginx.ingress.kubernetes.io/ssl-passthrough]",
            "ignored: sluice runs without --enable-ssl-passthrough, so it terminates TLS for these hosts itself",
        );
        return;
    }
    for (ri, rule) in ing
        .spec
        .iter()
        .flat_map(|s| s.rules.iter().flatten())
        .enumerate()
    {
        let field = format!("spec.rules[{ri}]");
        let host = match parse_rule_host(rule.host.as_deref().unwrap_or_default()) {
            Ok(HostMatch::Exact(h)) => h,
            _ => {
                p.report(
                    Severity::Warning,
                    "SslPassthroughNeedsHost",
                    src,
                    format!("{field}.host"),
                    "ssl-passthrough needs an exact host (the ClientHello's server name selects it); rule ignored for passthrough",
                );
                continue;
            }
        };
        let paths = rule
            .http
            .as_ref()
            .map(|h| h.paths.as_slice())
            .unwrap_or_default();
        let Some((pi, path)) = paths
            .iter()
            .enumerate()
            .find(|(_, p)| p.path.as_deref().unwrap_or("/") == "/")
            .or_else(|| paths.iter().enumerate().next())
        else {
            continue;
        };
        if let Some(existing) = out.get(&host) {
            p.report(
                Severity::Warning,
                "Conflict",
                src,
                format!("{field}.host"),
                format!(
                    "ssl-passthrough for {host} is already set by the older {}; ignored here",
                    existing.source
                ),
            );
            continue;
        }
        let action = backends.resolve(
            src,
            &format!("{field}.http.paths[{pi}].backend"),
            &path.backend,
            pool,
            p,
        );
        out.insert(
            host.clone(),
            Passthrough {
                host,
                action,
                source: src.clone(),
            },
        );
    }
}
