//! Gateway API hostnames: a listener's and a route's, their intersection, and which requests
//! they match. Unlike an Ingress wildcard (one label), a Gateway API wildcard `*.example.com`
//! matches any number of labels in front of `example.com`, never `example.com` itself.

/// A hostname of a listener or a route, lower case.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hostname {
    /// No hostname: every request host.
    Any,
    /// `*.example.com`, stored as the suffix with its dot: `.example.com`.
    Wildcard(String),
    /// A full host name.
    Exact(String),
}

impl Hostname {
    /// Reads a hostname field (`None` or empty: [`Hostname::Any`]). The CRD's pattern has
    /// already checked the syntax; this only lower-cases and splits off the wildcard.
    pub fn parse(raw: Option<&str>) -> Self {
        match raw.map(str::trim).filter(|s| !s.is_empty()) {
            None => Self::Any,
            Some(h) => {
                let h = h.to_ascii_lowercase();
                match h.strip_prefix('*') {
                    Some(suffix) if suffix.starts_with('.') => Self::Wildcard(suffix.to_string()),
                    _ => Self::Exact(h),
                }
            }
        }
    }

    /// Whether a request for `host` (normalized: lower case, no port) is covered.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(h) => h == host,
            Self::Wildcard(suffix) => host.len() > suffix.len() && host.ends_with(suffix.as_str()),
        }
    }

    /// The hostnames both cover, as the most specific of the two, or `None` when they share
    /// none (the spec's "hostname intersection" of a listener and a route).
    pub fn intersect(&self, other: &Self) -> Option<Self> {
        match (self, other) {
            (Self::Any, o) | (o, Self::Any) => Some(o.clone()),
            (Self::Exact(a), Self::Exact(b)) => (a == b).then(|| self.clone()),
            (Self::Exact(e), w @ Self::Wildcard(_)) | (w @ Self::Wildcard(_), Self::Exact(e)) => {
                w.matches(e).then(|| Self::Exact(e.clone()))
            }
            (Self::Wildcard(a), Self::Wildcard(b)) => {
                if a.ends_with(b.as_str()) {
                    Some(self.clone())
                } else if b.ends_with(a.as_str()) {
                    Some(other.clone())
                } else {
                    None
                }
            }
        }
    }

    /// Orders hostnames most specific first: exact names, then wildcards by suffix length
    /// (longest first), then no hostname. Used for listeners sharing a port and for the host
    /// buckets of a listener (the spec gives precedence to the longest matching hostname).
    pub fn specificity(&self) -> (u8, std::cmp::Reverse<usize>) {
        match self {
            Self::Exact(h) => (0, std::cmp::Reverse(h.len())),
            Self::Wildcard(s) => (1, std::cmp::Reverse(s.len())),
            Self::Any => (2, std::cmp::Reverse(0)),
        }
    }
}

impl std::fmt::Display for Hostname {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Wildcard(s) => write!(f, "*{s}"),
            Self::Exact(h) => f.write_str(h),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Hostname as H;

    fn h(s: &str) -> H {
        H::parse(Some(s))
    }

    #[test]
    fn wildcards_match_any_number_of_labels_but_not_the_bare_suffix() {
        assert!(h("*.example.com").matches("a.example.com"));
        assert!(h("*.example.com").matches("a.b.example.com"));
        assert!(!h("*.example.com").matches("example.com"));
        assert!(!h("*.example.com").matches("aexample.com"));
        assert!(H::parse(None).matches("anything"));
        assert!(h("Foo.COM").matches("foo.com"));
    }

    #[test]
    fn intersection_keeps_the_more_specific_name() {
        assert_eq!(
            h("*.bar.com").intersect(&h("foo.bar.com")),
            Some(h("foo.bar.com"))
        );
        assert_eq!(
            h("foo.bar.com").intersect(&h("*.bar.com")),
            Some(h("foo.bar.com"))
        );
        assert_eq!(
            h("*.bar.com").intersect(&h("*.foo.bar.com")),
            Some(h("*.foo.bar.com"))
        );
        assert_eq!(h("*.bar.com").intersect(&h("bar.com")), None);
        assert_eq!(h("a.com").intersect(&h("b.com")), None);
        assert_eq!(H::Any.intersect(&h("*.x.com")), Some(h("*.x.com")));
        assert_eq!(h("*.foo.com").intersect(&h("*.bar.com")), None);
    }

    #[test]
    fn specificity_orders_exact_then_longer_wildcards_then_any() {
        let mut v = vec![H::Any, h("*.com"), h("a.b.com"), h("*.b.com")];
        v.sort_by_key(H::specificity);
        assert_eq!(v, vec![h("a.b.com"), h("*.b.com"), h("*.com"), H::Any]);
    }
}
