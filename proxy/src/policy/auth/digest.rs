//! HTTP Digest authentication (`auth-type: digest`), as nginx's auth-digest module speaks it:
//! RFC 7616 with MD5 and `qop=auth` against an htdigest file's HA1 values. Every challenge gets
//! its own nonce (the time, a random part and a keyed tag), accepted for [`NONCE_LIFETIME`]
//! (then the client is told `stale=true` and retries without asking its user). Each nonce's
//! counts are remembered, so a captured `Authorization` cannot be replayed: a count already
//! seen, or more than [`WINDOW`] below the highest, is refused (a browser's parallel requests may
//! arrive a little out of order). The key and the counts are process-wide, so a configuration
//! change neither invalidates the nonces clients hold nor forgets their counts; the counts live
//! in a fixed lock-free table of [`COUNT_SLOTS`] entries, and a nonce whose entry another one
//! took could be replayed once within its lifetime, for the same method and URI only.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use md5::{Digest as _, Md5};
use sluice_config::route_policy::DigestAuth;

use super::password::same;

/// How long a nonce is accepted.
pub const NONCE_LIFETIME: Duration = Duration::from_secs(300);
/// Nonces whose counts are remembered (process-wide, 8 bytes each).
pub const COUNT_SLOTS: usize = 65_536;
/// How far below the highest count a count may arrive.
pub const WINDOW: u64 = 16;

/// A route's compiled digest authentication.
#[derive(Debug)]
pub struct Digest {
    realm: String,
    users: HashMap<Box<[u8]>, String>,
}

/// The nonce key and the counts, shared by every digest route of the process.
struct Nonces {
    key: std::hash::RandomState,
    counts: Box<[AtomicU64]>,
}

fn nonces() -> &'static Nonces {
    static NONCES: std::sync::OnceLock<Nonces> = std::sync::OnceLock::new();
    NONCES.get_or_init(|| Nonces {
        key: std::hash::RandomState::new(),
        counts: (0..COUNT_SLOTS).map(|_| AtomicU64::new(0)).collect(),
    })
}

