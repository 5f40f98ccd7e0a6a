//! HTTP Basic authentication (`auth-type: basic`). A credential that passed is remembered by a
//! keyed 64-bit fingerprint of its `Authorization` value in a small lock-free table, so a
//! client's next requests cost a hash, not a bcrypt round. Slow schemes (bcrypt, SHA-crypt)
//! are checked on the blocking pool, at most [`SLOW_AT_ONCE`] at a time per route, so a flood of
//! wrong passwords cannot take the event loop or every core; at most [`SLOW_WAITING`] more wait
//! for a place, and a check past that is answered at once ([`Checked::Busy`], 503) instead of
//! queueing, so that a flood cannot delay a real login by more than that queue's worth.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::HeaderMap;
use http::header::{self, HeaderValue};
use sluice_config::htpasswd::PasswordHash;
use sluice_config::route_policy::BasicAuth;
use tokio::sync::Semaphore;

use super::password;

/// Remembered credentials per route.
pub const PASSED_SLOTS: usize = 256;
/// Slow password checks running at once per route.
pub const SLOW_AT_ONCE: usize = 2;
/// Slow password checks that may wait for a place per route.
pub const SLOW_WAITING: usize = 32;
/// The longest password checked (bytes); nginx's own limit is the request head's size.
pub const MAX_PASSWORD: usize = 1024;

/// A route's compiled Basic authentication.
#[derive(Debug)]
pub struct Basic {
    /// `Basic realm="…"`.
    pub challenge: HeaderValue,
    users: Arc<HashMap<Box<[u8]>, PasswordHash>>,
    passed: Box<[AtomicU64]>,
    keys: std::hash::RandomState,
    slow: Arc<Semaphore>,
    /// Checks waiting for a place under `slow` (counted out once they have one).
    waiting: AtomicUsize,
}

/// What a Basic check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// The credentials of a user of the route.
    Admitted,
    /// No credentials, or wrong ones.
    Refused,
    /// Too many slow checks already wait: not checked.
    Busy,
}

/// Counts a waiting check until dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Basic {
    /// Compiles the users and the challenge; `None` when the realm cannot be a header value
    /// (the route then stays closed).
    pub fn compile(a: &BasicAuth) -> Option<Self> {
        let challenge = HeaderValue::from_str(&format!("Basic realm=\"{}\"", a.realm)).ok()?;
        Some(Self {
            challenge,
            users: Arc::new(
                a.users
                    .0
                    .iter()
                    .map(|(u, h)| (Box::from(u.as_bytes()), h.clone()))
                    .collect(),
            ),
            passed: (0..PASSED_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            keys: std::hash::RandomState::new(),
            slow: Arc::new(Semaphore::new(SLOW_AT_ONCE)),
            waiting: AtomicUsize::new(0),
        })
    }

    fn fingerprint(&self, value: &[u8]) -> u64 {
        self.keys.hash_one(value) | 1
    }

    /// Whether the request carries the credentials of a user of the route.
    pub async fn admits(&self, headers: &HeaderMap) -> bool {
        self.check(headers).await == Checked::Admitted
    }

    /// Checks the request's credentials (see [`Checked`]).
    pub async fn check(&self, headers: &HeaderMap) -> Checked {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Checked::Refused;
        };
        let fp = self.fingerprint(value.as_bytes());
        let slot = &self.passed[(fp >> 1) as usize % PASSED_SLOTS];
        if slot.load(Ordering::Relaxed) == fp {
            return Checked::Admitted;
        }
        let Some((user, pass)) = decode(value.as_bytes()) else {
            return Checked::Refused;
        };
        // Hash cost grows with the password (apr1 hashes it 1,000 times, SHA-crypt more): a
        // longer one is refused before any hashing.
        if pass.len() > MAX_PASSWORD {
            return Checked::Refused;
        }
        let Some(stored) = self.users.get(user.as_slice()) else {
            return Checked::Refused;
        };
        let ok = if stored.scheme.is_slow() {
            // The queue is bounded: past it, answer at once rather than wait behind a flood.
            if self.waiting.fetch_add(1, Ordering::Relaxed) >= SLOW_WAITING {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                return Checked::Busy;
            }
            let waiting = Waiting(&self.waiting);
            // The permit travels with the blocking task: a client that gives up does not free
            // a place while its hash still runs.
            let Ok(permit) = Arc::clone(&self.slow).acquire_owned().await else {
                return Checked::Refused;
            };
            drop(waiting);
            let stored = stored.clone();
            tokio::task::spawn_blocking(move || {
                let ok = password::verify(&stored, &pass);
                drop(permit);
                ok
            })
            .await
            .unwrap_or(false)
        } else {
            password::verify(stored, &pass)
        };
        if ok {
            slot.store(fp, Ordering::Relaxed);
            Checked::Admitted
        } else {
            Checked::Refused
        }
    }
}

/// `Basic base64(user:password)` → user and password.
fn decode(value: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let raw = STANDARD.decode(rest.trim_ascii()).ok()?;
    let colon = raw.iter().position(|b| *b == b':')?;
    Some((raw[..colon].to_vec(), raw[colon + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::htpasswd::Users;

    fn gate() -> Basic {
        let (users, errors) = Users::parse_file(
            "alice:{PLAIN}wonder:land\nbob:$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        Basic::compile(&BasicAuth {
            realm: "staff".into(),
            users,
        })
        .unwrap_or_else(|| panic!("compiles"))
    }

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(header::AUTHORIZATION, v);
        }
        h
    }

    fn basic(user_pass: &str) -> HeaderMap {
        with(&format!("Basic {}", STANDARD.encode(user_pass)))
    }

    #[tokio::test]
    async fn users_pass_and_everyone_else_does_not() {
        let g = gate();
        assert_eq!(g.challenge, "Basic realm=\"staff\"");
        assert!(
            g.admits(&basic("alice:wonder:land")).await,
            "a colon in the password"
        );
        assert!(g.admits(&basic("bob:U*U")).await, "bcrypt");
        assert!(g.admits(&basic("bob:U*U")).await, "remembered");
        assert!(
            g.admits(&with(&format!("bAsIc {}", STANDARD.encode("bob:U*U"))))
                .await,
            "the scheme is case-insensitive"
        );
        for bad in [
            basic("alice:wonder"),
            basic("alice:"),
            basic("bob:U*V"),
            basic("carol:x"),
            basic(&format!("alice:{}", "w".repeat(MAX_PASSWORD + 1))),
            basic("alice"),
            with("Bearer abc"),
            with("Basic !!!"),
            with("Basic"),
            HeaderMap::new(),
        ] {
            assert!(!g.admits(&bad).await, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn past_the_queue_a_slow_check_is_answered_busy_and_fast_ones_still_run() {
        let g = gate();
        g.waiting.store(SLOW_WAITING, Ordering::Relaxed);
        assert_eq!(g.check(&basic("bob:U*V")).await, Checked::Busy);
        assert_eq!(
            g.waiting.load(Ordering::Relaxed),
            SLOW_WAITING,
            "a refused check leaves no count behind"
        );
        // Plain entries cost no slow check: never busy.
        assert_eq!(
            g.check(&basic("alice:wonder:land")).await,
            Checked::Admitted
        );
        g.waiting.store(0, Ordering::Relaxed);
        assert_eq!(g.check(&basic("bob:U*U")).await, Checked::Admitted);
        assert_eq!(g.check(&basic("bob:U*V")).await, Checked::Refused);
        assert_eq!(
            g.waiting.load(Ordering::Relaxed),
            0,
            "every wait is counted out"
        );
    }
}
