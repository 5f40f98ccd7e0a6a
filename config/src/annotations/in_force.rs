//! What the operator's page shows of one Ingress's annotations: each one sluice reads, its
//! value as far as it is safe to show, and the verdict `sluice check` gives it. Values are
//! shown because "which rewrite-target is in force" is the question an operator asks; but an
//! annotation may carry a URL with credentials (`auth-url: https://user:pass@auth/?token=…`),
//! so URLs lose their user information and query, and long values are cut.

use std::collections::BTreeMap;

use super::review::review;
pub use crate::model::AnnotationNote;

/// Longest value shown, in characters; longer ones end in `…`.
pub const MAX_SHOWN_VALUE: usize = 160;

/// The notes for every annotation sluice reads (either prefix), sorted by key.
pub fn notes(a: &BTreeMap<String, String>) -> Vec<AnnotationNote> {
    review(a)
        .into_iter()
        .map(|f| AnnotationNote {
            value: a
                .get(&f.annotation)
                .map(|v| shown_value(v))
                .unwrap_or_default(),
            verdict: f.verdict.word(),
            why: redact_urls(f.verdict.why()),
            name: f.annotation,
        })
        .collect()
}

/// A value safe to show: [`redact_urls`], cut at [`MAX_SHOWN_VALUE`] characters.
pub fn shown_value(v: &str) -> String {
    let out = redact_urls(v);
    if out.chars().count() > MAX_SHOWN_VALUE {
        let cut: String = out.chars().take(MAX_SHOWN_VALUE).collect();
        return cut + "…";
    }
    out
}

/// Text safe to show, log or write to an event: every `scheme://user:pass@host/path?query#frag`
/// in it loses the `user:pass@`, the query and the fragment (where tokens live). Translation
/// passes every problem message through it, so an annotation's credential never reaches the
/// status API, the page, an Event or the log.
pub fn redact_urls(v: &str) -> String {
    let mut out = String::with_capacity(v.len().min(MAX_SHOWN_VALUE + 4));
    let mut rest = v;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The URL runs to the next whitespace, comma or quote.
        let end = tail
            .find(|c: char| c.is_whitespace() || c == ',' || c == '"' || c == '\'')
            .unwrap_or(tail.len());
        let (url, after) = tail.split_at(end);
        let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
        let (authority, path) = url.split_at(authority_end);
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if host.len() != authority.len() {
            out.push_str("…@");
        }
        out.push_str(host);
        let path_end = path.find(['?', '#']).unwrap_or(path.len());
        out.push_str(&path[..path_end]);
        if path_end < path.len() {
            out.push_str("?…");
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_credentials_and_queries() {
        assert_eq!(
            shown_value("https://user:secret@auth.example/check?token=abc#x"),
            "https://…@auth.example/check?…"
        );
        assert_eq!(
            shown_value("http://auth.svc/verify"),
            "http://auth.svc/verify"
        );
        assert_eq!(
            shown_value("a http://u:p@h/?q=1, https://h2?k=v"),
            "a http://…@h/?…, https://h2?…"
        );
        assert_eq!(shown_value("/$1"), "/$1");
    }

    #[test]
    fn messages_that_quote_a_url_lose_its_secrets() {
        let m = redact_urls(
            r#"annotation auth-url: "https://auth.example/p?token=s3cret": the path must be visible ASCII"#,
        );
        assert_eq!(
            m,
            r#"annotation auth-url: "https://auth.example/p?…": the path must be visible ASCII"#
        );
    }

    #[test]
    fn long_values_are_cut() {
        let long = "x".repeat(1000);
        let shown = shown_value(&long);
        assert_eq!(shown.chars().count(), MAX_SHOWN_VALUE + 1);
        assert!(shown.ends_with('…'));
    }

    #[test]
    fn every_annotation_sluice_reads_gets_a_note_with_its_verdict() {
        let a: BTreeMap<String, String> = [
            ("nginx.ingress.kubernetes.io/rewrite-target", "/$1"),
            (
                "nginx.ingress.kubernetes.io/configuration-snippet",
                "more_set_headers x;",
            ),
            (
                "nginx.ingress.kubernetes.io/auth-url",
                "https://u:p@auth/?t=1",
            ),
            ("example.com/unrelated", "ignored"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let n = notes(&a);
        let by: BTreeMap<&str, &AnnotationNote> = n.iter().map(|n| (n.name.as_str(), n)).collect();
        assert_eq!(n.len(), 3, "{n:?}");
        assert_eq!(
            by["nginx.ingress.kubernetes.io/rewrite-target"].verdict,
            "honoured"
        );
        assert_eq!(
            by["nginx.ingress.kubernetes.io/rewrite-target"].value,
            "/$1"
        );
        assert_eq!(
            by["nginx.ingress.kubernetes.io/configuration-snippet"].verdict,
            "refused"
        );
        assert_eq!(
            by["nginx.ingress.kubernetes.io/auth-url"].value,
            "https://…@auth/?…"
        );
    }
}
