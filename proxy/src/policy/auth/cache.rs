//! Remembered `auth-url` answers (`auth-cache-key`, `auth-cache-duration`): per route, a fixed
//! table of [`SLOTS`] entries read without a lock, each holding one key's answer until it
//! expires. The full key is stored and compared, so two keys never share an answer; a key
//! whose slot another key took is simply asked again.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use base64::Engine;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use sluice_config::route_policy::{AuthCache, KeyPart};

use crate::upstream::balance::cookie;

/// Answers remembered per route.
pub const SLOTS: usize = 1024;

/// What sluice keeps of an auth service's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// The `auth-response-headers` it set.
    pub fields: Vec<(HeaderName, HeaderValue)>,
    /// Its `Set-Cookie` fields.
    pub cookies: Vec<HeaderValue>,
    /// Its `WWW-Authenticate`.
    pub challenge: Option<HeaderValue>,
    /// Whether it may be remembered.
    pub cacheable: bool,
}

impl Answer {
    /// Reads an answer: the listed fields, cookies and challenge.
    pub fn of(status: StatusCode, headers: &HeaderMap, listed: &[HeaderName]) -> Self {
        Self {
            status,
            fields: listed
                .iter()
                .filter_map(|n| Some((n.clone(), headers.get(n)?.clone())))
                .collect(),
            cookies: headers
                .get_all(header::SET_COOKIE)
                .iter()
                .cloned()
                .collect(),
            challenge: headers.get(header::WWW_AUTHENTICATE).cloned(),
            cacheable: !headers.contains_key(header::SET_COOKIE)
                && !headers
                    .get_all(header::CACHE_CONTROL)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(','))
                    .any(|d| {
                        let d = d.trim().to_ascii_lowercase();
                        d == "no-store" || d == "no-cache" || d == "private"
                    }),
        }
    }
}

#[derive(Debug)]
struct Entry {
    key: Box<[u8]>,
    expires: Instant,
    answer: Arc<Answer>,
}

/// A route's remembered answers.
#[derive(Debug)]
pub struct AnswerCache {
    key: Vec<KeyPart>,
    valid: Vec<(Vec<u16>, Duration)>,
    slots: Box<[ArcSwapOption<Entry>]>,
    hasher: std::hash::RandomState,
}

impl AnswerCache {
    /// An empty cache for these settings.
    pub fn new(c: &AuthCache) -> Self {
        Self {
            key: c.key.clone(),
            valid: c.valid.clone(),
            slots: (0..SLOTS).map(|_| ArcSwapOption::empty()).collect(),
            hasher: std::hash::RandomState::new(),
        }
    }

    /// The request's key: the host the request named, then the template with its variables
    /// filled in as raw bytes (a missing one is empty, as in nginx), each followed by a
    /// separator so that `a`+`bc` and `ab`+`c` differ. The host is always part of it: one
    /// route (a wildcard's, with `auth-url: http://$host/…`) serves many hosts, and one host's
    /// answer must never admit a request for another.
    pub fn key_for<B>(&self, req: &Request<B>, client: IpAddr, host: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(host.to_ascii_lowercase().as_bytes());
        out.push(0x1e);
        let h = req.headers();
        for part in &self.key {
            match part {
                KeyPart::Literal(l) => out.extend_from_slice(l.as_bytes()),
                KeyPart::Header(n) => {
                    if let Some(v) = h.get(n.as_str()) {
                        out.extend_from_slice(v.as_bytes());
                    }
                }
                KeyPart::Cookie(c) => {
                    let v = h
                        .get_all(header::COOKIE)
                        .iter()
                        .find_map(|v| cookie(v.as_bytes(), c));
                    out.extend_from_slice(v.unwrap_or_default());
                }
                KeyPart::Arg(a) => {
                    let v = req.uri().query().and_then(|q| {
                        q.split('&')
                            .find_map(|kv| kv.strip_prefix(a.as_str())?.strip_prefix('='))
                    });
                    out.extend_from_slice(v.unwrap_or_default().as_bytes());
                }
                KeyPart::RemoteAddr => out.extend_from_slice(client.to_string().as_bytes()),
                KeyPart::RemoteUser => out.extend_from_slice(&remote_user(h).unwrap_or_default()),
                KeyPart::Host => out.extend_from_slice(host.as_bytes()),
                KeyPart::RequestUri => out.extend_from_slice(
                    req.uri()
                        .path_and_query()
                        .map_or("/", |p| p.as_str())
                        .as_bytes(),
                ),
                KeyPart::Uri => out.extend_from_slice(req.uri().path().as_bytes()),
                KeyPart::Args => {
                    out.extend_from_slice(req.uri().query().unwrap_or_default().as_bytes());
                }
                KeyPart::Method => out.extend_from_slice(req.method().as_str().as_bytes()),
            }
            out.push(0x1f);
        }
        out
    }

