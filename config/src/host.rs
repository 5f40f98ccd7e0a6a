//! Host names: validation of Ingress rule hosts and allocation-free normalization of request hosts
//! (port stripped, lower-cased, trailing dot removed).

use std::fmt;

/// Which request hosts a virtual host serves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostMatch {
    /// One exact (lower-case) host name.
    Exact(String),
    /// `*.suffix`: exactly one DNS label in front of the stored suffix (stored with its leading
    /// dot, e.g. `.example.com`).
    Wildcard(String),
    /// Rules without a host: every request host.
    Any,
}

impl fmt::Display for HostMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostMatch::Exact(h) => f.write_str(h),
            HostMatch::Wildcard(s) => write!(f, "*{s}"),
            HostMatch::Any => f.write_str("*"),
        }
    }
}

/// Longest host name we normalize on the stack (DNS allows 253 characters).
pub const MAX_HOST_LEN: usize = 255;

/// A stack buffer for [`normalize_request_host`], so the hot path does not allocate.
#[derive(Debug)]
pub struct HostBuf([u8; MAX_HOST_LEN]);

impl Default for HostBuf {
    fn default() -> Self {
        Self([0; MAX_HOST_LEN])
    }
}

/// Strips the port from a `Host` header / `:authority` value (`example.com:8080`, `[::1]:80`).
pub fn strip_port(raw: &str) -> &str {
    if let Some(rest) = raw.strip_prefix('[') {
        // IPv6 literal: keep the brackets, drop anything after `]`.
        return match rest.find(']') {
            Some(end) => &raw[..end + 2],
            None => raw,
        };
    }
    match raw.rsplit_once(':') {
        // A second colon means an unbracketed IPv6 address: no port to strip.
        Some((host, port))
            if !host.contains(':')
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            host
        }
        Some((host, "")) if !host.contains(':') => host,
        _ => raw,
    }
}

/// Normalizes a request host for matching: port stripped, one trailing dot removed, ASCII
/// lower-cased. Returns `None` when the host is longer than [`MAX_HOST_LEN`] (such a request can
/// still match host-less rules). Borrows `raw` when it is already normalized, otherwise writes the
/// lower-cased copy into `buf`; never allocates.
pub fn normalize_request_host<'a>(raw: &'a str, buf: &'a mut HostBuf) -> Option<&'a str> {
    let host = strip_port(raw.trim());
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.len() > MAX_HOST_LEN {
        return None;
    }
    if !host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some(host);
    }
    let out = &mut buf.0[..host.len()];
    out.copy_from_slice(host.as_bytes());
    out.make_ascii_lowercase();
    // Lower-casing ASCII bytes keeps valid UTF-8 valid.
    std::str::from_utf8(out).ok()
}

/// Whether a request's `Host` (or `:authority`) is a host a request may name: a reg-name of
/// letters, digits, `-`, `.`, `_` and `~`, or an IPv6 literal in brackets, with an optional
/// numeric port. Anything else — `/`, `@`, `\\`, spaces, control bytes — is refused (400):
/// such a value could be routed one way and read another way by a backend or reflected into a
/// redirect's `Location`.
pub fn valid_request_host(raw: &str) -> bool {
    let b = raw.as_bytes();
    let (host, port) = if b.first() == Some(&b'[') {
        let Some(end) = raw.find(']') else {
            return false;
        };
        let inner = &raw[1..end];
        if inner.is_empty()
            || !inner
                .bytes()
                .all(|c| c.is_ascii_hexdigit() || c == b':' || c == b'.')
        {
            return false;
        }
        (&raw[..=end], &raw[end + 1..])
    } else {
        match raw.rfind(':') {
            Some(i) => (&raw[..i], &raw[i..]),
            None => (raw, ""),
        }
    };
    let port_ok = port.is_empty()
        || (port.len() <= 6
            && port.starts_with(':')
            && port.len() > 1
            && port[1..].bytes().all(|c| c.is_ascii_digit()));
    let host_ok = host.starts_with('[')
        || (!host.is_empty()
            && host
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')));
    port_ok && host_ok
}

/// Why an Ingress rule host was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Empty label, bad character, or too long.
    #[error("{0:?} is not a valid DNS name (RFC 1123 labels of a-z, 0-9 and '-')")]
    Invalid(String),
    /// A `*` anywhere but as the whole first label.
    #[error("{0:?}: a wildcard must be the whole first label, as in \"*.example.com\"")]
    BadWildcard(String),
}

fn valid_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

