//! One Ingress path → an HTTPRoute match (and the `URLRewrite` path of `rewrite-target`).
//!
//! sluice matches Ingress paths as ingress-nginx does: `Prefix` and `ImplementationSpecific`
//! by path element (as the Gateway API's `PathPrefix`), `Exact` exactly, and every path of a
//! host where some Ingress sets `use-regex` or `rewrite-target` as a case-insensitive regular
//! expression anchored at the start only. sluice's HTTPRoute `RegularExpression` is anchored at
//! both ends, so such a path `P` becomes `(?i)(?:P).*`, which matches the same requests.

use serde_json::{Value, json};

use super::notes::Outcome;

/// A path's match, and the rewrite of its rule.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PathConv {
    /// The `path` of an `HTTPRouteMatch`.
    pub path: Value,
    /// The `path` of a `URLRewrite` filter.
    pub rewrite: Option<Value>,
}

/// The regular-expression characters that make a path more than a literal.
fn literal(s: &str) -> bool {
    !s.chars().any(|c| "\\^$.|?*+()[]{}".contains(c))
}

/// `P` as sluice's anchored HTTPRoute expression matching what the Ingress regex matched.
pub(super) fn regex_value(path: &str) -> String {
    format!("(?i)(?:{path}).*")
}

/// Converts a path. `regex`: the host's paths are regular expressions; `rewrite`: the
/// Ingress's `rewrite-target`. The outcome is `rewrite-target`'s (`None` without one).
pub(super) fn convert(
    path: &str,
    path_type: &str,
    regex: bool,
    rewrite: Option<&str>,
) -> (PathConv, Option<Outcome>) {
    if !regex {
        let kind = if path_type == "Exact" {
            "Exact"
        } else {
            "PathPrefix"
        };
        let conv = PathConv {
            path: json!({"type": kind, "value": path}),
            rewrite: None,
        };
        return (conv, None);
    }
    let as_regex = json!({"type": "RegularExpression", "value": regex_value(path)});
    let Some(template) = rewrite else {
        let conv = PathConv {
            path: as_regex,
            rewrite: None,
        };
        return (conv, None);
    };
    // The usual form: `/prefix(/|$)(.*)` rewritten to `/$2`: the prefix replaced by `/`.
    if let Some(prefix) = path.strip_suffix("(/|$)(.*)")
        && literal(prefix)
        && prefix.starts_with('/')
        && template == "/$2"
    {
        let conv = PathConv {
            path: json!({"type": "PathPrefix", "value": prefix}),
            rewrite: Some(json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"})),
        };
        let how = Outcome::Approximated(format!(
            "path {path:?} with rewrite-target {template:?} became PathPrefix {prefix:?} with ReplacePrefixMatch \"/\": the same rewrite, but the prefix matches case-sensitively (ingress-nginx's regex locations ignore case)"
        ));
        return (conv, Some(how));
    }
    if !template.contains('$') {
        let conv = PathConv {
            path: as_regex,
            rewrite: Some(json!({"type": "ReplaceFullPath", "replaceFullPath": template})),
        };
        let how = Outcome::Converted(format!(
            "ReplaceFullPath {template:?} on the path's expression (the whole path becomes {template:?}, as nginx's rewrite does; the query is kept)"
        ));
        return (conv, Some(how));
    }
    let conv = PathConv {
        path: as_regex,
        rewrite: None,
    };
    let why = Outcome::NoEquivalent(format!(
        "rewrite-target {template:?} on path {path:?} uses captures the Gateway API cannot express (URLRewrite replaces a whole path or a PathPrefix only): the rule is printed without the rewrite"
    ));
    (conv, Some(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_keep_their_type() {
        let (c, o) = convert("/a", "Exact", false, None);
        assert_eq!(c.path, json!({"type": "Exact", "value": "/a"}));
        assert!(o.is_none());
        for t in ["Prefix", "ImplementationSpecific", ""] {
            let (c, _) = convert("/a/", t, false, None);
            assert_eq!(c.path, json!({"type": "PathPrefix", "value": "/a/"}));
        }
    }

    #[test]
    fn regex_paths_match_what_the_ingress_regex_matched() {
        let (c, o) = convert("/api/v[0-9]+", "Prefix", true, None);
        assert_eq!(
            c.path,
            json!({"type": "RegularExpression", "value": "(?i)(?:/api/v[0-9]+).*"})
        );
        assert!(o.is_none());
        let re = regex::Regex::new(&format!("^(?:{})$", regex_value("/api/v[0-9]+"))).unwrap();
        assert!(re.is_match("/API/v12/x"));
        assert!(!re.is_match("/x/api/v1"));
    }

    #[test]
    fn rewrites_convert_where_the_gateway_api_can_say_them() {
        let (c, o) = convert("/app(/|$)(.*)", "ImplementationSpecific", true, Some("/$2"));
        assert_eq!(c.path, json!({"type": "PathPrefix", "value": "/app"}));
        assert_eq!(
            c.rewrite,
            Some(json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}))
        );
        assert!(matches!(o, Some(Outcome::Approximated(_))));
        let (c, o) = convert("/old", "Prefix", true, Some("/new"));
        assert_eq!(
            c.rewrite,
            Some(json!({"type": "ReplaceFullPath", "replaceFullPath": "/new"}))
        );
        assert!(matches!(o, Some(Outcome::Converted(_))));
        let (c, o) = convert("/(a|b)/(.*)", "Prefix", true, Some("/$2/$1"));
        assert!(c.rewrite.is_none());
        assert!(matches!(o, Some(Outcome::NoEquivalent(_))));
    }
}
