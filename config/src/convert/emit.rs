//! The HTTPRoute objects of a plan: rules with their matches, filters, backends and
//! timeouts; a host with TLS gets its HTTPS listener's route and an `http` one.

use serde_json::{Value, json};

use super::notes::{Note, Outcome, Settings};
use super::routes::{HostRoute, Plan};
use super::{ConvertOptions, GatewayObject, listeners, metadata, typed};
use crate::route_policy::HeaderRule;

/// Filters every serving rule of a route carries.
fn filters(route: &HostRoute, rewrite: Option<&Value>, hsts: Option<&str>) -> Vec<Value> {
    let mut f = Vec::new();
    if route.vhost.is_some() || rewrite.is_some() {
        let mut u = json!({});
        if let Some(h) = &route.vhost {
            u["hostname"] = json!(h);
        }
        if let Some(p) = rewrite {
            u["path"] = p.clone();
        }
        f.push(json!({"type": "URLRewrite", "urlRewrite": u}));
    }
    if let Some(p) = &route.forwarded_prefix {
        f.push(json!({"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-Forwarded-Prefix", "value": p}]}}));
    }
    if let Some(h) = hsts {
        f.push(json!({"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": [{"name": "Strict-Transport-Security", "value": h}]}}));
    }
    f
}

/// A rule: matches, filters, backends, timeout.
fn rule(
    matches: Value,
    filters: &[Value],
    backends: Vec<Value>,
    timeout: Option<&String>,
) -> Value {
    let mut r = json!({"matches": [matches]});
    if !filters.is_empty() {
        r["filters"] = json!(filters);
    }
    if !backends.is_empty() {
        r["backendRefs"] = json!(backends);
    }
    if let Some(t) = timeout {
        r["timeouts"] = json!({"backendRequest": t});
    }
    r
}

