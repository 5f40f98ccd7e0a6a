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
use sluice_config::behaviour::ExternalAuth;

use crate::upstream::body::ReqBody;
use crate::upstream::cluster::Cluster;
use crate::wire::hop;

/// A route's compiled external authentication.
#[derive(Debug)]
pub struct External {
    /// The auth Service's pool.
    pub(crate) pool: Arc<Cluster>,
    host: HeaderValue,
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
    /// Compiles the auth settings against the pool of the auth Service; `None` when that pool
    /// does not exist or a value cannot be a header (the route then stays closed).
    pub fn compile(a: &ExternalAuth, pool: Arc<Cluster>) -> Option<Self> {
        let authority = a.url.strip_prefix("http://")?.split(['/', '?']).next()?;
        Some(Self {
            pool,
            host: HeaderValue::from_str(authority).ok()?,
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
        })
    }

    /// The subrequest for `req`.
    pub(crate) fn subrequest<B>(
        &self,
        req: &Request<B>,
        scheme: &str,
        host: &str,
    ) -> Request<ReqBody> {
        let mut sub = Request::new(ReqBody::empty());
        *sub.method_mut() = self.method.clone().unwrap_or_else(|| req.method().clone());
        *sub.uri_mut() = http::Uri::from(self.path.clone());
        let h = sub.headers_mut();
        h.clone_from(req.headers());
        hop::strip(h, false);
        h.remove(header::CONTENT_LENGTH);
        h.remove(header::TRANSFER_ENCODING);
        h.insert(header::HOST, self.host.clone());
        let uri = req.uri().path_and_query().map_or("/", |p| p.as_str());
        if let Ok(v) = HeaderValue::from_str(&format!("{scheme}://{host}{uri}")) {
            h.insert(HeaderName::from_static("x-original-url"), v);
        }
        if let Ok(v) = HeaderValue::from_str(req.method().as_str()) {
            h.insert(HeaderName::from_static("x-original-method"), v);
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

    /// `auth-signin` with the original URL in the redirect parameter, as ingress-nginx's
    /// `buildAuthSignURL`: added unless the URL already carries that parameter.
    pub(crate) fn signin_location(
        &self,
        signin: &str,
        scheme: &str,
        host: &str,
        uri: &http::Uri,
    ) -> String {
        if signin.contains(&format!("{}=", self.param)) {
            return signin.to_string();
        }
        let mut out = String::with_capacity(signin.len() + 64);
        out.push_str(signin);
        out.push(if signin.contains('?') { '&' } else { '?' });
        out.push_str(&self.param);
        out.push('=');
        out.push_str(scheme);
        out.push_str("://");
        out.push_str(host);
        escape_uri(uri.path_and_query().map_or("/", |p| p.as_str()), &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_original_uri_is_escaped_as_ngx_escape_uri_does() {
        let mut out = String::new();
        escape_uri("/a b/c?d=e&f", &mut out);
        assert_eq!(out, "%2Fa%20b%2Fc%3Fd%3De%26f");
    }
}
