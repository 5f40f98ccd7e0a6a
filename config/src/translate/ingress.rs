//! The collect step for one Ingress: its policy (annotations read once, auth and certificates
//! resolved, or the reason it stays closed), its default backend, and each rule's paths into
//! the builder's host map. Whole-world steps wait for [`Builder::finish`].

use k8s_openapi::api::networking::v1::{HTTPIngressPath, Ingress, IngressRule};

use crate::annotations;
use crate::annotations::backends::CanaryRules;
use crate::host::parse_rule_host;
use crate::model::{
    HostMatch, ObjectRef, PathKind, PathMatch, Route, RouteAction, RouteOptions, Severity,
};
use crate::path::parse_path;

use super::builder::Builder;
use super::upstream_tls;
use super::{Problems, auth, backend, canary, headers, ingress_ref, options, passthrough, reach};

/// What one Ingress's annotations and references make of every route it defines.
struct IngressPolicy {
    src: ObjectRef,
    /// Whether the controller ConfigMap's global authentication applies to it.
    global_auth: bool,
    canary: Option<CanaryRules>,
    options: RouteOptions,
    regex: bool,
    www: bool,
    aliases: Vec<String>,
    pool: backend::PoolAnnotations,
    /// Why every route of it answers 503 instead, when something it asks for cannot be enforced.
    locked: Option<RouteAction>,
    /// `auth-tls-*` asked for but not enforced: a rule of the whole host.
    cert_unenforced: Option<String>,
    /// The default backend that serves its error pages and empty pools.
    fallback: Option<RouteAction>,
}

