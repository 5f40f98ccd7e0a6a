//! TLSRoutes, attached and resolved as the HTTPRoutes they amount to: hostnames (matched
//! against the ClientHello's server name), parents and backendRefs have the same shape, and a
//! TLSRoute rule matches every connection its hostnames admit. The data plane serves the
//! result on TLS passthrough sockets only, where a connection is tunnelled untouched to a
//! backend of the first rule of the host its server name selects.

use serde_json::json;

use crate::gateway_api::{HTTPRoute, TLSRoute};

/// The HTTPRoute a TLSRoute amounts to (same metadata, hostnames, parents and backends).
pub(super) fn as_http(r: &TLSRoute) -> Result<HTTPRoute, String> {
    let rules: Vec<serde_json::Value> = r
        .spec
        .rules
        .iter()
        .map(|rule| {
            let mut v = json!({"backendRefs": rule.backend_refs});
            if let Some(n) = &rule.name {
                v["name"] = json!(n);
            }
            v
        })
        .collect();
    let mut spec = json!({"hostnames": r.spec.hostnames, "rules": rules});
    if let Some(p) = &r.spec.parent_refs {
        spec["parentRefs"] = json!(p);
    }
    crate::gateway_api::parse(json!({"metadata": r.metadata, "spec": spec}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_route_keeps_its_hostnames_parents_and_backends() {
        let r: TLSRoute = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "n"},
            "spec": {
                "parentRefs": [{"name": "gw", "sectionName": "tls"}],
                "hostnames": ["abc.example.com"],
                "rules": [{"name": "one", "backendRefs": [{"name": "b", "port": 8443, "weight": 2}]}],
            },
        }))
        .unwrap();
        let h = serde_json::to_value(as_http(&r).unwrap().spec).unwrap();
        assert_eq!(h["hostnames"], json!(["abc.example.com"]));
        assert_eq!(h["parentRefs"][0]["sectionName"], "tls");
        assert_eq!(h["rules"][0]["name"], "one");
        assert_eq!(h["rules"][0]["backendRefs"][0]["weight"], 2);
        assert!(h["rules"][0].get("matches").is_none());
    }

    /// A TLS passthrough listener takes TLSRoutes and makes a passthrough socket; a TLS
    /// listener in mode Terminate is refused with `UnsupportedValue`, as the suite expects.
    #[test]
    fn passthrough_listeners_take_tls_routes_and_terminate_ones_are_refused() {
        let mut w = crate::world::World::new();
        let class: crate::gateway_api::GatewayClass = serde_json::from_value(json!({
            "metadata": {"name": "sluice"},
            "spec": {"controllerName": "sluice.dev/gateway-controller"}}))
        .unwrap();
        w.gateway_classes
            .insert((String::new(), "sluice".into()), class.into());
        let gw: crate::gateway_api::Gateway = serde_json::from_value(json!({
        "metadata": {"name": "gw", "namespace": "n", "generation": 1},
        "spec": {"gatewayClassName": "sluice", "listeners": [
            {"name": "pass", "port": 443, "protocol": "TLS", "hostname": "*.example.com",
             "tls": {"mode": "Passthrough"}},
            {"name": "term", "port": 8443, "protocol": "TLS", "tls": {"mode": "Terminate"}},
        ]}}))
        .unwrap();
        w.gateways.insert(("n".into(), "gw".into()), gw.into());
        w.put_service(
            serde_json::from_value::<k8s_openapi::api::core::v1::Service>(json!({
                "metadata": {"namespace": "n", "name": "b"},
                "spec": {"ports": [{"port": 8443}]}}))
            .unwrap(),
        );
        let route: TLSRoute = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "n", "generation": 1},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["abc.example.com"],
                     "rules": [{"backendRefs": [{"name": "b", "port": 8443}]}]}}))
        .unwrap();
        w.tls_routes.insert(("n".into(), "t".into()), route.into());
        let out = super::super::translate(
            &w,
            &super::super::GatewayOptions::default(),
            &crate::model::Settings::default(),
        );
        let g = &out.status.gateways[&("n".to_string(), "gw".to_string())];
        let pass = &g.listeners[0];
        assert_eq!(
            pass.supported_kinds,
            vec![(
                crate::gateway_api::GROUP.to_string(),
                "TLSRoute".to_string()
            )]
        );
        assert_eq!(pass.attached_routes, 1);
        let term = &g.listeners[1];
        let accepted = term
            .conditions
            .iter()
            .find(|c| c.kind == "Accepted")
            .unwrap();
        assert_eq!(
            (accepted.status, accepted.reason),
            (false, "UnsupportedValue")
        );
        assert!(term.supported_kinds.is_empty());
        let r = &out.status.tls_routes[&("n".to_string(), "t".to_string())];
        assert!(r.parents[0].conditions.iter().all(|c| c.status), "{r:?}");
        let socket = out.sockets.iter().find(|s| s.port == 443).unwrap();
        assert!(socket.passthrough && socket.tls);
        assert!(
            out.sockets.iter().all(|s| s.port != 8443),
            "a refused listener opens nothing"
        );
    }
}
