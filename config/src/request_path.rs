//! The request path sluice routes on and forwards: normalised the way nginx normalises the URI it
//! matches locations against, so that `/public/../admin` or `/public/%2e%2e/admin` cannot be
//! routed by a `/public` rule and then served as `/admin` by a backend that normalises.
//!
//! Steps, in order:
//! 1. percent-encoded *unreserved* characters (`A–Z a–z 0–9 - . _ ~`) are decoded (RFC 3986
//!    §6.2.2.2: they mean the same decoded); every other escape stays as it is, upper-cased —
//!    in particular `%2F` stays encoded, so an encoded slash never becomes a path separator;
//! 2. runs of `/` are merged into one (nginx `merge_slashes on`);
//! 3. `.` and `..` segments are removed (RFC 3986 §5.2.4); a `..` that would climb above `/`
//!    is an error (nginx answers 400).
//!
//! The common path needs none of this and is returned borrowed, with no allocation.

use std::borrow::Cow;

/// A path that climbs above the root, or is not origin-form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathRejected {
    /// `..` segments climb above `/`.
    #[error("the path climbs above the root")]
    AboveRoot,
    /// The path does not start with `/`.
    #[error("the path does not start with /")]
    NotAbsolute,
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether `path` is already normal: no escapes, no `//`, no `.` or `..` segment.
fn is_plain(path: &str) -> bool {
    let b = path.as_bytes();
    if b.contains(&b'%') {
        return false;
    }
    // Every segment boundary: a `/` followed by `/`, or by `.`/`..` ending the segment.
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' {
            let rest = &b[i + 1..];
            if rest.first() == Some(&b'/')
                || rest == b"."
                || rest.starts_with(b"./")
                || rest == b".."
                || rest.starts_with(b"../")
            {
                return false;
            }
        }
        i += 1;
    }
    true
}

/// Normalises a request path (no query). See the module docs.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathRejected> {
    if !path.starts_with('/') {
        return Err(PathRejected::NotAbsolute);
    }
    if is_plain(path) {
        return Ok(Cow::Borrowed(path));
    }
    // 1. Decode unreserved escapes; upper-case the rest.
    let b = path.as_bytes();
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            let c = h * 16 + l;
            if unreserved(c) {
                decoded.push(c);
            } else {
                decoded.push(b'%');
                decoded.push(b[i + 1].to_ascii_uppercase());
                decoded.push(b[i + 2].to_ascii_uppercase());
            }
            i += 3;
            continue;
        }
        decoded.push(b[i]);
        i += 1;
    }
    // 2 and 3. Merge slashes and resolve dot segments, segment by segment.
    let mut out: Vec<&[u8]> = Vec::new();
    let trailing = decoded.ends_with(b"/") || decoded.ends_with(b"/.") || decoded.ends_with(b"/..");
    for seg in decoded.split(|c| *c == b'/').skip(1) {
        match seg {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err(PathRejected::AboveRoot);
                }
            }
            s => out.push(s),
        }
    }
    let mut s = Vec::with_capacity(decoded.len());
    for seg in &out {
        s.push(b'/');
        s.extend_from_slice(seg);
    }
    if trailing || out.is_empty() {
        s.push(b'/');
    }
    // Only ASCII bytes were decoded, and only whole escapes: the result is valid UTF-8 when
    // the input was.
    String::from_utf8(s)
        .map(Cow::Owned)
        .map_err(|_| PathRejected::NotAbsolute)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let ok = |i: &str, o: &str| assert_eq!(normalize(i).as_deref(), Ok(o), "{i}");
        ok("/", "/");
        ok("/a/b", "/a/b");
        ok("/a/b/", "/a/b/");
        ok("/a//b", "/a/b");
        ok("//a///b//", "/a/b/");
        ok("/a/./b", "/a/b");
        ok("/a/.", "/a/");
        ok("/a/b/..", "/a/");
        ok("/public/../admin", "/admin");
        ok("/public/%2e%2e/admin", "/admin");
        ok("/public/%2E%2e/admin", "/admin");
        ok("/public/.%2E/admin", "/admin");
        ok("/%7Euser/%41bc", "/~user/Abc");
        ok("/a%2fb", "/a%2Fb");
        ok("/a%2Fb/..", "/");
        ok("/a%20b", "/a%20b");
        ok("/..a/.b/...", "/..a/.b/...");
        ok("/a/%", "/a/%");
        ok("/a/%zz", "/a/%zz");
        ok("/é/../x", "/x");
        assert!(matches!(normalize("/public/a/b"), Ok(Cow::Borrowed(_))));
        for bad in ["/..", "/../a", "/a/../..", "/%2e%2e/x", "//..//a"] {
            assert_eq!(normalize(bad), Err(PathRejected::AboveRoot), "{bad}");
        }
        assert_eq!(normalize("a/b"), Err(PathRejected::NotAbsolute));
    }

    #[test]
    fn normal_paths_stay_put_and_normalising_twice_changes_nothing() {
        let samples = [
            "/a/b",
            "/a//b/",
            "/x/./y/../z",
            "/%7e/%2f/%41",
            "/a/b/c/../../d",
            "/.../x",
        ];
        for s in samples {
            let once = normalize(s).map(Cow::into_owned);
            let twice = once.as_deref().map(|o| normalize(o).map(Cow::into_owned));
            assert_eq!(twice, once.as_ref().map(|o| Ok(o.clone())), "{s}");
        }
    }
}
