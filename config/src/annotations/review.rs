//! The migration review of one Ingress's annotations: for each annotation under
//! `nginx.ingress.kubernetes.io/` or `sluice.dev/`, whether sluice honours it, honours it
//! differently, does not support it, refuses it, fails closed on it, or cannot read its value.
//! `sluice check` prints this; translation turns it into one Warning per Ingress.

use std::collections::BTreeMap;

use serde::Serialize;

use super::catalog::{self, Support};
use super::{AnnotationError, access, backends, traffic};

/// What sluice does with one annotation of one Ingress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "verdict", content = "why")]
pub enum Verdict {
    /// As ingress-nginx does.
    Honoured,
    /// Understood, differently (how).
    Differs(String),
    /// Not acted on (why).
    Unsupported(String),
    /// Raw configuration, never executed.
    Refused(String),
    /// Access control not enforced yet: the routes answer 503.
    FailsClosed(String),
    /// The value cannot be used (why); the default applies.
    Invalid(String),
}

impl Verdict {
    /// Whether `sluice check` exits 1 for it.
    pub fn blocks_migration(&self) -> bool {
        !matches!(self, Verdict::Honoured | Verdict::Differs(_))
    }

    /// The one-word name.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Honoured => "honoured",
            Verdict::Differs(_) => "differs",
            Verdict::Unsupported(_) => "unsupported",
            Verdict::Refused(_) => "refused",
            Verdict::FailsClosed(_) => "fails closed",
            Verdict::Invalid(_) => "invalid",
        }
    }

    /// The explanation, empty for honoured.
    pub fn why(&self) -> &str {
        match self {
            Verdict::Honoured => "",
            Verdict::Differs(s)
            | Verdict::Unsupported(s)
            | Verdict::Refused(s)
            | Verdict::FailsClosed(s)
            | Verdict::Invalid(s) => s,
        }
    }
}

/// One annotation's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The full annotation key.
    pub annotation: String,
    /// The verdict (flattened into `verdict` and `why` in JSON).
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// Runs every reader, so that each annotation's value is checked exactly as translation will
/// read it; returns the errors by key.
fn value_errors(a: &BTreeMap<String, String>) -> BTreeMap<&'static str, String> {
    let mut errors = BTreeMap::new();
    let mut note = |r: Result<(), AnnotationError>| {
        if let Err(e) = r {
            errors.entry(e.name).or_insert(e.message);
        }
    };
    note(super::ssl_redirect(a).map(drop));
    note(super::backend_protocol(a).map(drop));
    note(super::hsts(a).map(drop));
    note(super::max_in_flight(a).map(drop));
    note(super::balance(a).map(drop));
    note(super::next_upstream(a).map(drop));
    note(traffic::flag(a, &super::both!("force-ssl-redirect")).map(drop));
    note(traffic::flag(a, &super::both!("use-regex")).map(drop));
    note(traffic::flag(a, &super::both!("from-to-www-redirect")).map(drop));
    note(traffic::flag(a, &super::both!("service-upstream")).map(drop));
    note(traffic::redirect(a).map(drop));
    note(traffic::app_root(a).map(drop));
    note(traffic::rewrite_target(a).map(drop));
    note(traffic::forwarded_prefix(a).map(drop));
    note(traffic::upstream_vhost(a).map(drop));
    note(traffic::body_size(a).map(drop));
    note(traffic::read_timeout(a).map(drop));
    note(traffic::other_timeouts(a));
    note(traffic::custom_errors(a).map(drop));
    note(traffic::server_aliases(a).map(drop));
    note(traffic::default_backend(a).map(drop));
    note(backends::canary(a).map(drop));
    note(backends::affinity(a).map(drop));
    note(access::source_ranges(a).map(drop));
    note(access::cors(a).map(drop));
    note(access::rate_limits(a).map(drop));
    note(access::bandwidth(a).map(drop));
    note(super::auth::auth(a).map(drop));
    note(super::auth::satisfy_any(a).map(drop));
    note(super::client_cert::client_cert(a).map(drop));
    note(
        traffic::flag(
            a,
            &[
                "sluice.dev/ssl-passthrough",
                "nginx.ingress.kubernetes.io/ssl-passthrough",
            ],
        )
        .map(drop),
    );
    errors
}

/// The verdict for every annotation of an Ingress under either prefix, sorted by key.
pub fn review(a: &BTreeMap<String, String>) -> Vec<Finding> {
    let errors = value_errors(a);
    a.keys()
        .filter_map(|key| {
            let verdict = match catalog::lookup(key)? {
                Err(name) if catalog::access_like(name) => Verdict::FailsClosed(format!(
                    "sluice does not know {name:?}, which reads as access control: the Ingress answers 503"
                )),
                Err(name) => Verdict::Unsupported(format!("sluice does not know {name:?}")),
                Ok(_) if errors.contains_key(key.as_str()) => {
                    Verdict::Invalid(errors[key.as_str()].clone())
                }
                Ok(e) => match e.support {
                    Support::Honoured => Verdict::Honoured,
                    Support::Differs => Verdict::Differs(e.note.to_string()),
                    Support::Unsupported => Verdict::Unsupported(e.note.to_string()),
                    Support::Refused => Verdict::Refused(e.note.to_string()),
                    Support::FailsClosed => Verdict::FailsClosed(e.note.to_string()),
                },
            };
            Some(Finding {
                annotation: key.clone(),
                verdict,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_verdict() {
        let a: BTreeMap<String, String> = [
            ("nginx.ingress.kubernetes.io/rewrite-target", "/$1"),
            ("nginx.ingress.kubernetes.io/proxy-buffering", "off"),
            ("nginx.ingress.kubernetes.io/mirror-host", "mirror.test"),
            (
                "nginx.ingress.kubernetes.io/configuration-snippet",
                "more_set_headers x;",
            ),
            (
                "nginx.ingress.kubernetes.io/auth-proxy-set-headers",
                "default/h",
            ),
            ("nginx.ingress.kubernetes.io/proxy-body-size", "lots"),
            ("nginx.ingress.kubernetes.io/made-up", "1"),
            ("sluice.dev/hsts", "true"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let findings = review(&a);
        let got: Vec<(&str, &str)> = findings
            .iter()
            .map(|f| {
                (
                    f.annotation.rsplit('/').next().unwrap_or_default(),
                    f.verdict.word(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("auth-proxy-set-headers", "fails closed"),
                ("configuration-snippet", "refused"),
                ("made-up", "unsupported"),
                ("mirror-host", "unsupported"),
                ("proxy-body-size", "invalid"),
                ("proxy-buffering", "differs"),
                ("rewrite-target", "honoured"),
                ("hsts", "honoured"),
            ]
        );
        let blocking = review(&a)
            .iter()
            .filter(|f| f.verdict.blocks_migration())
            .count();
        assert_eq!(blocking, 5);
        let json = serde_json::to_value(&review(&a)[4]).unwrap_or_default();
        assert_eq!(json["verdict"], "invalid");
        assert!(json["why"].as_str().unwrap_or_default().contains("lots"));
    }
}
