//! The request path sluice routes on and forwards: normalised the way nginx normalises the URI it
//! matches locations against, so that `/public/../admin` or `/public/%2e%2e/admin` cannot be
//! routed by a `/public` rule and then served as `/admin` by a backend that normalises.
//!
//! Steps, in order:
//! 1. percent-encoded *unreserved* characters (`A–Z a–z 0–9 - . _ ~`) are decoded (RFC 3986
//!    §6.2.2.2: they mean the same decoded); every other escape stays as it is, upper-cased —
//!    in particular `%2F` stays encoded in the path forwarded;
//! 2. runs of `/` are merged into one (nginx `merge_slashes on`);
//! 3. `.` and `..` segments are removed (RFC 3986 §5.2.4); a `..` that would climb above `/`
//!    is an error (nginx answers 400).
//!
//! That is the path forwarded to the pod ([`normalize`]). Routing and every access decision
//! (authentication, source ranges, client certificates, limits) use its *route view*
//! ([`route_view`]): the same path with each encoded separator (`%2F`, `%5C`, and a bare `\`)
//! read as `/`, and each segment's `;` parameters dropped — what a backend that decodes `%2F`
//! (Python's `http.server`, WSGI, older Go muxes), treats `\` as a separator, or strips
//! servlet path parameters (Tomcat, Jetty, Spring) makes of it. nginx, too, matches locations
//! on the decoded URI. So `/admin%2Fsecret.txt`, `/admin;x/secret.txt` and `/admin\secret.txt`
//! are routed, and checked, as `/admin/secret.txt`, while the pod still receives the escapes
//! as the client sent them (an API that names `group%2Fproject` keeps working). One rule keeps
//! the two views equivalent: a path in which reading the separators, or dropping parameters,
//! would make an empty, `.` or `..` segment (`/public/..%2Fadmin`, `/admin/..;/x`) is refused
//! with 400 ([`PathRejected::AmbiguousSeparator`]), so the path the pod receives, decoded, is
//! exactly the path sluice decided on. And the general handler refuses (400) a path whose route
//! view and literal reading (separators and parameters as data, as a backend that decodes
//! nothing reads it) are different routes: no one reading is every backend's, so the route a
//! request takes must not depend on which one its pod uses.
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
    /// A `%` that does not start an escape of two hex digits (nginx answers 400 too): left in,
    /// it could join the characters decoded after it into an escape no rule read.
    #[error("the path has a % that is not an escape")]
    BadEscape,
    /// An encoded separator (`%2F`, `%5C`, `\`) or a `;` parameter would make an empty, `.`
    /// or `..` segment: a backend that decodes it could serve another path than the one routed.
    #[error("an encoded separator or a ; parameter makes an empty or dot segment")]
    AmbiguousSeparator,
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

/// Whether `path` is already normal and its own route view: no escapes, no `;`, no `\`, no
/// `//`, no `.` or `..` segment.
fn is_plain(path: &str) -> bool {
    let b = path.as_bytes();
    if b.iter().any(|c| matches!(c, b'%' | b';' | b'\\')) {
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
        if b[i] == b'%' {
            let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(PathRejected::BadEscape);
            };
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
    let s = String::from_utf8(s).map_err(|_| PathRejected::NotAbsolute)?;
    if pieces(&s).any(|(piece, last)| matches!(piece, "." | "..") || (piece.is_empty() && !last)) {
        return Err(PathRejected::AmbiguousSeparator);
    }
    // A segment with both a `;` parameter and an encoded separator reads one way to a servlet
    // container (parameter dropped first) and another to a backend that splits first.
    if s.split('/')
        .any(|seg| seg.contains(';') && split_separators(seg).nth(1).is_some())
    {
        return Err(PathRejected::AmbiguousSeparator);
    }
    Ok(Cow::Owned(s))
}

/// Splits a segment at its encoded separators (`%2F`, `%5C` as [`normalize`] writes them, in
/// upper case, and a bare `\`).
fn split_separators(seg: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(seg);
    std::iter::from_fn(move || {
        let r = rest?;
        let b = r.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' {
                rest = Some(&r[i + 1..]);
                return Some(&r[..i]);
            }
            if b[i] == b'%' && matches!(b.get(i + 1..i + 3), Some(b"2F" | b"5C")) {
                rest = Some(&r[i + 3..]);
                return Some(&r[..i]);
            }
            i += 1;
        }
        rest = None;
        Some(r)
    })
}

