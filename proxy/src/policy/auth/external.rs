//! External authentication (`auth-url`), compiled; the handler (`handler::auth`) sends the
//! subrequest and reads the answer. As nginx's `auth_request` and ingress-nginx do it: a
//! body-less subrequest with the original method (or `auth-method`) and headers, plus
//! `X-Original-URL`, `X-Original-Method` and `X-Auth-Request-Redirect`, goes through sluice's
//! own pool for the auth Service, under the route's request timeout. A 2xx lets the request
//! through with the `auth-response-headers` copied onto it; 401 and 403 are answered (a 401 is
//! redirected to `auth-signin` when set); anything else, an unreachable pool or the timeout, is
//! a 500.

use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode};
use sluice_config::route_policy::{AuthTarget, ExternalAuth};

use crate::upstream::body::ReqBody;
use crate::upstream::cluster::Cluster;
use crate::wire::hop;

/// A route's compiled external authentication.
#[derive(Debug)]
pub struct External {
    /// Who answers.
    pub(crate) via: Via,
    path: http::uri::PathAndQuery,
    method: Option<Method>,
    /// `auth-signin`.
    pub(crate) signin: Option<String>,
    param: String,
    /// `auth-response-headers`.
    pub(crate) response_headers: Vec<HeaderName>,
    request_redirect: Option<HeaderValue>,
    /// `auth-always-set-cookie`.
    pub(crate) always_set_cookie: bool,
    /// `auth-cache-key`: remembered answers.
    pub(crate) cache: Option<super::cache::AnswerCache>,
    /// The operator allows the URL's host outside sluice's routes (`--auth-url-allow`).
    pub(crate) remote: Option<sluice_config::route_policy::Remote>,
    /// Calls to that host in flight at once, at most [`REMOTE_AT_ONCE`]: each is a fresh
    /// connection, so a flood of requests must not become a flood of outbound connections.
    pub(crate) remote_calls: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Calls to an outside auth service in flight at once, per route; past it, 503 at once.
pub const REMOTE_AT_ONCE: usize = 64;

/// Who answers a route's auth subrequests.
#[derive(Debug)]
pub enum Via {
    /// The auth Service's pool, and the `Host` the URL names.
    Pool(Arc<Cluster>, HeaderValue),
    /// Whatever sluice's routes send this host (`None`: the request's) and the path to.
    Routed(Option<String>),
}

/// What a 2xx from the auth service hands to the request and its answer.
#[derive(Debug, Default)]
pub struct Passed {
    /// `auth-response-headers` the auth service set.
    pub(crate) fields: Vec<(HeaderName, HeaderValue)>,
    /// Names in `auth-response-headers`: a client's own copies are removed.
    pub(crate) names: Vec<HeaderName>,
    /// The auth answer's `Set-Cookie` fields.
    pub(crate) cookies: Vec<HeaderValue>,
    /// `auth-always-set-cookie`.
    pub(crate) always_set_cookie: bool,
}

impl Passed {
    /// Sets the auth service's fields on the upstream request, after removing whatever the
    /// client sent under those names (nginx's `proxy_set_header` replaces them too).
    pub fn apply(&self, headers: &mut HeaderMap) {
        for n in &self.names {
            headers.remove(n);
        }
        for (n, v) in &self.fields {
            headers.append(n.clone(), v.clone());
        }
    }

    /// Adds the auth answer's cookies to the response: on 2xx/3xx answers as nginx's
    /// `add_header`, on every answer with `auth-always-set-cookie`.
    pub fn finish(&self, status: StatusCode, headers: &mut HeaderMap) {
        let listed = matches!(
            status.as_u16(),
            200 | 201 | 204 | 206 | 301 | 302 | 303 | 304 | 307 | 308
        );
        if self.always_set_cookie || listed {
            for c in &self.cookies {
                headers.append(header::SET_COOKIE, c.clone());
            }
        }
    }
}

/// Characters `ngx.escape_uri` keeps: RFC 3986 unreserved.
fn escape_uri(s: &str, out: &mut String) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

impl External {
    /// Compiles the auth settings (`pool`: the auth Service's, for a URL that names one);
    /// `None` when that pool does not exist or a value cannot be a header (the route then
    /// stays closed).
    pub fn compile(a: &ExternalAuth, pool: Option<Arc<Cluster>>) -> Option<Self> {
        let via = match &a.target {
            AuthTarget::Pool(_) => {
                let authority = a.url.strip_prefix("http://")?.split(['/', '?']).next()?;
                Via::Pool(pool?, HeaderValue::from_str(authority).ok()?)
            }
            AuthTarget::Routed(host) => Via::Routed(host.clone()),
        };
        Some(Self {
            via,
            path: a.path.parse().ok()?,
            method: match &a.options.method {
                Some(m) => Some(Method::from_bytes(m.as_bytes()).ok()?),
                None => None,
            },
            signin: a.options.signin.clone(),
            param: a.options.signin_redirect_param.clone(),
            response_headers: a
                .options
                .response_headers
                .iter()
                .map(|h| HeaderName::from_bytes(h.as_bytes()).ok())
                .collect::<Option<_>>()?,
            request_redirect: match &a.options.request_redirect {
                Some(r) => Some(HeaderValue::from_str(r).ok()?),
                None => None,
            },
            always_set_cookie: a.options.always_set_cookie,
            cache: a.options.cache.as_ref().map(super::cache::AnswerCache::new),
            remote: a.remote.clone(),
            remote_calls: std::sync::Arc::new(tokio::sync::Semaphore::new(REMOTE_AT_ONCE)),
        })
    }

