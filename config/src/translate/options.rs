//! What an Ingress's annotations make of its routes: options and edits, the fail-closed rule
//! for access control sluice does not enforce, and the one migration-review Warning per
//! Ingress.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::Ingress;

use crate::annotations::{self, AnnotationError, access, auth, both, traffic};
use crate::configmap;
use crate::model::AnnotationNote;
use crate::model::{NextUpstream, ObjectRef, RouteAction, RouteOptions, Settings, Severity};
use crate::route_policy::{RouteEdits, RouteLimits, SourceRanges};
use crate::world::World;

use super::TranslateOptions;

use super::Problems;

/// The global settings: the flags' (`opts.settings`) with the controller ConfigMap's values
/// over them. A missing ConfigMap is a Warning (the flags apply), as is every key sluice does
/// not honour; an invalid value is a Warning on its key and the flag's value stays.
pub(super) fn settings(world: &World, opts: &TranslateOptions, p: &mut Problems) -> Settings {
    let mut settings = opts.settings.clone();
    let Some(cm) = &opts.configmap else {
        return settings;
    };
    let Some(obj) = world
        .config_maps
        .get(&(cm.namespace.clone(), cm.name.clone()))
    else {
        p.report(
            Severity::Warning,
            "ConfigMapNotFound",
            cm,
            "-",
            "the controller ConfigMap does not exist; the flags' defaults apply",
        );
        return settings;
    };
    let empty = BTreeMap::new();
    let applied = configmap::apply(obj.data.as_ref().unwrap_or(&empty), &mut settings);
    for (key, why) in applied.invalid {
        p.report(
            Severity::Warning,
            "InvalidConfigMapValue",
            cm,
            format!("data[{key}]"),
            format!("{why}; the default stays"),
        );
    }
    if !applied.not_honoured.is_empty() {
        p.report(
            Severity::Warning,
            "ConfigMapKeysNotHonoured",
            cm,
            "data",
            applied.not_honoured.join("; "),
        );
    }
    settings
}

/// An Ingress's annotations, or none.
pub(super) fn annotations_of(ing: &Ingress) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    ing.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

/// An Ingress that restricts access with annotations sluice does not enforce, or whose access
/// annotations (source ranges, authentication, client certificates, request limits and their
/// `limit-whitelist`) cannot be read, is not served open: every route of it
/// answers 503, and the problem (an Error, so a Warning Event) names the annotations. An
/// Ingress migrated from ingress-nginx must never become more exposed than it was.
pub(super) fn fail_closed(ing: &Ingress, src: &ObjectRef, p: &mut Problems) -> Option<RouteAction> {
    let ann = annotations_of(ing);
    let found = annotations::unenforced_access(ann);
    let unreadable: Vec<String> = [
        access::source_ranges(ann).err(),
        access::cors(ann).err(),
        auth::auth(ann).err(),
        auth::satisfy_any(ann).err(),
        crate::annotations::client_cert::client_cert(ann).err(),
        access::bandwidth(ann).err(),
        access::rate_limits(ann).err(),
    ]
    .into_iter()
    .flatten()
    .map(|e| e.to_string())
    .collect();
    let msg = match (found.is_empty(), unreadable.is_empty()) {
        (true, true) => return None,
        (false, _) => format!(
            "access control sluice does not enforce yet ({}); its routes answer 503 instead of serving without it",
            found.join(", ")
        ),
        (true, false) => format!(
            "access control that cannot be read ({}); its routes answer 503 instead of serving without it",
            unreadable.join("; ")
        ),
    };
    let msg = crate::annotations::in_force::redact_urls(&msg);
    p.report(
        Severity::Error,
        "AccessControlNotEnforced",
        src,
        "metadata.annotations",
        msg.clone(),
    );
    Some(RouteAction::Unavailable(msg))
}

/// One Warning per Ingress listing every annotation sluice does not honour as ingress-nginx
/// does (differs, unsupported, refused), the verdicts `sluice check` prints. Invalid values
/// are reported on their own key, and access control by [`fail_closed`], so neither repeats
/// here.
pub(super) fn review_problem(notes: &[AnnotationNote], src: &ObjectRef, p: &mut Problems) {
    let parts: Vec<String> = notes
        .iter()
        .filter(|n| matches!(n.verdict, "differs" | "unsupported" | "refused"))
        .map(|n| format!("{} {}: {}", n.name, n.verdict, n.why))
        .collect();
    if parts.is_empty() {
        return;
    }
    p.report(
        Severity::Warning,
        "AnnotationsNotHonoured",
        src,
        "metadata.annotations",
        parts.join("; "),
    );
}

