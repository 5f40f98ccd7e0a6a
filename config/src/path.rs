//! Ingress path rules: validation, normalization and the reference matcher.
//!
//! `Prefix` matching is element-wise on `/`-separated elements: `/aaa` never matches `/aaaccc`,
//! a trailing slash on the rule is ignored, and `/foo` matches `/foo`, `/foo/` and `/foo/bar`.
//! We store prefix paths without their trailing slash (`/` becomes the empty string) so that a
//! request matches prefix `p` exactly when it equals `p` or continues with `/` right after `p`.

/// Path match type after translation; `ImplementationSpecific` is translated to `Prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathKind {
    /// The whole path must be equal (case-sensitive).
    Exact,
    /// Element-wise prefix on `/`-separated elements.
    Prefix,
    /// A regular expression matched case-insensitively from the start of the path
    /// (ingress-nginx's `use-regex`, or a host where any Ingress uses `rewrite-target`). The
    /// path holds the expression as written.
    Regex,
}

/// A path match. Prefix paths are stored normalized (no trailing slash; `/` is stored as ``).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathMatch {
    /// Exact or prefix.
    pub kind: PathKind,
    /// The normalized path.
    pub path: String,
}

/// Why an Ingress path was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Exact and Prefix paths must be absolute.
    #[error("path {0:?} must start with '/'")]
    NotAbsolute(String),
    /// Unknown `pathType`.
    #[error("unknown pathType {0:?} (expected Exact, Prefix or ImplementationSpecific)")]
    UnknownType(String),
}

/// Builds a [`PathMatch`] from an Ingress path and `pathType`. `ImplementationSpecific` (and a
/// missing type, reported separately as a warning) behaves as `Prefix`; a missing path is `/`.
pub fn parse_path(path: Option<&str>, path_type: &str) -> Result<PathMatch, PathError> {
    let kind = match path_type {
        "Exact" => PathKind::Exact,
        "Prefix" | "ImplementationSpecific" | "" => PathKind::Prefix,
        other => return Err(PathError::UnknownType(other.to_string())),
    };
    let raw = match path {
        None | Some("") => "/",
        Some(p) => p,
    };
    if !raw.starts_with('/') {
        return Err(PathError::NotAbsolute(raw.to_string()));
    }
    let path = match kind {
        PathKind::Exact | PathKind::Regex => raw.to_string(),
        PathKind::Prefix => raw.trim_end_matches('/').to_string(),
    };
    Ok(PathMatch { kind, path })
}

/// Reference semantics: does `rule` match the request path (query already removed)?
pub fn path_matches(rule: &PathMatch, request: &str) -> bool {
    match rule.kind {
        PathKind::Exact => rule.path == request,
        PathKind::Prefix => request
            .strip_prefix(rule.path.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
        PathKind::Regex => path_regex(&rule.path).is_ok_and(|re| re.is_match(request)),
    }
}

/// Ordering key for "longest match wins, Exact beats Prefix on a tie": larger is better.
/// The length is that of the rule as matched (a prefix's normalized length).
pub fn match_rank(rule: &PathMatch) -> (usize, bool) {
    (rule.path.len(), rule.kind == PathKind::Exact)
}

/// Compiles a `use-regex` path as the data plane will: case-insensitive, anchored at the start
/// of the path. The `regex` crate has no look-around and no back-references (PCRE has both);
/// such a path is an error naming the construct, never a silently different match.
pub fn path_regex(path: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(&format!("^(?:{path})"))
        .case_insensitive(true)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            let hint = if path.contains("(?=")
                || path.contains("(?!")
                || path.contains("(?<=")
                || path.contains("(?<!")
            {
                " (look-around is a PCRE feature the regex crate does not have)"
            } else if path.contains("\\1") || path.contains("\\k<") {
                " (back-references are a PCRE feature the regex crate does not have)"
            } else {
                ""
            };
            format!("path {path:?} is not a regular expression sluice can run{hint}: {e}")
        })
}

/// Expands a `rewrite-target` template: `$0`..`$9` become the captures (empty when a group did
/// not take part), everything else is copied.
pub fn expand(template: &str, caps: &regex::Captures<'_>, out: &mut String) {
    let mut rest = template;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.as_bytes().first() {
            Some(d @ b'0'..=b'9') => {
                if let Some(m) = caps.get(usize::from(d - b'0')) {
                    out.push_str(m.as_str());
                }
                rest = &after[1..];
            }
            _ => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        let p = parse_path(Some("/foo/"), "Prefix").unwrap();
        assert_eq!(p.path, "/foo");
        let p = parse_path(Some("/"), "Prefix").unwrap();
        assert_eq!(p.path, "");
        let p = parse_path(None, "ImplementationSpecific").unwrap();
        assert_eq!((p.kind, p.path.as_str()), (PathKind::Prefix, ""));
        let p = parse_path(Some("/foo/"), "Exact").unwrap();
        assert_eq!(p.path, "/foo/");
        assert!(matches!(
            parse_path(Some("foo"), "Prefix"),
            Err(PathError::NotAbsolute(_))
        ));
        assert!(matches!(
            parse_path(Some("/"), "Regex"),
            Err(PathError::UnknownType(_))
        ));
    }
}
