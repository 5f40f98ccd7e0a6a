//! The rules every response sluice sends obeys, whichever path wrote it: `Server: sluice`
//! (an upstream's own `Server` is replaced), `Strict-Transport-Security` on TLS when the route
//! sets HSTS (replacing the upstream's), and `Connection: close` on HTTP/1 while draining, so a
//! keep-alive client learns of the shutdown on a response instead of racing a new request
//! against the close. Two renderings of one decision: [`ResponseRules::apply`] for header maps
//! (the general handler, local answers), [`ResponseRules::replaces`] and
//! [`ResponseRules::write`] for heads copied field by field (the direct handler).

use http::HeaderMap;
use http::header::{self, HeaderValue};

use crate::handler::ConnInfo;
use crate::handler::local::SERVER;
use crate::handler::respond::HeadWriter;
use crate::state::dataplane::DataPlane;
use crate::state::routes::Action;
use crate::wire::field::Field;

/// What one response gets.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResponseRules {
    /// The route's HSTS value, on a TLS connection.
    hsts: Option<HeaderValue>,
    /// The connection ends after this response (HTTP/1 while draining).
    close: bool,
}

impl ResponseRules {
    /// Whether an HTTP/1 response written now must end its connection: the server is
    /// draining.
    pub(crate) fn draining(dp: &DataPlane, http1: bool) -> bool {
        http1 && dp.is_draining()
    }

    /// For an answer given before a route was chosen (no HSTS: no route asked for it).
    pub(crate) fn unrouted(dp: &DataPlane, http1: bool) -> Self {
        Self {
            hsts: None,
            close: Self::draining(dp, http1),
        }
    }

    /// For an answer on `action`'s route.
    pub(crate) fn routed(dp: &DataPlane, conn: &ConnInfo, action: &Action, http1: bool) -> Self {
        Self {
            hsts: Self::hsts(conn, action),
            close: Self::draining(dp, http1),
        }
    }

    /// The HSTS value a response on `action` over `conn` carries.
    pub(crate) fn hsts(conn: &ConnInfo, action: &Action) -> Option<HeaderValue> {
        if conn.tls { action.hsts.clone() } else { None }
    }

    /// For a head copied field by field: HSTS as decided when the route was chosen; the drain
    /// is checked by the writer when the head is written ([`ResponseRules::draining`]).
    pub(crate) fn copied(hsts: Option<HeaderValue>) -> Self {
        Self { hsts, close: false }
    }

    /// Puts the rules into a header map.
    pub(crate) fn apply(&self, h: &mut HeaderMap) {
        h.insert(header::SERVER, SERVER.clone());
        if let Some(v) = &self.hsts {
            h.insert(header::STRICT_TRANSPORT_SECURITY, v.clone());
        }
        if self.close {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }

    /// Whether an upstream field of this kind is left out of a copied head because
    /// [`ResponseRules::write`] writes its own.
    pub(crate) fn replaces(&self, kind: Field) -> bool {
        kind == Field::Server || (self.hsts.is_some() && kind == Field::StrictTransportSecurity)
    }

    /// Writes the rules' fields into a copied head (`Connection: close` is the writer's, from
    /// the `close` it finishes with).
    pub(crate) fn write(&self, w: &mut HeadWriter<'_>) {
        w.field(b"server", SERVER.as_bytes());
        if let Some(v) = &self.hsts {
            w.field(b"strict-transport-security", v.as_bytes());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use http::StatusCode;

    #[test]
    fn both_renderings_write_the_same_fields() {
        for hsts in [None, Some(HeaderValue::from_static("max-age=60"))] {
            let rules = ResponseRules::copied(hsts.clone());
            let mut map = HeaderMap::new();
            map.insert(header::SERVER, HeaderValue::from_static("upstream"));
            map.insert(
                header::STRICT_TRANSPORT_SECURITY,
                HeaderValue::from_static("max-age=1"),
            );
            let mut copied = BytesMut::new();
            let mut w = HeadWriter::new(&mut copied, StatusCode::OK);
            for (n, v) in &map {
                if !rules.replaces(Field::of(n.as_str().as_bytes())) {
                    w.field(n.as_str().as_bytes(), v.as_bytes());
                }
            }
            rules.write(&mut w);
            let mut applied = map.clone();
            rules.apply(&mut applied);
            let text = String::from_utf8(copied.to_vec()).unwrap();
            for (n, v) in &applied {
                let line = format!("{n}: {}\r\n", v.to_str().unwrap());
                assert!(text.contains(&line), "{line:?} missing from {text:?}");
            }
            assert_eq!(text.matches("server:").count(), 1, "{text}");
            assert_eq!(
                text.matches("strict-transport-security:").count(),
                1,
                "{text}"
            );
        }
    }
}
