//! `Content-Length`, read one way everywhere: the upstream response's framing, the response
//! head copied to a fast-path client, the request-body limit, the fast reader's "no body"
//! check and the access log. Before this module each place parsed it with its own strictness
//! (one took the first element of a list, one any `u64` `str::parse` accepts — `+5` included —,
//! one only the literal `0`), so the same head could mean two lengths on two paths.
//!
//! The rule (RFC 9110 §8.6, RFC 9112 §6.3): a value is one or more decimal numbers separated
//! by commas; a list whose members all agree (`3, 3`, which some servers send after merging
//! fields) is that one number; anything else — a sign, spaces inside a number, an empty member,
//! two different numbers, a number above `u64` — is invalid, and a message with an invalid
//! length is refused rather than guessed at.

/// Why a `Content-Length` could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LengthError {
    /// Not a list of decimal numbers.
    #[error("invalid Content-Length")]
    Invalid,
    /// Two different numbers.
    #[error("conflicting Content-Length values")]
    Conflicting,
}

impl LengthError {
    /// What was wrong, as a static phrase (for errors that carry one).
    pub fn what(self) -> &'static str {
        match self {
            LengthError::Invalid => "invalid Content-Length",
            LengthError::Conflicting => "conflicting Content-Length values",
        }
    }
}

/// One decimal number: ASCII digits only, no sign, no inner space, fits `u64`.
fn number(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// The length all of `values` (every `Content-Length` field of one message, in order) state
/// together; `Ok(None)` when there are none.
pub fn content_length<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<u64>, LengthError> {
    values
        .into_iter()
        .try_fold(None, |so_far, v| add(Ok(so_far), v))
}

/// [`content_length`] one field at a time, for readers that classify every field in one pass:
/// `so_far` is what the earlier `Content-Length` fields said (start with `Ok(None)`).
pub fn add(
    so_far: Result<Option<u64>, LengthError>,
    value: &[u8],
) -> Result<Option<u64>, LengthError> {
    let mut length = so_far?;
    for part in value.split(|&b| b == b',') {
        let n = number(part.trim_ascii()).ok_or(LengthError::Invalid)?;
        if length.is_some_and(|l| l != n) {
            return Err(LengthError::Conflicting);
        }
        length = Some(n);
    }
    Ok(length)
}

/// The length one field value states (see [`content_length`]).
pub fn one(value: &[u8]) -> Result<u64, LengthError> {
    content_length([value])?.ok_or(LengthError::Invalid)
}

/// The length a header map's `Content-Length` fields state, `None` when absent or invalid
/// (for maps hyper or our decoder already validated, and for the access log).
pub fn of_map(headers: &http::HeaderMap) -> Option<u64> {
    content_length(
        headers
            .get_all(http::header::CONTENT_LENGTH)
            .iter()
            .map(http::HeaderValue::as_bytes),
    )
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_every_reader() {
        type Case = (&'static [&'static str], Result<Option<u64>, LengthError>);
        let cases: [Case; 14] = [
            (&[], Ok(None)),
            (&["0"], Ok(Some(0))),
            (&["42"], Ok(Some(42))),
            (&[" 42 "], Ok(Some(42))),
            (&["3, 3"], Ok(Some(3))),
            (&["3", "3"], Ok(Some(3))),
            (&["18446744073709551615"], Ok(Some(u64::MAX))),
            (&["18446744073709551616"], Err(LengthError::Invalid)),
            (&["+5"], Err(LengthError::Invalid)),
            (&["-1"], Err(LengthError::Invalid)),
            (&["4 2"], Err(LengthError::Invalid)),
            (&["3,"], Err(LengthError::Invalid)),
            (&["3, 4"], Err(LengthError::Conflicting)),
            (&["3", "4"], Err(LengthError::Conflicting)),
        ];
        for (values, want) in cases {
            let got = content_length(values.iter().map(|v| v.as_bytes()));
            assert_eq!(got, want, "{values:?}");
        }
        assert_eq!(one(b""), Err(LengthError::Invalid));
        assert_eq!(one(b"0x10"), Err(LengthError::Invalid));
    }
}
