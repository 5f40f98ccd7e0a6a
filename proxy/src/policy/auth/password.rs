//! Checking a password against one stored htpasswd entry, for every scheme
//! [`sluice_config::htpasswd::Scheme`] recognises. Comparisons of secrets are constant-time.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use md5::{Digest, Md5};
use sha1::Sha1;
use sluice_config::htpasswd::{PasswordHash, Scheme};

/// Compares two byte strings in time that depends on their lengths only.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `password` matches the stored entry.
pub(crate) fn verify(stored: &PasswordHash, password: &[u8]) -> bool {
    let v = stored.value.as_str();
    match stored.scheme {
        Scheme::Plain => same(v.as_bytes().get(7..).unwrap_or_default(), password),
        Scheme::Sha1 => STANDARD
            .decode(v.get(5..).unwrap_or_default())
            .is_ok_and(|want| same(&want, &Sha1::digest(password))),
        Scheme::SaltedSha1 => match STANDARD.decode(v.get(6..).unwrap_or_default()) {
            Ok(raw) if raw.len() > 20 => {
                let (want, salt) = raw.split_at(20);
                let mut h = Sha1::new();
                h.update(password);
                h.update(salt);
                same(want, &h.finalize())
            }
            _ => false,
        },
        Scheme::Apr1 => apr1_verify(v, password),
        Scheme::Bcrypt | Scheme::Crypt => pwhash::unix::verify(password, v),
    }
}

/// `$apr1$SALT$HASH`: the MD5-based crypt with Apache's magic string.
fn apr1_verify(stored: &str, password: &[u8]) -> bool {
    let Some(rest) = stored.strip_prefix("$apr1$") else {
        return false;
    };
    let Some((salt, _)) = rest.split_once('$') else {
        return false;
    };
    let salt = &salt.as_bytes()[..salt.len().min(8)];
    let computed = md5_crypt(password, salt, b"$apr1$");
    same(computed.as_bytes(), stored.as_bytes())
}

/// The MD5 crypt of Poul-Henning Kamp (FreeBSD), with `magic` (`$1$` or `$apr1$`).
fn md5_crypt(pw: &[u8], salt: &[u8], magic: &[u8]) -> String {
    let alternate = {
        let mut h = Md5::new();
        h.update(pw);
        h.update(salt);
        h.update(pw);
        h.finalize()
    };
    let mut h = Md5::new();
    h.update(pw);
    h.update(magic);
    h.update(salt);
    let mut left = pw.len();
    while left > 0 {
        let n = left.min(16);
        h.update(&alternate[..n]);
        left -= n;
    }
    let mut i = pw.len();
    while i > 0 {
        if i & 1 == 1 {
            h.update([0u8]);
        } else {
            h.update(&pw[..1]);
        }
        i >>= 1;
    }
    let mut f = h.finalize();
    for round in 0..1000 {
        let mut h = Md5::new();
        if round & 1 == 1 {
            h.update(pw);
        } else {
            h.update(f);
        }
        if round % 3 != 0 {
            h.update(salt);
        }
        if round % 7 != 0 {
            h.update(pw);
        }
        if round & 1 == 1 {
            h.update(f);
        } else {
            h.update(pw);
        }
        f = h.finalize();
    }
    const ITOA64: &[u8] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(magic.len() + salt.len() + 23);
    out.push_str(&String::from_utf8_lossy(magic));
    out.push_str(&String::from_utf8_lossy(salt));
    out.push('$');
    let mut put = |v: u32, n: usize| {
        let mut v = v;
        for _ in 0..n {
            out.push(char::from(ITOA64[(v & 0x3f) as usize]));
            v >>= 6;
        }
    };
    let b = |i: usize| u32::from(f[i]);
    for (x, y, z) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        put((b(x) << 16) | (b(y) << 8) | b(z), 4);
    }
    put(b(11), 2);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::htpasswd::parse_hash;

    /// Entries written by `openssl passwd` and Python's `crypt`/`hashlib` for `s3cret`, and
    /// OpenBSD's bcrypt test vector (`U*U`).
    #[test]
    fn every_scheme_accepts_its_password_and_nothing_else() {
        let cases = [
            ("$apr1$Kx9sQ2aZ$VILXK2vA.T/e/KqPV2DQI.", "s3cret"),
            ("$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00", "password"),
            ("$1$ab12$uS0uGTebbG2iGzL0r4Xeb0", "s3cret"),
            (
                "$5$saltsalt$i1q2ZQzc.tl/BQ6CHiENAcVDvEY6nJ1OWlWXKh94b1.",
                "s3cret",
            ),
            (
                "$6$saltsalt$As4wrv0kZlfch1du9WeH7qhskyLriQWySXrZzynnvi46nFnNxjdpl6ksRegrrKexvhIa/Iny8S8uF3fVWTMuC1",
                "s3cret",
            ),
            ("abhWCwoTZY2c6", "s3cret"),
            ("{SHA}/vNB+F2HQ559kaLUZbmHHvZrXpg=", "s3cret"),
            ("{SSHA}rSC6FONm6jhcU0alALdYRKUMvgBOYUNsMTIzNA==", "s3cret"),
            ("{PLAIN}s3cret", "s3cret"),
            (
                "$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW",
                "U*U",
            ),
        ];
        for (stored, pw) in cases {
            let h = parse_hash(stored).unwrap_or_else(|e| panic!("{stored}: {e}"));
            assert!(verify(&h, pw.as_bytes()), "{stored} should accept {pw}");
            for wrong in ["", "s3cre", "s3cret ", "S3cret", "password1", "U*V"] {
                assert!(!verify(&h, wrong.as_bytes()), "{stored} accepted {wrong:?}");
            }
        }
    }

    #[test]
    fn a_mangled_entry_accepts_nothing() {
        for stored in [
            "{SHA}not base64!",
            "{SSHA}c2hvcnQ=",
            "$apr1$nosalt",
            "$1$ab12$uS0uGTebbG2iGzL0r4Xeb1",
        ] {
            let h = parse_hash(stored).unwrap_or_else(|e| panic!("{stored}: {e}"));
            assert!(!verify(&h, b"s3cret"), "{stored}");
        }
    }

    #[test]
    fn comparison_needs_equal_length_and_bytes() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(same(b"", b""));
    }
}