    fn slot(&self, key: &[u8]) -> &ArcSwapOption<Entry> {
        use std::hash::BuildHasher;
        &self.slots[(self.hasher.hash_one(key) as usize) % SLOTS]
    }

    /// The answer remembered for `key`, while it lasts.
    pub fn get(&self, key: &[u8]) -> Option<Arc<Answer>> {
        let guard = self.slot(key).load();
        let e = guard.as_ref()?;
        (*e.key == *key && e.expires > Instant::now()).then(|| Arc::clone(&e.answer))
    }

    /// Remembers `answer` under `key` when `auth-cache-duration` covers its status and the
    /// answer may be kept (as nginx's `proxy_cache`: not with `Set-Cookie`, nor with
    /// `Cache-Control: no-store`, `no-cache` or `private`).
    pub fn put(&self, key: Vec<u8>, answer: &Answer) {
        if !answer.cacheable {
            return;
        }
        let code = answer.status.as_u16();
        let Some(ttl) = self
            .valid
            .iter()
            .find(|(codes, _)| codes.is_empty() || codes.contains(&code))
            .map(|(_, t)| *t)
        else {
            return;
        };
        // Translation caps the time at a year; checked anyway, as a time from input.
        let Some(expires) = Instant::now().checked_add(ttl) else {
            return;
        };
        self.slot(&key).store(Some(Arc::new(Entry {
            key: key.into_boxed_slice(),
            expires,
            answer: Arc::new(answer.clone()),
        })));
    }
}

/// The user of a Basic `Authorization` (nginx's `$remote_user`).
fn remote_user(h: &HeaderMap) -> Option<Vec<u8>> {
    let v = h.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = v.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim_ascii())
        .ok()?;
    raw.split(|b| *b == b':').next().map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(key: Vec<KeyPart>) -> AnswerCache {
        AnswerCache::new(&AuthCache {
            key,
            valid: vec![(vec![200, 401], Duration::from_secs(60))],
        })
    }

    fn answer(status: u16) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
            fields: Vec::new(),
            cookies: Vec::new(),
            challenge: None,
            cacheable: true,
        }
    }

    #[test]
    fn keys_fill_in_the_request() {
        let c = cache(vec![
            KeyPart::RemoteUser,
            KeyPart::Header("x-token".into()),
            KeyPart::Cookie("s".into()),
            KeyPart::Arg("a".into()),
            KeyPart::RemoteAddr,
        ]);
        let req = Request::get("/p?a=1&b=2")
            .header("authorization", "Basic YWxpY2U6cHc=")
            .header("x-token", "t")
            .header("cookie", "z=0; s=abc")
            .body(())
            .unwrap_or_default();
        let key = c.key_for(&req, IpAddr::from([10, 0, 0, 1]), "h.test");
        assert_eq!(key, b"h.test\x1ealice\x1ft\x1fabc\x1f1\x1f10.0.0.1\x1f");
        let other = c.key_for(&req, IpAddr::from([10, 0, 0, 1]), "wiki.H.test");
        assert_ne!(key, other, "one host's answer never serves another's");
        assert!(other.starts_with(b"wiki.h.test\x1e"));
    }

    #[test]
    fn a_time_no_clock_can_hold_is_not_kept_and_does_not_panic() {
        let c = AnswerCache::new(&AuthCache {
            key: vec![KeyPart::Method],
            valid: vec![(vec![], Duration::MAX)],
        });
        c.put(b"a".to_vec(), &answer(200));
        assert!(c.get(b"a").is_none());
    }

    #[test]
    fn only_listed_statuses_are_kept_and_keys_never_mix() {
        let c = cache(vec![KeyPart::Header("x-token".into())]);
        c.put(b"a".to_vec(), &answer(200));
        c.put(b"b".to_vec(), &answer(403));
        assert_eq!(c.get(b"a").map(|a| a.status.as_u16()), Some(200));
        assert!(c.get(b"b").is_none(), "403 is not in the durations");
        assert!(c.get(b"c").is_none());
        c.put(b"a".to_vec(), &answer(401));
        assert_eq!(
            c.get(b"a").map(|a| a.status.as_u16()),
            Some(401),
            "replaced"
        );
        let mut h = HeaderMap::new();
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("max-age=0, private"),
        );
        c.put(b"d".to_vec(), &Answer::of(StatusCode::OK, &h, &[]));
        assert!(c.get(b"d").is_none(), "Cache-Control: private");
        let mut h = HeaderMap::new();
        h.insert(header::SET_COOKIE, HeaderValue::from_static("s=1"));
        c.put(b"e".to_vec(), &Answer::of(StatusCode::OK, &h, &[]));
        assert!(c.get(b"e").is_none(), "Set-Cookie");
    }
}
