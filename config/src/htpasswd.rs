//! The credential files `auth-type: basic` reads (Apache `htpasswd` lines, or ingress-nginx's
//! `auth-map`), parsed into typed entries. Only the format is checked here: verifying a
//! password is the data plane's job (`sluice-proxy`), and this crate does no cryptography.

use std::fmt;

/// How an entry's password is stored. Every scheme `htpasswd` writes is here, and the ones
/// nginx's `auth_basic_user_file` reads besides (`{PLAIN}`, `{SSHA}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// `$2y$`/`$2a$`/`$2b$` (`htpasswd -B`).
    Bcrypt,
    /// `$apr1$` (`htpasswd -m`, its default): Apache's MD5 variant.
    Apr1,
    /// `{SHA}` + base64 SHA-1 (`htpasswd -s`).
    Sha1,
    /// `{SSHA}` + base64 of SHA-1 digest and salt.
    SaltedSha1,
    /// `{PLAIN}` + the password.
    Plain,
    /// `crypt(3)`: `$1$` MD5, `$5$` SHA-256, `$6$` SHA-512, or 13-character DES
    /// (`htpasswd -d`).
    Crypt,
}

impl Scheme {
    /// Whether checking one password takes real CPU time (1,000 MD5 rounds for `$apr1$`,
    /// milliseconds for bcrypt and SHA-crypt), so the data plane checks it off the event loop.
    pub fn is_slow(self) -> bool {
        matches!(self, Self::Bcrypt | Self::Crypt | Self::Apr1)
    }
}

/// One stored password.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PasswordHash {
    /// The scheme, from the value's prefix.
    pub scheme: Scheme,
    /// The value as stored, prefix included.
    pub value: String,
}

impl fmt::Debug for PasswordHash {
    /// Never prints the value: a `{PLAIN}` entry is the password itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PasswordHash({:?})", self.scheme)
    }
}

const CRYPT_ALPHABET: &[u8] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Reads one stored password by its prefix; an unknown format is an error naming the formats.
pub fn parse_hash(value: &str) -> Result<PasswordHash, String> {
    let scheme = if ["$2y$", "$2a$", "$2b$"]
        .iter()
        .any(|p| value.starts_with(p))
    {
        Scheme::Bcrypt
    } else if value.starts_with("$apr1$") {
        Scheme::Apr1
    } else if value.starts_with("{SHA}") {
        Scheme::Sha1
    } else if value.starts_with("{SSHA}") {
        Scheme::SaltedSha1
    } else if value.starts_with("{PLAIN}") {
        Scheme::Plain
    } else if ["$1$", "$5$", "$6$"].iter().any(|p| value.starts_with(p))
        || (value.len() == 13 && value.bytes().all(|b| CRYPT_ALPHABET.contains(&b)))
    {
        Scheme::Crypt
    } else {
        return Err(
            "not a password hash sluice reads (bcrypt $2y$, $apr1$, {SHA}, {SSHA}, {PLAIN}, crypt $1$/$5$/$6$ or DES)"
                .into(),
        );
    };
    Ok(PasswordHash {
        scheme,
        value: value.to_string(),
    })
}

/// Users and their stored passwords, sorted by user; a later line for a user wins, as in
/// nginx.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Users(pub Vec<(String, PasswordHash)>);

impl Users {
    fn from_pairs<'a>(
        pairs: impl Iterator<Item = (usize, &'a str, &'a str)>,
        errors: &mut Vec<String>,
    ) -> Self {
        let mut map = std::collections::BTreeMap::new();
        for (line, user, value) in pairs {
            if user.is_empty() || user.contains(':') {
                errors.push(format!("entry {line}: {user:?} is not a user name"));
                continue;
            }
            match parse_hash(value.trim()) {
                Ok(h) => {
                    map.insert(user.to_string(), h);
                }
                Err(why) => errors.push(format!("entry {line} ({user}): {why}")),
            }
        }
        Self(map.into_iter().collect())
    }

    /// An `htpasswd` file (`auth-secret-type: auth-file`, key `auth`): `user:hash` lines;
    /// blank lines and `#` comments skipped. Lines that cannot be read are returned as errors
    /// (their user cannot log in); the rest stand.
    pub fn parse_file(text: &str) -> (Self, Vec<String>) {
        let mut errors = Vec::new();
        let mut pairs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(':') {
                Some((user, hash)) => pairs.push((i + 1, user, hash)),
                None => errors.push(format!("line {}: no `user:hash`", i + 1)),
            }
        }
        let users = Self::from_pairs(pairs.into_iter(), &mut errors);
        (users, errors)
    }

    /// `auth-secret-type: auth-map`: every key of the Secret is a user, its value the hash.
    pub fn parse_map<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> (Self, Vec<String>) {
        let mut errors = Vec::new();
        let users = Self::from_pairs(
            entries.enumerate().map(|(i, (u, h))| (i + 1, u, h)),
            &mut errors,
        );
        (users, errors)
    }
}