/// Records count `nc` of the nonce whose fingerprint is `fp` in a slot holding
/// `fp:32 | highest:16 | seen-below-highest:16`; `false` for a replay or a count too old.
fn record(slot: &AtomicU64, fp: u64, nc: u64) -> bool {
    if nc == 0 || nc > 0xffff {
        return false;
    }
    let mut current = slot.load(Ordering::Acquire);
    loop {
        let (cur_fp, max, seen) = (current >> 32, (current >> 16) & 0xffff, current & 0xffff);
        let next = if cur_fp != fp {
            // A new nonce (or one that takes over another's slot).
            (fp << 32) | (nc << 16)
        } else if nc > max {
            let shift = nc - max;
            let seen = if shift > WINDOW {
                0
            } else {
                ((seen << shift) | (1 << (shift - 1))) & 0xffff
            };
            (fp << 32) | (nc << 16) | seen
        } else {
            let below = max - nc; // 0 is the highest itself
            if below == 0 || below > WINDOW || seen & (1 << (below - 1)) != 0 {
                return false;
            }
            current | (1 << (below - 1))
        };
        match slot.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => current = now,
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No or wrong credentials.
    Credentials,
    /// Right credentials on an expired nonce: the client should retry with the new one.
    Stale,
}

fn md5_hex(parts: &[&[u8]]) -> String {
    let mut h = Md5::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update(b":");
        }
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The `key=value` / `key="value"` pairs of a `Digest` credential.
fn params(v: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = v;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        let Some(eq) = rest.find('=') else {
            return out;
        };
        let key = rest[..eq].trim().to_ascii_lowercase();
        rest = &rest[eq + 1..];
        let value = if let Some(quoted) = rest.strip_prefix('"') {
            let mut val = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            val.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => val.push(c),
                }
            }
            rest = &quoted[end.min(quoted.len())..];
            val
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            let val = rest[..end].trim().to_string();
            rest = &rest[end..];
            val
        };
        out.insert(key, value);
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Digest {
    /// Compiles the users; `None` when the realm cannot be a header value.
    pub fn compile(a: &DigestAuth) -> Option<Self> {
        HeaderValue::from_str(&a.realm).ok()?;
        Some(Self {
            realm: a.realm.clone(),
            users: a
                .users
                .0
                .iter()
                .map(|(u, h)| (Box::from(u.as_bytes()), h.clone()))
                .collect(),
        })
    }

    fn tag(issued: u64, random: u64) -> u64 {
        nonces()
            .key
            .hash_one((issued, random, "sluice digest nonce"))
    }

    /// A nonce issued at `issued`: its own random part, so no two challenges share one.
    fn nonce(&self, issued: u64) -> String {
        let random = fastrand::u64(..);
        format!(
            "{issued:016x}{random:016x}{:016x}",
            Self::tag(issued, random)
        )
    }

    /// `WWW-Authenticate` for a 401, with a fresh nonce.
    pub fn challenge(&self, stale: bool) -> Option<HeaderValue> {
        let stale = if stale { ", stale=true" } else { "" };
        HeaderValue::from_str(&format!(
            "Digest realm=\"{}\", qop=\"auth\", algorithm=MD5, nonce=\"{}\"{stale}",
            self.realm,
            self.nonce(now_secs())
        ))
        .ok()
    }

    /// Whether the request's `Authorization` proves a user's password for `method` and the
    /// request target `uri` (path and query as sent).
    pub fn check(
        &self,
        method: &str,
        uri: &str,
        value: Option<&HeaderValue>,
    ) -> Result<(), Refused> {
        self.check_at(method, uri, value, now_secs())
    }

    fn check_at(
        &self,
        method: &str,
        uri: &str,
        value: Option<&HeaderValue>,
        now: u64,
    ) -> Result<(), Refused> {
        let bad = Err(Refused::Credentials);
        let Some(v) = value.and_then(|v| v.to_str().ok()) else {
            return bad;
        };
        let Some(rest) = v
            .get(..7)
            .filter(|p| p.eq_ignore_ascii_case("digest "))
            .map(|_| &v[7..])
        else {
            return bad;
        };
        let p = params(rest);
        let get = |k: &str| p.get(k).map(String::as_str).unwrap_or("");
        let (user, nonce, nc, cnonce) = (get("username"), get("nonce"), get("nc"), get("cnonce"));
        let algorithm_ok = matches!(get("algorithm"), "" | "MD5" | "md5");
        if get("realm") != self.realm
            || get("qop") != "auth"
            || !algorithm_ok
            || get("uri") != uri
            || cnonce.is_empty()
            || nc.len() != 8
        {
            return bad;
        }
        let Ok(count) = u32::from_str_radix(nc, 16) else {
            return bad;
        };
        let Some(ha1) = self.users.get(user.as_bytes()) else {
            return bad;
        };
        let ha2 = md5_hex(&[method.as_bytes(), uri.as_bytes()]);
        let want = md5_hex(&[
            ha1.as_bytes(),
            nonce.as_bytes(),
            nc.as_bytes(),
            cnonce.as_bytes(),
            b"auth",
            ha2.as_bytes(),
        ]);
        if !same(
            want.as_bytes(),
            get("response").to_ascii_lowercase().as_bytes(),
        ) {
            return bad;
        }
        // The response is right: now the nonce must be ours, fresh, and its count new.
        let field =
            |r: std::ops::Range<usize>| nonce.get(r).and_then(|h| u64::from_str_radix(h, 16).ok());
        let (Some(issued), Some(random), Some(tag)) = (field(0..16), field(16..32), field(32..48))
        else {
            return bad;
        };
        if nonce.len() != 48 || tag != Self::tag(issued, random) {
            return bad;
        }
        if issued > now || now - issued > NONCE_LIFETIME.as_secs() {
            return Err(Refused::Stale);
        }
        let n = nonces();
        let fp = n.key.hash_one(nonce) >> 32;
        let slot = &n.counts[(n.key.hash_one((nonce, 1u8)) as usize) % COUNT_SLOTS];
        if record(slot, fp, u64::from(count)) {
            Ok(())
        } else {
            bad // a replay, or a count too old
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::htpasswd::DigestUsers;

    fn gate() -> Digest {
        // HA1 of alice:staff:s3cret.
        let ha1 = md5_hex(&[b"alice", b"staff", b"s3cret"]);
        let (users, errors) = DigestUsers::parse_file(&format!("alice:staff:{ha1}\n"), "staff");
        assert!(errors.is_empty(), "{errors:?}");
        Digest::compile(&DigestAuth {
            realm: "staff".into(),
            users,
        })
        .unwrap_or_else(|| panic!("compiles"))
    }

    /// What a client computes (RFC 7616 §3.4.1).
    fn answer(pass: &str, nonce: &str, nc: &str, method: &str, uri: &str) -> HeaderValue {
        let ha1 = md5_hex(&[b"alice", b"staff", pass.as_bytes()]);
        let ha2 = md5_hex(&[method.as_bytes(), uri.as_bytes()]);
        let r = md5_hex(&[
            ha1.as_bytes(),
            nonce.as_bytes(),
            nc.as_bytes(),
            b"xyz",
            b"auth",
            ha2.as_bytes(),
        ]);
        HeaderValue::from_str(&format!(
            "Digest username=\"alice\", realm=\"staff\", nonce=\"{nonce}\", uri=\"{uri}\", qop=auth, nc={nc}, cnonce=\"xyz\", response=\"{r}\", algorithm=MD5"
        ))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_right_answer_passes_once_per_count() {
        let g = gate();
        let now = 1_000_000;
        let n = g.nonce(now);
        let a1 = answer("s3cret", &n, "00000001", "GET", "/a?b");
        assert_eq!(g.check_at("GET", "/a?b", Some(&a1), now), Ok(()));
        assert_eq!(
            g.check_at("GET", "/a?b", Some(&a1), now),
            Err(Refused::Credentials),
            "a replay"
        );
        let a2 = answer("s3cret", &n, "00000002", "GET", "/a?b");
        assert_eq!(g.check_at("GET", "/a?b", Some(&a2), now + 1), Ok(()));
        // Stale after the lifetime: right answer, old nonce.
        let a3 = answer("s3cret", &n, "00000003", "GET", "/a?b");
        let later = now + NONCE_LIFETIME.as_secs() + 1;
        assert_eq!(
            g.check_at("GET", "/a?b", Some(&a3), later),
            Err(Refused::Stale)
        );
    }

    #[test]
    fn counts_may_arrive_out_of_order_but_never_twice() {
        let g = gate();
        let now = 3_000_000;
        let n = g.nonce(now);
        let ok = |nc: &str| {
            let a = answer("s3cret", &n, nc, "GET", "/x");
            g.check_at("GET", "/x", Some(&a), now) == Ok(())
        };
        assert!(ok("00000003"));
        assert!(ok("00000001"), "an earlier count, late");
        assert!(ok("00000002"));
        assert!(!ok("00000002"), "a replay");
        assert!(ok("00000020"));
        assert!(!ok("00000003"), "more than the window below the highest");
        // Two clients challenged in the same second get different nonces.
        assert_ne!(g.nonce(now), g.nonce(now));
    }

    #[test]
    fn the_slot_keeps_the_highest_count_and_the_ones_below() {
        let slot = AtomicU64::new(0);
        assert!(record(&slot, 7, 5));
        assert!(!record(&slot, 7, 5));
        assert!(record(&slot, 7, 4));
        assert!(!record(&slot, 7, 4));
        assert!(record(&slot, 7, 40));
        assert!(!record(&slot, 7, 20), "40 - 20 is beyond the window");
        assert!(record(&slot, 8, 1), "another nonce takes the slot");
        assert!(!record(&slot, 8, 0) && !record(&slot, 8, 0x1_0000));
    }

    #[test]
    fn wrong_answers_are_refused() {
        let g = gate();
        let now = 2_000_000;
        let n = g.nonce(now);
        let cases = [
            ("GET", "/a", answer("wrong", &n, "00000001", "GET", "/a")),
            (
                "GET",
                "/other",
                answer("s3cret", &n, "00000001", "GET", "/a"),
            ),
            ("POST", "/a", answer("s3cret", &n, "00000001", "GET", "/a")),
            (
                "GET",
                "/a",
                answer(
                    "s3cret",
                    "0000000000000000ffffffffffffffff",
                    "00000001",
                    "GET",
                    "/a",
                ),
            ),
            (
                "GET",
                "/a",
                HeaderValue::from_static("Basic YWxpY2U6czNjcmV0"),
            ),
            (
                "GET",
                "/a",
                HeaderValue::from_static("Digest username=\"alice\""),
            ),
        ];
        for (method, uri, value) in cases {
            assert_eq!(
                g.check_at(method, uri, Some(&value), now),
                Err(Refused::Credentials),
                "{value:?}"
            );
        }
        assert_eq!(
            g.check_at("GET", "/a", None, now),
            Err(Refused::Credentials)
        );
    }

    #[test]
    fn the_challenge_names_realm_qop_and_a_nonce() {
        let c = gate()
            .challenge(true)
            .map(|v| v.to_str().unwrap_or("").to_string());
        let c = c.unwrap_or_default();
        assert!(c.starts_with("Digest realm=\"staff\", qop=\"auth\", algorithm=MD5, nonce=\""));
        assert!(c.ends_with(", stale=true"), "{c}");
    }

    #[test]
    fn parameters_are_read_quoted_or_not() {
        let p = params("username=\"a\\\"b\", nc=00000001 , qop=auth,uri=\"/x,y\"");
        assert_eq!(p["username"], "a\"b");
        assert_eq!(p["nc"], "00000001");
        assert_eq!(p["qop"], "auth");
        assert_eq!(p["uri"], "/x,y");
    }
}
