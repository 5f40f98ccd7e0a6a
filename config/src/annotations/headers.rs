//! `custom-headers`: response fields an Ingress sets from a ConfigMap (ingress-nginx's
//! `more_set_headers`), and the rules a field must pass before it reaches a client. ingress-nginx
//! 1.12+ sets only the names the controller ConfigMap lists in
//! `global-allowed-response-headers`, so that whoever may write an Ingress cannot set fields
//! the cluster's operator has not allowed; sluice keeps that rule and adds one of its own: the
//! fields that frame a response (`Content-Length`, `Transfer-Encoding`, `Connection`, ...) are
//! never set this way, whatever the list says, because a wrong one desynchronises the client's
//! connection.

use std::collections::BTreeMap;

use super::{AnnotationError, first};
use super::{SecretName, secret_name};

/// Fields that frame or route a message: never set from a ConfigMap.
pub const FRAMING: &[&str] = &[
    "connection",
    "content-length",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Longest value sluice sets (ingress-nginx has no bound; nginx's own header buffers do).
pub const MAX_VALUE: usize = 4096;

/// The ConfigMap `custom-headers` names (`NAME` in the Ingress's namespace, or
/// `NAMESPACE/NAME`); `None` without the annotation.
pub fn custom_headers(a: &BTreeMap<String, String>) -> Result<Option<SecretName>, AnnotationError> {
    match first(a, &both!("custom-headers")) {
        None => Ok(None),
        Some((name, v)) => secret_name(name, v).map(Some),
    }
}

/// A field name ingress-nginx accepts in a custom-headers ConfigMap: letters, digits, `-`
/// and `_`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A field value sluice sets: visible ASCII, spaces and tabs, not empty, at most [`MAX_VALUE`]
/// bytes, so that no ConfigMap can split a response with CR or LF.
pub fn valid_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_VALUE
        && v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// Why one `name: value` pair of a custom-headers ConfigMap cannot be set; `None` when it can.
/// `allowed` is the controller ConfigMap's `global-allowed-response-headers`, lower case.
pub fn refusal(name: &str, value: &str, allowed: &[String]) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if !valid_name(name) {
        return Some(format!(
            "{name:?} is not a field name (letters, digits, - and _)"
        ));
    }
    if FRAMING.contains(&lower.as_str()) {
        return Some(format!(
            "{name} frames the response and is never set from a ConfigMap"
        ));
    }
    if !valid_value(value) {
        return Some(format!(
            "the value of {name} is empty, longer than {MAX_VALUE} bytes, or has bytes a field value cannot hold"
        ));
    }
    if !allowed.contains(&lower) {
        return Some(format!(
            "{name} is not in the controller ConfigMap's global-allowed-response-headers"
        ));
    }
    None
}

/// The controller ConfigMap's `global-allowed-response-headers`: comma-separated field names,
/// returned lower case and sorted; `Err` names the first that is not a field name.
pub fn allowed_list(v: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for n in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !valid_name(n) {
            return Err(format!("{n:?} is not a field name"));
        }
        out.push(n.to_ascii_lowercase());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ann(v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(
            "nginx.ingress.kubernetes.io/custom-headers".into(),
            v.into(),
        )])
    }

    #[test]
    fn the_annotation_names_a_config_map() {
        assert_eq!(custom_headers(&BTreeMap::new()).unwrap(), None);
        let own = custom_headers(&ann("security")).unwrap().unwrap();
        assert_eq!((own.namespace, own.name.as_str()), (None, "security"));
        let other = custom_headers(&ann("ingress-nginx/security"))
            .unwrap()
            .unwrap();
        assert_eq!(other.namespace.as_deref(), Some("ingress-nginx"));
        for bad in ["", "a/b/c", "/x", "x/"] {
            assert!(custom_headers(&ann(bad)).is_err(), "{bad:?}");
        }
        // sluice's spelling wins.
        let mut both = ann("nginx-one");
        both.insert("sluice.dev/custom-headers".into(), "sluice-one".into());
        assert_eq!(custom_headers(&both).unwrap().unwrap().name, "sluice-one");
    }

    #[test]
    fn fields_are_checked_as_ingress_nginx_does_and_framing_is_never_set() {
        let allowed = allowed_list("X-Frame-Options, my_header,Content-Length").unwrap();
        assert_eq!(allowed, ["content-length", "my_header", "x-frame-options"]);
        assert_eq!(refusal("X-Frame-Options", "DENY", &allowed), None);
        assert_eq!(refusal("My_Header", "$remote_addr", &allowed), None);
        let why = |n: &str, v: &str| refusal(n, v, &allowed).unwrap();
        assert!(why("X-Other", "1").contains("global-allowed-response-headers"));
        assert!(why("Content-Length", "0").contains("frames the response"));
        assert!(why("Transfer-Encoding", "chunked").contains("frames"));
        assert!(why("X Frame", "1").contains("not a field name"));
        assert!(why("X-Frame-Options", "a\r\nSet-Cookie: x=1").contains("cannot hold"));
        assert!(why("X-Frame-Options", "").contains("empty"));
        assert!(why("X-Frame-Options", &"a".repeat(MAX_VALUE + 1)).contains("longer"));
        assert!(why("x-frame-options", "\u{e9}").contains("cannot hold"));
        assert!(allowed_list("X-Ok,Bad Name").is_err());
        assert_eq!(allowed_list(" , ").unwrap(), Vec::<String>::new());
    }
}
