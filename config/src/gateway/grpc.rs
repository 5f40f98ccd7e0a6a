//! GRPCRoutes, served as the HTTPRoutes they amount to: a gRPC call is an HTTP/2 POST to
//! `/{service}/{method}`, so a method match is a path match (service and method: `Exact`;
//! service alone: a `PathPrefix`; method alone or `RegularExpression`: an expression over
//! both segments), header matches, filters and backendRefs have the same shape, and the
//! HTTPRoute machinery (attachment, precedence, ReferenceGrants, status) does the rest under
//! the GRPCRoute's own kind. The Services' `appProtocol: kubernetes.io/h2c` makes the pods
//! speak HTTP/2 as for HTTPRoutes.

use serde_json::{Map, Value, json};

use crate::gateway_api::{GRPCRoute, HTTPRoute};

/// The path match a GRPCRoute method match amounts to (`None`: every path).
fn path_match(method: &Value) -> Option<Value> {
    let service = method.get("service").and_then(Value::as_str);
    let name = method.get("method").and_then(Value::as_str);
    let regex = method.get("type").and_then(Value::as_str) == Some("RegularExpression");
    match (regex, service, name) {
        (_, None, None) => None,
        (false, Some(s), Some(m)) => Some(json!({"type": "Exact", "value": format!("/{s}/{m}")})),
        (false, Some(s), None) => Some(json!({"type": "PathPrefix", "value": format!("/{s}")})),
        (false, None, Some(m)) => Some(json!({
            "type": "RegularExpression",
            "value": format!("/[^/]+/{}", regex::escape(m)),
        })),
        (true, s, m) => Some(json!({
            "type": "RegularExpression",
            "value": format!("/(?:{})/(?:{})", s.unwrap_or("[^/]+"), m.unwrap_or("[^/]+")),
        })),
    }
}

/// One GRPCRoute match as an HTTPRoute match.
fn http_match(m: &Value) -> Value {
    let mut out = Map::new();
    if let Some(p) = m.get("method").and_then(path_match) {
        out.insert("path".into(), p);
    }
    if let Some(h) = m.get("headers") {
        out.insert("headers".into(), h.clone());
    }
    Value::Object(out)
}

/// The HTTPRoute a GRPCRoute amounts to (same metadata, hostnames, parents, filters and
/// backends; matches on the call's path). `Err` says what cannot be read.
pub(super) fn as_http(r: &GRPCRoute) -> Result<HTTPRoute, String> {
    let mut spec = serde_json::to_value(&r.spec).map_err(|e| e.to_string())?;
    if let Some(rules) = spec.get_mut("rules").and_then(Value::as_array_mut) {
        for rule in rules {
            let Some(obj) = rule.as_object_mut() else {
                continue;
            };
            if let Some(Value::Array(matches)) = obj.remove("matches") {
                obj.insert(
                    "matches".into(),
                    Value::Array(matches.iter().map(http_match).collect()),
                );
            }
        }
    }
    let v = json!({"metadata": r.metadata, "spec": spec});
    crate::gateway_api::parse(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(rules: Value) -> GRPCRoute {
        serde_json::from_value(json!({
            "metadata": {"name": "g", "namespace": "n"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["a.test"], "rules": rules},
        }))
        .unwrap()
    }

    fn paths(h: &HTTPRoute) -> Vec<Value> {
        let v = serde_json::to_value(&h.spec).unwrap();
        v["rules"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["matches"].as_array().cloned().unwrap_or_default())
            .map(|m| m.get("path").cloned().unwrap_or(Value::Null))
            .collect()
    }

    #[test]
    fn method_matches_become_path_matches() {
        let r = grpc(json!([
            {"matches": [{"method": {"service": "pkg.Svc", "method": "Echo"}}], "backendRefs": [{"name": "a", "port": 8080}]},
            {"matches": [{"method": {"service": "pkg.Svc"}}]},
            {"matches": [{"method": {"method": "Echo"}}]},
            {"matches": [{"method": {"type": "RegularExpression", "service": "pkg\\..*", "method": "Echo.*"}}]},
            {"matches": [{"headers": [{"name": "x", "value": "1"}]}]},
        ]));
        let h = as_http(&r).unwrap();
        assert_eq!(h.spec.hostnames, Some(vec!["a.test".to_string()]));
        assert_eq!(
            paths(&h),
            vec![
                json!({"type": "Exact", "value": "/pkg.Svc/Echo"}),
                json!({"type": "PathPrefix", "value": "/pkg.Svc"}),
                json!({"type": "RegularExpression", "value": "/[^/]+/Echo"}),
                json!({"type": "RegularExpression", "value": "/(?:pkg\\..*)/(?:Echo.*)"}),
                Value::Null,
            ]
        );
        let v = serde_json::to_value(&h.spec).unwrap();
        assert_eq!(v["rules"][4]["matches"][0]["headers"][0]["name"], "x");
        assert_eq!(v["rules"][0]["backendRefs"][0]["port"], 8080);
    }
}