/// Parses an Ingress rule host: empty means every host, `*.x.y` is a one-label wildcard,
/// anything else must be a DNS name. Upper case is accepted and lower-cased (matching is
/// case-insensitive anyway).
pub fn parse_rule_host(raw: &str) -> Result<HostMatch, HostError> {
    if raw.is_empty() {
        return Ok(HostMatch::Any);
    }
    let lower = raw.to_ascii_lowercase();
    let lower = lower.strip_suffix('.').unwrap_or(&lower).to_string();
    if lower.len() > 253 {
        return Err(HostError::Invalid(raw.to_string()));
    }
    if let Some(suffix) = lower.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(HostError::BadWildcard(raw.to_string()));
        }
        if suffix.is_empty() || !suffix.split('.').all(valid_label) {
            return Err(HostError::Invalid(raw.to_string()));
        }
        return Ok(HostMatch::Wildcard(format!(".{suffix}")));
    }
    if lower.contains('*') {
        return Err(HostError::BadWildcard(raw.to_string()));
    }
    if !lower.split('.').all(valid_label) {
        return Err(HostError::Invalid(raw.to_string()));
    }
    Ok(HostMatch::Exact(lower))
}

/// Whether a normalized request host is covered by a `HostMatch` (reference semantics; the
/// indexed lookup in [`crate::matcher`] must agree with this).
pub fn host_matches(rule: &HostMatch, host: &str) -> bool {
    match rule {
        HostMatch::Any => true,
        HostMatch::Exact(h) => h == host,
        HostMatch::Wildcard(suffix) => host
            .strip_suffix(suffix.as_str())
            .is_some_and(|label| !label.is_empty() && !label.contains('.')),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_hosts_that_may_be_routed() {
        for ok in [
            "example.com",
            "Example.COM:8080",
            "a-b_c~d.test",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[2001:db8::1]:443",
            "localhost.",
        ] {
            assert!(valid_request_host(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.com/x",
            "a@evil.com",
            "a b",
            "a\\b",
            "host:",
            "host:80x",
            "host:1234567",
            "[::1",
            "[zz]",
            "[::1]x",
            "a\tb",
            "h\u{e9}st",
        ] {
            assert!(!valid_request_host(bad), "{bad:?}");
        }
    }

    #[test]
    fn strips_ports() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("example.com"), "example.com");
        assert_eq!(strip_port("example.com:"), "example.com");
        assert_eq!(strip_port("[::1]:443"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port("::1"), "::1");
        assert_eq!(strip_port("10.0.0.1:80"), "10.0.0.1");
    }

    #[test]
    fn normalizes_without_allocating_when_already_lower() {
        let mut buf = HostBuf::default();
        assert_eq!(
            normalize_request_host("Foo.Example.COM:8443", &mut buf),
            Some("foo.example.com")
        );
        let mut buf = HostBuf::default();
        assert_eq!(
            normalize_request_host("foo.bar.", &mut buf),
            Some("foo.bar")
        );
        let long = "a".repeat(300);
        let mut buf = HostBuf::default();
        assert_eq!(normalize_request_host(&long, &mut buf), None);
    }

    /// The wildcard-host table of the Kubernetes Ingress documentation.
    #[test]
    fn wildcard_host_table() {
        let rule = parse_rule_host("*.foo.com").unwrap();
        assert!(
            host_matches(&rule, "bar.foo.com"),
            "bar.foo.com matches *.foo.com"
        );
        assert!(
            !host_matches(&rule, "baz.bar.foo.com"),
            "more than one label"
        );
        assert!(!host_matches(&rule, "foo.com"), "no label at all");
        let exact = parse_rule_host("foo.bar.com").unwrap();
        assert!(host_matches(&exact, "foo.bar.com"));
        assert!(!host_matches(&exact, "bar.foo.com"));
    }

    #[test]
    fn rule_hosts_are_validated() {
        assert_eq!(parse_rule_host("").unwrap(), HostMatch::Any);
        assert_eq!(
            parse_rule_host("Foo.COM").unwrap(),
            HostMatch::Exact("foo.com".into())
        );
        assert!(matches!(
            parse_rule_host("foo.*.com"),
            Err(HostError::BadWildcard(_))
        ));
        assert!(matches!(
            parse_rule_host("*foo.com"),
            Err(HostError::BadWildcard(_))
        ));
        assert!(matches!(
            parse_rule_host("foo bar.com"),
            Err(HostError::Invalid(_))
        ));
        assert!(matches!(
            parse_rule_host("foo..com"),
            Err(HostError::Invalid(_))
        ));
        assert!(parse_rule_host("*.").is_err());
    }
}