/// Reads one annotation; an invalid value is reported on its key and the default used.
fn or_default<T: Default>(r: Result<T, AnnotationError>, src: &ObjectRef, p: &mut Problems) -> T {
    r.unwrap_or_else(|e| {
        p.invalid_annotation(src, &e);
        T::default()
    })
}

/// Whether the Ingress asks for regex paths (`use-regex`, or a `rewrite-target`, which
/// ingress-nginx makes imply it).
pub(super) fn wants_regex(ing: &Ingress) -> bool {
    let a = annotations_of(ing);
    traffic::flag(a, &both!("use-regex")).ok().flatten() == Some(true)
        || traffic::rewrite_target(a).ok().flatten().is_some()
}

/// Whether the Ingress asks for `from-to-www-redirect`.
pub(super) fn www_redirect(ing: &Ingress, src: &ObjectRef, p: &mut Problems) -> bool {
    or_default(
        traffic::flag(annotations_of(ing), &both!("from-to-www-redirect")),
        src,
        p,
    )
    .unwrap_or(false)
}

/// The Ingress's `server-alias` hosts.
pub(super) fn server_aliases(ing: &Ingress, src: &ObjectRef, p: &mut Problems) -> Vec<String> {
    or_default(traffic::server_aliases(annotations_of(ing)), src, p)
}

/// The route's source ranges: each list the Ingress sets, else the controller ConfigMap's
/// (`whitelist-source-range`, `denylist-source-range`), as ingress-nginx takes each default
/// from its ConfigMap separately.
fn source_ranges(ann: &BTreeMap<String, String>, settings: &Settings) -> Option<SourceRanges> {
    let own = access::source_ranges(ann).ok().flatten();
    let pick = |own: Option<&Vec<crate::cidr::Cidr>>, global: &Vec<crate::cidr::Cidr>| {
        own.filter(|l| !l.is_empty()).unwrap_or(global).clone()
    };
    let global = &settings.source_ranges;
    let allow = pick(own.as_ref().map(|o| &o.allow), &global.allow);
    let deny = pick(own.as_ref().map(|o| &o.deny), &global.deny);
    (!allow.is_empty() || !deny.is_empty()).then_some(SourceRanges { allow, deny })
}

/// Per-Ingress options from annotations; invalid annotations are reported and ignored.
pub(super) fn route_options(
    ing: &Ingress,
    src: &ObjectRef,
    settings: &Settings,
    p: &mut Problems,
) -> RouteOptions {
    let ann = annotations_of(ing);
    let ssl_redirect = or_default(annotations::ssl_redirect(ann), src, p);
    let next_upstream = match annotations::next_upstream(ann) {
        Ok((v, _)) => v,
        Err(e) => {
            p.invalid_annotation(src, &e);
            NextUpstream::default()
        }
    };
    or_default(traffic::other_timeouts(ann), src, p);
    let edits = RouteEdits {
        redirect: or_default(traffic::redirect(ann), src, p),
        app_root: or_default(traffic::app_root(ann), src, p),
        rewrite_target: or_default(traffic::rewrite_target(ann), src, p),
        forwarded_prefix: or_default(traffic::forwarded_prefix(ann), src, p),
        upstream_vhost: or_default(traffic::upstream_vhost(ann), src, p),
        affinity: or_default(crate::annotations::backends::affinity(ann), src, p),
        // Unreadable access lists lock the Ingress (`fail_closed`), so `None` here never opens.
        source_ranges: source_ranges(ann, settings),
        cors: access::cors(ann).ok().flatten(),
        host_redirect: None,
        limits: access::rate_limits(ann).ok().flatten(),
        // The Ingress's own list, else the ConfigMap's.
        custom_errors: Some(or_default(traffic::custom_errors(ann), src, p))
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| settings.custom_errors.clone()),
        // Set by `translate::auth`, which needs the world; unreadable values lock the Ingress.
        auth: None,
        satisfy_any: auth::satisfy_any(ann).unwrap_or(false),
        client_cert: None,
        bandwidth: access::bandwidth(ann).ok().flatten(),
        // Set by `translate::headers`, which needs the world.
        response_headers: Vec::new(),
    };
    let limits = RouteLimits {
        max_body_size: or_default(traffic::body_size(ann), src, p)
            .or(settings.limits.max_body_size),
        read_timeout: or_default(traffic::read_timeout(ann), src, p)
            .or(settings.limits.read_timeout),
    };
    RouteOptions {
        ssl_redirect: ssl_redirect.unwrap_or(settings.ssl_redirect),
        force_ssl_redirect: or_default(traffic::flag(ann, &both!("force-ssl-redirect")), src, p)
            .unwrap_or(false),
        hsts: if ann.contains_key(annotations::HSTS) {
            or_default(annotations::hsts(ann), src, p)
        } else {
            settings.hsts
        },
        next_upstream,
        edits,
        limits,
    }
}