    /// The path (without the query) the subrequest asks for: what a routed URL is looked up by.
    pub(crate) fn path(&self) -> &str {
        self.path.path()
    }

    /// The subrequest for `req` (which named `host`), sent with `Host: auth_host`.
    pub(crate) fn subrequest<B>(
        &self,
        req: &Request<B>,
        (scheme, host): (&str, &str),
        auth_host: HeaderValue,
    ) -> Request<ReqBody> {
        let mut sub = Request::new(ReqBody::empty());
        *sub.method_mut() = self.method.clone().unwrap_or_else(|| req.method().clone());
        *sub.uri_mut() = http::Uri::from(self.path.clone());
        let h = sub.headers_mut();
        h.clone_from(req.headers());
        hop::strip(h, false);
        h.remove(header::CONTENT_LENGTH);
        h.remove(header::TRANSFER_ENCODING);
        h.insert(header::HOST, auth_host);
        let uri = req.uri().path_and_query().map_or("/", |p| p.as_str());
        if let Ok(v) = HeaderValue::from_str(&format!("{scheme}://{host}{uri}")) {
            h.insert(HeaderName::from_static("x-original-url"), v);
        }
        if let Ok(v) = HeaderValue::from_str(req.method().as_str()) {
            h.insert(HeaderName::from_static("x-original-method"), v.clone());
            // Traefik-style auth services decide on these two: sluice's, never the client's
            // (whose own copies are replaced, as `X-Forwarded-Host` and `-Proto` are).
            h.insert(HeaderName::from_static("x-forwarded-method"), v);
        }
        match HeaderValue::from_str(uri) {
            Ok(v) => {
                h.insert(HeaderName::from_static("x-forwarded-uri"), v);
            }
            Err(_) => {
                h.remove("x-forwarded-uri");
            }
        }
        let redirect = self
            .request_redirect
            .clone()
            .or_else(|| HeaderValue::from_str(uri).ok());
        if let Some(v) = redirect {
            h.insert(HeaderName::from_static("x-auth-request-redirect"), v);
        }
        h.insert(
            HeaderName::from_static("x-sent-from"),
            HeaderValue::from_static("sluice"),
        );
        sub
    }

    /// `auth-signin` with its nginx variables filled in (`$host`, `$http_host`, `$scheme`,
    /// `$pass_access_scheme`, `$request_uri`, `$escaped_request_uri`), and the original URL in
    /// the redirect parameter as ingress-nginx's `buildAuthSignURL` adds it, unless the URL
    /// carries that parameter already.
    pub(crate) fn signin_location(
        &self,
        signin: &str,
        scheme: &str,
        host: &str,
        uri: &http::Uri,
    ) -> String {
        let request_uri = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut escaped = String::new();
        escape_uri(request_uri, &mut escaped);
        let mut out = String::with_capacity(signin.len() + 64);
        let mut rest = signin;
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            rest = &rest[i + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            match &rest[..end] {
                "host" | "http_host" => out.push_str(host),
                "scheme" | "pass_access_scheme" => out.push_str(scheme),
                "request_uri" => out.push_str(request_uri),
                "escaped_request_uri" => out.push_str(&escaped),
                other => {
                    out.push('$');
                    out.push_str(other);
                }
            }
            rest = &rest[end..];
        }
        out.push_str(rest);
        if signin.contains(&format!("{}=", self.param)) {
            return out;
        }
        out.push(if out.contains('?') { '&' } else { '?' });
        out.push_str(&self.param);
        out.push('=');
        out.push_str(scheme);
        out.push_str("://");
        out.push_str(host);
        out.push_str(&escaped);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(signin: &str, param: &str) -> External {
        let a = ExternalAuth {
            target: AuthTarget::Routed(None),
            url: "https://$host/oauth2/auth".into(),
            path: "/oauth2/auth".into(),
            options: sluice_config::route_policy::ExternalOptions {
                method: None,
                signin: Some(signin.into()),
                signin_redirect_param: param.into(),
                response_headers: Vec::new(),
                request_redirect: None,
                always_set_cookie: false,
                cache: None,
            },
            remote: None,
        };
        External::compile(&a, None).unwrap_or_else(|| panic!("compiles"))
    }

    #[test]
    fn signin_urls_fill_in_nginx_variables_as_oauth2_proxy_setups_write_them() {
        let uri: http::Uri = "/a b?c=d".replace(' ', "%20").parse().unwrap_or_default();
        let e = routed("https://$host/oauth2/start?rd=$escaped_request_uri", "rd");
        assert_eq!(
            e.signin_location(
                "https://$host/oauth2/start?rd=$escaped_request_uri",
                "https",
                "app.test",
                &uri
            ),
            "https://app.test/oauth2/start?rd=%2Fa%2520b%3Fc%3Dd",
            "rd= is there already: nothing appended"
        );
        let e = routed("$scheme://login.test/start", "next");
        assert_eq!(
            e.signin_location("$scheme://login.test/start", "http", "app.test:8080", &uri),
            "http://login.test/start?next=http://app.test:8080%2Fa%2520b%3Fc%3Dd"
        );
        assert_eq!(
            e.signin_location("/s?$unknown=1", "http", "h", &uri),
            "/s?$unknown=1&next=http://h%2Fa%2520b%3Fc%3Dd",
            "other variables are left as written"
        );
    }

    #[test]
    fn the_original_uri_is_escaped_as_ngx_escape_uri_does() {
        let mut out = String::new();
        escape_uri("/a b/c?d=e&f", &mut out);
        assert_eq!(out, "%2Fa%20b%2Fc%3Fd%3De%26f");
    }
}