/// Users of digest authentication (`auth-type: digest`): an `htdigest` file's
/// `user:realm:HA1` lines, HA1 being the hex MD5 of `user:realm:password`. Only the lines of
/// the route's realm count (HA1 depends on it); others are reported.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct DigestUsers(pub Vec<(String, String)>);

impl fmt::Debug for DigestUsers {
    /// The HA1 values are password equivalents: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DigestUsers({} users)", self.0.len())
    }
}

impl DigestUsers {
    /// Parses an htdigest file for `realm`; unreadable lines and other realms' lines are
    /// returned as errors, the rest stand (a later line for a user wins).
    pub fn parse_file(text: &str, realm: &str) -> (Self, Vec<String>) {
        let mut map = std::collections::BTreeMap::new();
        let mut errors = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.splitn(3, ':');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(u), Some(r), Some(h))
                    if !u.is_empty()
                        && h.len() == 32
                        && h.bytes().all(|b| b.is_ascii_hexdigit()) =>
                {
                    if r == realm {
                        map.insert(u.to_string(), h.to_ascii_lowercase());
                    } else {
                        errors.push(format!(
                            "line {} ({u}): realm {r:?} is not the route's {realm:?}",
                            i + 1
                        ));
                    }
                }
                _ => errors.push(format!("line {}: not `user:realm:md5hex`", i + 1)),
            }
        }
        (Self(map.into_iter().collect()), errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_htpasswd_scheme_is_recognised_by_its_prefix() {
        let cases = [
            (
                "$2y$05$c4WoMPo3SXsafkva.HHa6uXQZWr7oboPiC2bT/r7q1BB8I2s0BRqC",
                Scheme::Bcrypt,
            ),
            ("$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00", Scheme::Apr1),
            ("{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", Scheme::Sha1),
            ("{SSHA}MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0", Scheme::SaltedSha1),
            ("{PLAIN}secret", Scheme::Plain),
            ("$1$salt$qJH7.N4xYta3aEG/dfqo/0", Scheme::Crypt),
            ("$6$salt$abc", Scheme::Crypt),
            ("rl0uPK9Qb1K4s", Scheme::Crypt),
        ];
        for (v, want) in cases {
            assert_eq!(parse_hash(v).map(|h| h.scheme), Ok(want), "{v}");
        }
        for bad in ["", "password", "$3$x", "rl0uPK9Qb1K4!", "{MD5}abc"] {
            assert!(parse_hash(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_file_keeps_good_lines_and_names_bad_ones() {
        let (users, errors) = Users::parse_file(
            "# admins\nalice:{PLAIN}a\n\nbob\ncarol:nonsense\nalice:{PLAIN}b\n:{PLAIN}x\n",
        );
        let names: Vec<&str> = users.0.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(names, ["alice"]);
        assert_eq!(users.0[0].1.value, "{PLAIN}b", "the later line wins");
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("line 4"), "{errors:?}");
        assert!(errors[1].contains("carol"), "{errors:?}");
    }

    #[test]
    fn a_map_is_one_user_per_key() {
        let (users, errors) =
            Users::parse_map([("a", "{PLAIN}x"), ("b", "bad"), ("c:d", "{PLAIN}y")].into_iter());
        assert_eq!(users.0.len(), 1);
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    #[test]
    fn an_htdigest_file_keeps_the_route_realm() {
        let (users, errors) = DigestUsers::parse_file(
            "alice:staff:939e7578ed9e3c518a452acee763bce9\nbob:other:939e7578ed9e3c518a452acee763bce9\ncarol:staff:xyz\n",
            "staff",
        );
        assert_eq!(users.0.len(), 1);
        assert_eq!(users.0[0].0, "alice");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(format!("{users:?}"), "DigestUsers(1 users)");
    }

    #[test]
    fn debug_never_shows_a_password() {
        let h = parse_hash("{PLAIN}hunter2").map(|h| format!("{h:?}"));
        assert_eq!(h.as_deref(), Ok("PasswordHash(Plain)"));
    }
}