/// The serving rules of a route (`hsts`: on an HTTPS listener).
fn serving_rules(route: &HostRoute, hsts: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(r) = &route.redirect {
        for x in &route.rules {
            out.push(rule(
                json!({"path": x.path.path}),
                &[json!({"type": "RequestRedirect", "requestRedirect": r})],
                Vec::new(),
                None,
            ));
        }
        return out;
    }
    if let Some(root) = &route.app_root {
        let f = json!({"type": "RequestRedirect", "requestRedirect": {"path": {"type": "ReplaceFullPath", "replaceFullPath": root}, "statusCode": 302}});
        out.push(rule(
            json!({"path": {"type": "Exact", "value": "/"}}),
            &[f],
            Vec::new(),
            None,
        ));
    }
    let t = route.timeout.as_ref();
    if route.closed {
        for x in &route.rules {
            out.push(rule(json!({"path": x.path.path}), &[], Vec::new(), None));
        }
        return out;
    }
    for x in &route.rules {
        let f = filters(route, x.path.rewrite.as_ref(), hsts);
        let main = x.backend.json(None);
        let Some((c, cr)) = &x.canary else {
            out.push(rule(json!({"path": x.path.path}), &f, vec![main], t));
            continue;
        };
        let canary = c.json(None);
        let with_header = |name: &str, kind: &str, value: &str| json!({"path": x.path.path, "headers": [{"type": kind, "name": name, "value": value}]});
        if let Some((h, hr)) = &cr.header {
            match hr {
                HeaderRule::Value(v) => out.push(rule(
                    with_header(h, "Exact", v),
                    &f,
                    vec![canary.clone()],
                    t,
                )),
                HeaderRule::Pattern(p) => out.push(rule(
                    with_header(h, "RegularExpression", &format!(".*(?:{p}).*")),
                    &f,
                    vec![canary.clone()],
                    t,
                )),
                HeaderRule::AlwaysNever => {
                    out.push(rule(
                        with_header(h, "Exact", "always"),
                        &f,
                        vec![canary.clone()],
                        t,
                    ));
                    out.push(rule(
                        with_header(h, "Exact", "never"),
                        &f,
                        vec![main.clone()],
                        t,
                    ));
                }
            }
        }
        if let Some(name) = &cr.cookie {
            let re = |v: &str| format!("(?:.*;\\s*)?{}={v}(?:;.*)?", regex::escape(name));
            out.push(rule(
                with_header("Cookie", "RegularExpression", &re("always")),
                &f,
                vec![canary.clone()],
                t,
            ));
            out.push(rule(
                with_header("Cookie", "RegularExpression", &re("never")),
                &f,
                vec![main.clone()],
                t,
            ));
        }
        let backends = match (cr.weight, cr.weight_total) {
            (0, _) => vec![main],
            (w, total) if w >= total => vec![canary],
            (w, total) => vec![x.backend.json(Some(total - w)), c.json(Some(w))],
        };
        out.push(rule(json!({"path": x.path.path}), &f, backends, t));
    }
    out
}
/// The HTTPRoute objects of the plan.
pub(super) fn objects(
    plan: &Plan,
    opts: &ConvertOptions,
    settings: &Settings,
    notes: &mut Vec<Note>,
) -> Vec<GatewayObject> {
    let mut out = Vec::new();
    let parent = |section: Option<&str>| {
        let mut p = json!({"name": opts.gateway_name, "namespace": opts.gateway_namespace});
        if let Some(s) = section {
            p["sectionName"] = json!(s);
        }
        p
    };
    let mut push = |name: &str,
                    r: &HostRoute,
                    parents: Vec<Value>,
                    rules: Vec<Value>,
                    notes: &mut Vec<Note>| {
        let mut spec = json!({"parentRefs": parents, "rules": rules});
        let hostnames: Vec<&String> = r.host.iter().chain(&r.aliases).collect();
        if !hostnames.is_empty() {
            spec["hostnames"] = json!(hostnames);
        }
        let v = json!({"metadata": metadata(&r.namespace, name, &r.from), "spec": spec});
        if let Some(o) = typed(v, notes, &r.from) {
            out.push(GatewayObject::HttpRoute(Box::new(o)));
        }
    };
    for r in &plan.routes {
        if r.catch_all {
            push(
                &r.name,
                r,
                vec![parent(None)],
                serving_rules(r, None),
                notes,
            );
            continue;
        }
        let https = r
            .host
            .as_deref()
            .and_then(|h| listeners::covering(&plan.tls, h));
        let redirect_rules = |r: &HostRoute| {
            let mut red = json!({"scheme": "https", "statusCode": 308});
            if opts.https_port != 443 {
                red["port"] = json!(opts.https_port);
            }
            r.rules
                .iter()
                .map(|x| {
                    rule(
                        json!({"path": x.path.path}),
                        &[json!({"type": "RequestRedirect", "requestRedirect": red})],
                        Vec::new(),
                        None,
                    )
                })
                .collect::<Vec<_>>()
        };
        match https {
            Some(listener) => {
                push(
                    &r.name,
                    r,
                    vec![parent(Some(&listener))],
                    serving_rules(r, settings.hsts.as_deref()),
                    notes,
                );
                let redirect =
                    r.force_ssl_redirect || r.ssl_redirect.unwrap_or(settings.ssl_redirect);
                let http_rules = if redirect {
                    redirect_rules(r)
                } else {
                    serving_rules(r, None)
                };
                push(
                    &format!("{}-http", r.name),
                    r,
                    vec![parent(Some("http"))],
                    http_rules,
                    notes,
                );
            }
            None if r.force_ssl_redirect => {
                push(
                    &r.name,
                    r,
                    vec![parent(Some("http"))],
                    redirect_rules(r),
                    notes,
                );
                notes.push(Note::new(&r.from, "force-ssl-redirect", Outcome::Approximated(format!("host {} has no TLS: the Gateway has no HTTPS listener for it, so the redirect leads to the default listener's certificate", r.host.as_deref().unwrap_or("*")))));
            }
            None => push(
                &r.name,
                r,
                vec![parent(Some("http"))],
                serving_rules(r, None),
                notes,
            ),
        }
    }
    out
}