impl Builder<'_> {
    /// Collects one Ingress (call them oldest first: the older one wins a conflict).
    pub(super) fn ingress(&mut self, ing: &Ingress) {
        // The controller ConfigMap's global authentication, as this Ingress's annotations.
        let with_global = auth::with_global_auth(ing, &self.settings);
        let global_auth = with_global.is_some();
        let ing: &Ingress = with_global.as_ref().unwrap_or(ing);
        if ing.spec.is_none() {
            return;
        }
        let src = ingress_ref(ing);
        let notes = annotations::in_force::notes(options::annotations_of(ing));
        options::review_problem(&notes, &src, &mut self.problems);
        if !notes.is_empty() {
            self.annotations.insert(src.clone(), notes);
        }
        let Some(policy) = self.policy(ing, src, global_auth) else {
            return;
        };
        if !self.owners.as_ref().is_some_and(|o| o.shuts_out(ing)) {
            self.admitted
                .insert((policy.src.namespace.clone(), policy.src.name.clone()));
        }
        if policy.locked.is_none() {
            passthrough::collect(
                ing,
                &policy.src,
                self.opts,
                (&mut self.backends, &policy.pool),
                &mut self.passthrough,
                &mut self.problems,
            );
        }
        self.default_backend(ing, &policy);
        let rules = ing.spec.as_ref().and_then(|s| s.rules.as_ref());
        for (ri, rule) in rules.into_iter().flatten().enumerate() {
            self.rule(ri, rule, &policy);
        }
    }

    /// Reads the Ingress's annotations and resolves what they name; `None` drops the Ingress
    /// whole (its canary rules cannot be read, so it must not take the main route's traffic).
    fn policy(
        &mut self,
        ing: &Ingress,
        src: ObjectRef,
        global_auth: bool,
    ) -> Option<IngressPolicy> {
        let p = &mut self.problems;
        let canary = match annotations::backends::canary(options::annotations_of(ing)) {
            Ok(c) => c,
            Err(e) => {
                p.invalid_annotation(&src, &e);
                p.report(
                    Severity::Error,
                    "InvalidCanary",
                    &src,
                    "metadata.annotations",
                    "canary rules unreadable; this Ingress is ignored",
                );
                return None;
            }
        };
        let mut options = options::route_options(ing, &src, &self.settings, p);
        let regex = options::wants_regex(ing);
        let www = options::www_redirect(ing, &src, p);
        let aliases = options::server_aliases(ing, &src, p);
        let mut pool = backend::PoolAnnotations::read(ing, &src, p);
        let mut locked = options::fail_closed(ing, &src, p);
        if locked.is_none() {
            match self.references(ing, &src, global_auth, &mut options) {
                Ok(t) => pool.tls = t,
                Err(why) => locked = Some(RouteAction::Unavailable(why)),
            }
        }
        let cert_unenforced = match &locked {
            Some(RouteAction::Unavailable(why))
                if auth::asks_client_cert(ing) && options.edits.client_cert.is_none() =>
            {
                Some(why.clone())
            }
            _ => None,
        };
        let p = &mut self.problems;
        // A closed Ingress stays closed: its default backend must not serve in its place.
        let fallback =
            backend::fallback(&mut self.backends, ing, &src, &pool, p).filter(|_| locked.is_none());
        let own_errors = annotations::traffic::custom_errors(options::annotations_of(ing))
            .is_ok_and(|c| !c.is_empty());
        if fallback.is_none() {
            // Error pages need the default backend; without one the list does nothing, and an
            // empty list keeps the route on the data plane's direct path.
            options.edits.custom_errors.clear();
        }
        if fallback.is_none() && own_errors {
            p.report(
                Severity::Warning,
                "CustomErrorsWithoutBackend",
                &src,
                "metadata.annotations[nginx.ingress.kubernetes.io/custom-http-errors]",
                "ignored: sluice has no global default backend; set the default-backend annotation to the Service that serves the error pages",
            );
        }
        Some(IngressPolicy {
            src,
            global_auth,
            canary,
            options,
            regex,
            www,
            aliases,
            pool,
            locked,
            cert_unenforced,
            fallback,
        })
    }

    /// Resolves what the annotations name (the auth service, client-certificate CA, header
    /// ConfigMap, upstream TLS Secret) into `options`; returns the upstream TLS settings, or why
    /// the Ingress must stay closed.
    fn references(
        &mut self,
        ing: &Ingress,
        src: &ObjectRef,
        global_auth: bool,
        options: &mut RouteOptions,
    ) -> Result<Option<crate::model::UpstreamTlsSpec>, String> {
        // The controller ConfigMap's global auth service is the operator's, not the Ingress's:
        // it may be in any namespace.
        let auth_reach = reach::Reach {
            others: self.reach.others || global_auth,
            ..self.reach
        };
        let allow = &self.settings.auth_url_allow;
        let p = &mut self.problems;
        options.edits.auth = auth::resolve(
            ing,
            src,
            self.world,
            (auth_reach, allow),
            &mut self.backends,
            p,
        )?;
        options.edits.client_cert = auth::client_cert(ing, src, self.world, self.reach, p)?;
        options.edits.response_headers =
            headers::resolve(ing, src, self.world, &self.settings, self.reach, p)?;
        upstream_tls::resolve(ing, src, self.world, p)
    }

    /// The Ingress's `spec.defaultBackend`: the oldest Ingress's serves what no rule matches.
    fn default_backend(&mut self, ing: &Ingress, policy: &IngressPolicy) {
        let Some(db) = ing.spec.as_ref().and_then(|s| s.default_backend.as_ref()) else {
            return;
        };
        if policy.canary.is_some() {
            return;
        }
        let src = &policy.src;
        if let Some(existing) = &self.default_backend {
            let message = format!(
                "ignored: {} is older and also sets a defaultBackend",
                existing.source
            );
            let p = &mut self.problems;
            p.report(
                Severity::Warning,
                "Conflict",
                src,
                "spec.defaultBackend",
                message,
            );
            return;
        }
        let action = policy.locked.clone().unwrap_or_else(|| {
            let (b, p) = (&mut self.backends, &mut self.problems);
            b.resolve(src, "spec.defaultBackend", db, &policy.pool, p)
        });
        self.default_backend = Some(Route {
            path: PathMatch {
                kind: PathKind::Prefix,
                path: String::new(),
            },
            action,
            source: src.clone(),
            options: RouteOptions {
                ssl_redirect: false,
                force_ssl_redirect: false,
                ..policy.options.clone()
            },
            canary: None,
            fallback: policy.fallback.clone(),
        });
    }

    /// One rule: its host (unless another namespace owns it), then each path.
    fn rule(&mut self, ri: usize, rule: &IngressRule, policy: &IngressPolicy) {
        let src = &policy.src;
        let host = match parse_rule_host(rule.host.as_deref().unwrap_or_default()) {
            Ok(h) => h,
            Err(e) => {
                let field = format!("spec.rules[{ri}].host");
                let p = &mut self.problems;
                p.report(
                    Severity::Error,
                    "InvalidHost",
                    src,
                    field,
                    format!("{e}; rule ignored"),
                );
                return;
            }
        };
        if let Some(owner) = self
            .owners
            .as_ref()
            .and_then(|o| o.other_owner(&host, &src.namespace))
        {
            self.problems.report(
                Severity::Error,
                "HostOwnedByAnotherNamespace",
                src,
                format!("spec.rules[{ri}].host"),
                format!(
                    "host {host} belongs to namespace {owner}, whose Ingress claimed it first (--host-ownership namespace); rule ignored"
                ),
            );
            return;
        }
        let Some(http) = &rule.http else { return };
        for (pi, p) in http.paths.iter().enumerate() {
            self.path(
                &host,
                format!("spec.rules[{ri}].http.paths[{pi}]"),
                p,
                policy,
            );
        }
    }

    /// The path's backend (resolved only for a path that is kept: a conflicting one creates no
    /// pool).
    fn path_action(
        &mut self,
        field: &str,
        p: &HTTPIngressPath,
        policy: &IngressPolicy,
    ) -> RouteAction {
        policy.locked.clone().unwrap_or_else(|| {
            let (b, problems) = (&mut self.backends, &mut self.problems);
            b.resolve(
                &policy.src,
                &format!("{field}.backend"),
                &p.backend,
                &policy.pool,
                problems,
            )
        })
    }

    /// One path of a rule: a canary waits for its main route; a main route joins its host
    /// unless an older Ingress defined the same host, path and type.
    fn path(
        &mut self,
        host: &HostMatch,
        field: String,
        p: &HTTPIngressPath,
        policy: &IngressPolicy,
    ) {
        let src = &policy.src;
        let Some(path) = read_path(p, &field, src, &mut self.problems) else {
            return;
        };
        if let Some(rules) = &policy.canary {
            let action = self.path_action(&field, p, policy);
            self.canaries.push(canary::PendingCanary {
                host: host.clone(),
                path,
                field,
                action,
                source: src.clone(),
                rules: rules.clone(),
            });
            return;
        }
        self.host_wide(host, policy);
        let routes = self.hosts.entry(host.clone()).or_default();
        if let Some(existing) = routes.get(&path) {
            let message = format!(
                "host {host} path {:?} ({:?}) is already defined by the older {}; ignored here",
                p.path.as_deref().unwrap_or("/"),
                path.kind,
                existing.source
            );
            self.problems
                .report(Severity::Warning, "Conflict", src, field, message);
            return;
        }
        let action = self.path_action(&field, p, policy);
        let mut route_opts = policy.options.clone();
        route_opts.ssl_redirect &= self.tls_covers(host);
        if policy.global_auth && auth::skips_global_auth(&path, &self.settings) {
            route_opts.edits.auth = None;
        }
        let as_written = p.path.clone().unwrap_or_else(|| "/".to_string());
        self.written
            .insert((host.clone(), path.clone()), (as_written, field));
        self.hosts.entry(host.clone()).or_default().insert(
            path.clone(),
            Box::new(Route {
                path,
                action,
                source: src.clone(),
                options: route_opts,
                canary: None,
                fallback: policy.fallback.clone(),
            }),
        );
    }

    /// What a main route of the Ingress says about its whole host: a regex host, aliases, a
    /// www twin, the host's client-certificate rule (or its lock when that rule is unenforced).
    fn host_wide(&mut self, host: &HostMatch, policy: &IngressPolicy) {
        if policy.regex {
            self.regex_hosts.insert(host.clone());
        }
        if let HostMatch::Exact(h) = host {
            for a in &policy.aliases {
                self.alias_of.push((a.clone(), h.clone()));
            }
            if policy.www {
                let twin = (
                    canary::www_twin(h),
                    h.clone(),
                    policy.src.clone(),
                    policy.options.clone(),
                );
                self.twins.push(twin);
            }
        }
        if let Some(c) = &policy.options.edits.client_cert {
            self.host_certs
                .entry(host.clone())
                .or_insert_with(|| (policy.src.clone(), c.clone()));
        }
        if let Some(why) = &policy.cert_unenforced
            && !self.host_certs.contains_key(host)
        {
            self.host_cert_locks
                .entry(host.clone())
                .or_insert_with(|| (policy.src.clone(), why.clone()));
        }
    }
}

/// The path and its type, or `None` (reported) when it cannot be used.
fn read_path(
    p: &HTTPIngressPath,
    field: &str,
    src: &ObjectRef,
    problems: &mut Problems,
) -> Option<PathMatch> {
    let path_type = p.path_type.as_str();
    if path_type.is_empty() {
        problems.report(
            Severity::Warning,
            "MissingPathType",
            src,
            format!("{field}.pathType"),
            "pathType is required; treated as ImplementationSpecific (= Prefix)",
        );
    }
    match parse_path(p.path.as_deref(), path_type) {
        Ok(m) => Some(m),
        Err(e) => {
            let message = format!("{e}; path ignored");
            problems.report(
                Severity::Error,
                "InvalidPath",
                src,
                format!("{field}.path"),
                message,
            );
            None
        }
    }
}
