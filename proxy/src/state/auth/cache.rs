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
use sluice_config::annotations::auth_cache::{AuthCache, KeyPart};

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
        }
    }
}

#[derive(Debug)]
struct Entry {
    key: Box<str>,
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

    /// The request's key: the template with its variables filled in (a missing one is empty,
    /// as in nginx), each followed by a separator so that `a`+`bc` and `ab`+`c` differ.
    pub fn key_for<B>(&self, req: &Request<B>, client: IpAddr, host: &str) -> String {
        let mut out = String::new();
        let h = req.headers();
        let text = |v: Option<&HeaderValue>| {
            v.and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        for part in &self.key {
            match part {
                KeyPart::Literal(l) => out.push_str(l),
                KeyPart::Header(n) => out.push_str(&text(h.get(n.as_str()))),
                KeyPart::Cookie(c) => {
                    let v = h
                        .get_all(header::COOKIE)
                        .iter()
                        .find_map(|v| cookie(v.as_bytes(), c));
                    out.push_str(&String::from_utf8_lossy(v.unwrap_or_default()));
                }
                KeyPart::Arg(a) => {
                    let v = req.uri().query().and_then(|q| {
                        q.split('&')
                            .find_map(|kv| kv.strip_prefix(a.as_str())?.strip_prefix('='))
                    });
                    out.push_str(v.unwrap_or_default());
                }
                KeyPart::RemoteAddr => out.push_str(&client.to_string()),
                KeyPart::RemoteUser => out.push_str(&remote_user(h).unwrap_or_default()),
                KeyPart::Host => out.push_str(host),
                KeyPart::RequestUri => {
                    out.push_str(req.uri().path_and_query().map_or("/", |p| p.as_str()));
                }
                KeyPart::Uri => out.push_str(req.uri().path()),
                KeyPart::Args => out.push_str(req.uri().query().unwrap_or_default()),
                KeyPart::Method => out.push_str(req.method().as_str()),
            }
            out.push('\u{1f}');
        }
        out
    }

    fn slot(&self, key: &str) -> &ArcSwapOption<Entry> {
        use std::hash::BuildHasher;
        &self.slots[(self.hasher.hash_one(key) as usize) % SLOTS]
    }

    /// The answer remembered for `key`, while it lasts.
    pub fn get(&self, key: &str) -> Option<Arc<Answer>> {
        let guard = self.slot(key).load();
        let e = guard.as_ref()?;
        (&*e.key == key && e.expires > Instant::now()).then(|| Arc::clone(&e.answer))
    }

    /// Remembers `answer` under `key` when `auth-cache-duration` covers its status.
    pub fn put(&self, key: String, answer: &Answer) {
        let code = answer.status.as_u16();
        let Some(ttl) = self
            .valid
            .iter()
            .find(|(codes, _)| codes.is_empty() || codes.contains(&code))
            .map(|(_, t)| *t)
        else {
            return;
        };
        self.slot(&key).store(Some(Arc::new(Entry {
            key: key.into_boxed_str(),
            expires: Instant::now() + ttl,
            answer: Arc::new(answer.clone()),
        })));
    }
}

/// The user of a Basic `Authorization` (nginx's `$remote_user`).
fn remote_user(h: &HeaderMap) -> Option<String> {
    let v = h.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = v.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim_ascii())
        .ok()?;
    let user = raw.split(|b| *b == b':').next()?;
    Some(String::from_utf8_lossy(user).into_owned())
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
        assert_eq!(key, "alice\u{1f}t\u{1f}abc\u{1f}1\u{1f}10.0.0.1\u{1f}");
    }

    #[test]
    fn only_listed_statuses_are_kept_and_keys_never_mix() {
        let c = cache(vec![KeyPart::Header("x-token".into())]);
        c.put("a".into(), &answer(200));
        c.put("b".into(), &answer(403));
        assert_eq!(c.get("a").map(|a| a.status.as_u16()), Some(200));
        assert!(c.get("b").is_none(), "403 is not in the durations");
        assert!(c.get("c").is_none());
        c.put("a".into(), &answer(401));
        assert_eq!(c.get("a").map(|a| a.status.as_u16()), Some(401), "replaced");
    }
}
