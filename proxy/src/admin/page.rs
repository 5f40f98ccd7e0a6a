//! The operator's page: one HTML file, a stylesheet and a script, compiled into the binary (no
//! build step, no CDN, nothing fetched from elsewhere). The script polls the JSON API and draws
//! with DOM text nodes only, so a hostile host, path or annotation value in an Ingress stays
//! text; the Content-Security-Policy forbids inline script, other origins and framing, so even
//! a bug there cannot run what an Ingress author wrote.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// What the page may load: its own script, style and API, nothing inline, nothing framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether a path is the page or one of its files.
pub(super) fn is_page(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

/// The page's files; `None` for an unknown `/ui/` path.
pub(super) fn asset(path: &str) -> Option<Response<Full<Bytes>>> {
    let (body, ct) = match path {
        "/" => (INDEX, "text/html; charset=utf-8"),
        "/ui/app.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "/ui/app.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return None,
    };
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(r)
}

/// Whether a `Host` header names this machine as a browser reaching loopback would: an IP
/// address (any: the peer check already limits who connects) or `localhost`/`*.localhost`,
/// with any port. No header (HTTP/1.0 tools) passes: browsers always send one.
pub(super) fn host_is_local(host: Option<&HeaderValue>) -> bool {
    let Some(h) = host else {
        return true;
    };
    let Ok(h) = h.to_str() else {
        return false;
    };
    let name = if let Some(rest) = h.strip_prefix('[') {
        // `[v6]` or `[v6]:port`.
        return rest.split_once(']').is_some_and(|(ip, port)| {
            ip.parse::<std::net::Ipv6Addr>().is_ok()
                && (port.is_empty() || port.strip_prefix(':').is_some_and(is_port))
        });
    } else {
        match h.rsplit_once(':') {
            Some((n, port)) if is_port(port) => n,
            Some(_) => return false,
            None => h,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_and_localhost_are_local_hosts() {
        for ok in [
            "127.0.0.1:10254",
            "127.0.0.1",
            "[::1]:10254",
            "[::1]",
            "localhost:10254",
            "LOCALHOST",
            "app.localhost:1",
            "10.0.0.7:10254",
        ] {
            assert!(host_is_local(Some(&HeaderValue::from_static(ok))), "{ok}");
        }
        for bad in [
            "evil.example:10254",
            "evil.example",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[::1",
            "[nonsense]:80",
            "127.0.0.1:port",
        ] {
            assert!(
                !host_is_local(Some(&HeaderValue::from_static(bad))),
                "{bad}"
            );
        }
        assert!(host_is_local(None));
    }

    #[test]
    fn the_page_is_locked_down() {
        let r = asset("/").unwrap();
        let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe"));
        assert_eq!(r.headers()[header::X_FRAME_OPTIONS], "DENY");
        assert!(asset("/ui/nope.js").is_none());
        // No inline script or style: the policy would block it.
        assert!(!INDEX.contains("<script>") && !INDEX.contains("style="));
        // The script draws text, never markup.
        assert!(!SCRIPT.contains("innerHTML") && !SCRIPT.contains("insertAdjacentHTML"));
    }
}