/// The route view's segments of a normal path, each with whether it is the path's last: each
/// segment split at its encoded separators first, then each piece without its `;` parameters
/// (so a parameter cannot hide a separator: `/public;%2F..%2Fadmin` has a `..` piece).
fn pieces(normal: &str) -> impl Iterator<Item = (&str, bool)> {
    let mut segs = normal.split('/').skip(1).peekable();
    let mut current: Option<std::iter::Peekable<Box<dyn Iterator<Item = &str> + '_>>> = None;
    std::iter::from_fn(move || {
        loop {
            if let Some(it) = current.as_mut()
                && let Some(p) = it.next()
            {
                let last = it.peek().is_none() && segs.peek().is_none();
                let p = p.split(';').next().unwrap_or_default();
                return Some((p, last));
            }
            let seg = segs.next()?;
            let it: Box<dyn Iterator<Item = &str>> = Box::new(split_separators(seg));
            current = Some(it.peekable());
        }
    })
}

/// The path routing and every access decision use (see the module docs) for a path that
/// [`normalize`] returned: borrowed when it has no encoded separator and no `;`.
pub fn route_view(normal: &str) -> Cow<'_, str> {
    if !normal
        .as_bytes()
        .iter()
        .any(|c| matches!(c, b'%' | b';' | b'\\'))
    {
        return Cow::Borrowed(normal);
    }
    let mut out = String::with_capacity(normal.len());
    for (piece, _) in pieces(normal) {
        out.push('/');
        out.push_str(piece);
    }
    if out.is_empty() {
        out.push('/');
    }
    if out == normal {
        return Cow::Borrowed(normal);
    }
    Cow::Owned(out)
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
        for bad in ["/a/%", "/a/%zz", "/a/%4", "/a%2%66b", "/a%%35%63b", "/%"] {
            assert_eq!(normalize(bad), Err(PathRejected::BadEscape), "{bad}");
        }
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

    #[test]
    fn the_route_view_reads_encoded_separators_and_drops_parameters() {
        let view = |i: &str| normalize(i).map(|n| route_view(&n).into_owned());
        let ok = |i: &str, o: &str| assert_eq!(view(i).as_deref(), Ok(o), "{i}");
        ok("/admin%2Fsecret.txt", "/admin/secret.txt");
        ok("/admin%2fsecret.txt", "/admin/secret.txt");
        ok("/admin%5Csecret.txt", "/admin/secret.txt");
        ok("/admin\\secret.txt", "/admin/secret.txt");
        ok("/admin;jsessionid=1/secret.txt", "/admin/secret.txt");
        ok("/admin;a=b;c", "/admin");
        ok("/;jsessionid=1", "/");
        ok("/a%2F", "/a/");
        ok("/a%20b/c", "/a%20b/c");
        ok(
            "/api/v4/projects/group%2Fproject",
            "/api/v4/projects/group/project",
        );
        // The forwarded path keeps what the client encoded.
        assert_eq!(
            normalize("/api/group%2fproject").as_deref(),
            Ok("/api/group%2Fproject")
        );
        for bad in [
            "/public/..%2Fadmin/secret.txt",
            "/public/..%2fadmin",
            "/public%2F..%2Fadmin",
            "/admin/..;/secret",
            "/public/..\\admin",
            "/a%2F%2Fb",
            "/a%2F.%2Fb",
            "/%2F/admin",
            "/a/;x/b",
            "/public%5C..%5Cadmin",
            "/public;%2F..%2Fadmin",
            "/public;x\\..\\admin",
            "/public;%5C..%5Cadmin/x",
            "/public;%2Fadmin",
            "/a%2Fb;x",
        ] {
            assert_eq!(
                normalize(bad),
                Err(PathRejected::AmbiguousSeparator),
                "{bad}"
            );
        }
        assert!(matches!(route_view("/a/b"), Cow::Borrowed(_)));
        assert!(matches!(route_view("/a%20b"), Cow::Borrowed(_)));
    }
}
