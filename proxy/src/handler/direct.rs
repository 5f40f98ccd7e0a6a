//! Direct forwarding for the fast path: a body-less HTTP/1.1 request routed to an HTTP/1
//! upstream goes out as its own head's fields, copied as they are, and the answer comes back
//! the same way. No header map is built on either side (building, hashing and dropping two of
//! them was the largest user-space cost of a proxied request); the rules are the general
//! path's, applied field by field: hop-by-hop fields dropped ([`crate::wire::hop`]), the proxy
//! headers written ([`crate::wire::forwarded`]), `Server` replaced, HSTS on TLS, the response framed
//! by RFC 9112 §6.3 ([`crate::upstream::h1::framing_of`]).
//!
//! Anything else — no route, a redirect, a 503 target, an h2c upstream, a `Host` that is
//! missing, repeated or not plain ASCII — is handed to the general handler
//! ([`crate::handler::general::handle_in`]) with the route table already loaded.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::HeaderValue;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use sluice_config::BalancePolicy;
use sluice_config::host::{HostBuf, normalize_request_host, valid_request_host};
use sluice_config::request_path;
use tokio::time::Sleep;

use crate::handler::ConnInfo;
use crate::handler::general::{finish, handle_in};
use crate::handler::local::{Local, error_response, limited, timed_out, unasked_switch};
use crate::handler::respond::{BodyFraming, HeadWriter};
use crate::handler::rules::ResponseRules;
use crate::state::dataplane::DataPlane;
use crate::state::routes::{Action, DirectClient};
use crate::telemetry::access_log::{self, RouteSeen, UpstreamSeen};
use crate::upstream::balance::{KeySource, request_hash};
use crate::upstream::body::{ReqBody, RespBody};
use crate::upstream::cluster::Cluster;
use crate::upstream::h1::H1Body;
use crate::upstream::retry::{self, H1Answer, Plan};
use crate::wire::decode::{RawHead, Span, fields, header_map, value_lists};
use crate::wire::encode::empty_body_says_length;
use crate::wire::field::put_field;
use crate::wire::field::{self, Field, Run};
use crate::wire::forwarded::{ClientFields, ProxyHeaders};
use crate::wire::hop;
use crate::wire::{ReqFraming, framing_of};

/// A request head the fast path parsed: the head's bytes (its fields located by the
/// connection's spans), method, target and what the connection needs to know.
#[derive(Debug)]
pub(crate) struct FastReq {
    /// The request head, request line to blank line.
    pub head: Bytes,
    /// The method.
    pub method: Method,
    /// The origin-form target.
    pub uri: Uri,
    /// How many `Host` fields the head has, and where the first one's value is.
    pub hosts: usize,
    /// Start and end of the first `Host` value in `head`.
    pub host: (usize, usize),
    /// The client keeps the connection open after this request.
    pub keep_alive: bool,
    /// The `X-Request-ID` to send when the client sent none (set when access logging, so the
    /// log and the upstream agree).
    pub request_id: Option<[u8; 32]>,
}

impl FastReq {
    /// A `HEAD` request (its response has no body).
    pub(crate) fn is_head(&self) -> bool {
        self.method == Method::HEAD
    }

    /// The request for the general handler.
    fn into_request(self, spans: &[Span]) -> Result<Request<Option<Incoming>>, ()> {
        let mut headers = header_map(&self.head, spans, 1).ok_or(())?;
        if let Some(id) = self.request_id
            && let Ok(v) = HeaderValue::from_bytes(&id)
        {
            headers.insert("x-request-id", v);
        }
        let mut r = Request::new(None);
        *r.method_mut() = self.method;
        *r.uri_mut() = self.uri;
        *r.version_mut() = Version::HTTP_11;
        *r.headers_mut() = headers;
        Ok(r)
    }
}

/// What the client gets.
pub(crate) enum Answer {
    /// An upstream response to copy through.
    Direct(Direct),
    /// A response from the general handler (or a local one).
    General(Response<RespBody>),
}

/// An upstream response forwarded field by field.
pub(crate) struct Direct {
    head: RawHead,
    body: H1Body,
    /// A `Content-Length` a transfer coding overrides, not to be copied.
    drop_length: bool,
    /// `Server`, and `Strict-Transport-Security` when the route sets it on TLS.
    rules: ResponseRules,
    /// Route and upstream, when access logging.
    logged: Option<Box<(RouteSeen, UpstreamSeen)>>,
}

/// Whether a `Host` value can be routed here as it is: what `HeaderValue::to_str` (the general
/// handler's view) accepts.
fn plain_host(v: &[u8]) -> Option<&str> {
    if v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        std::str::from_utf8(v).ok()
    } else {
        None
    }
}

/// The hash of a direct-path request for a pool that hashes the client or the URI.
fn direct_key(b: &BalancePolicy, conn: &ConnInfo, req: &FastReq) -> Option<u64> {
    let BalancePolicy::Hash(key) = b else {
        return None;
    };
    let uri = req.uri.path_and_query().map_or("/", |p| p.as_str());
    let none = |_: &str| None;
    request_hash(
        key,
        &KeySource {
            client_ip: conn.remote.ip(),
            uri,
            header: &none,
        },
    )
}

/// Handles a fast-path request. Loads the route table once. `spans` locate the request's
/// fields in `req.head`; after a [`Answer::Direct`] they locate the response's. `timer` is the
/// connection's own, idle while a request is in flight: the request deadline runs on it (see
/// `forward`).
pub(crate) async fn dispatch(
    dp: &DataPlane,
    conn: &ConnInfo,
    req: FastReq,
    spans: &mut Vec<Span>,
    timer: Pin<&mut Sleep>,
) -> Answer {
    let started = Instant::now();
    let table = dp.routes();
    if req.hosts == 1
        && let Some(raw_host) = plain_host(&req.head[req.host.0..req.host.1])
        && valid_request_host(raw_host)
    {
        let mut buf = HostBuf::default();
        let host = normalize_request_host(raw_host, &mut buf);
        // A path that is not already normal and its own route view (escapes, `;`, `\`, `//`,
        // dot segments) is rewritten or refused by the general handler; the common one is
        // routed here as it is.
        let client = DirectClient {
            trusted: conn.trusted,
            tls: conn.tls,
            addr: conn.remote.ip(),
        };
        if matches!(
            request_path::normalize(req.uri.path()),
            Ok(std::borrow::Cow::Borrowed(_))
        ) && let Some(action) = table.lookup(host, req.uri.path())
            && let Some(cluster) = table.direct(action, client)
        {
            return forward(dp, conn, action, cluster, req, spans, (started, timer)).await;
        }
    }
    match req.into_request(spans) {
        // Boxed: the general handler's future is several times the size of the direct
        // path's, and every fast-path request's future would otherwise carry (and move) it.
        Ok(r) => Answer::General(Box::pin(handle_in(&table, dp, conn, r, started)).await),
        // As for any malformed head: answered, then the connection ends.
        Err(()) => Answer::General(Local::InvalidField.response()),
    }
}

/// The upstream request head: the request line, the client's end-to-end fields as they came,
/// the proxy headers, and `Content-Length: 0` where the general path would send one. The
/// client's lines are copied whole, adjacent kept lines in one piece; a head whose lines do
/// not all end in CRLF is copied field by field instead.
fn request_head(req: &FastReq, spans: &[Span], fwd: &ProxyHeaders<'_>) -> Bytes {
    let head = &req.head[..];
    let target = req.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = BytesMut::with_capacity(head.len() + 256);
    out.put_slice(req.method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    let whole_lines = field::lines_contiguous(head, spans);
    let mut seen = ClientFields::default();
    let mut had_length = false;
    let mut run = Run::default();
    for (i, (name, value)) in fields(head, spans).enumerate() {
        let kind = Field::of(name);
        seen.note(kind, value);
        had_length |= kind == Field::ContentLength;
        if hop::is_hop(kind, value) || kind == Field::ContentLength || !fwd.keeps(kind, name) {
            continue;
        }
        if whole_lines {
            run.keep(head, field::line(head, spans, i), &mut out);
        } else {
            put_field(&mut out, name, value);
        }
    }
    run.flush(head, &mut out);
    fwd.write_own(&mut out, &seen, fields(head, spans));
    if empty_body_says_length(&req.method, had_length) {
        put_field(&mut out, b"content-length", b"0");
    }
    out.put_slice(b"\r\n");
    out.freeze()
}

/// Sends the request to `cluster` and reads the answer's head raw, by `started` plus the
/// request timeout.
///
/// The deadline runs on the connection's `timer` rather than a timer of the request's own: a
/// new timer is entered in tokio's timer wheel when first polled and taken out when dropped,
/// two takes of the wheel's lock per request. The connection's timer, last set for the wait
/// that brought this request (usually a second or less ahead), is only moved later, which
/// tokio does without the lock. An answer within that time never resets it; one that takes
/// longer finds the timer fired, checks the real deadline and sets the timer to it; a timer
/// set further ahead than the request's deadline is brought back to it first.
async fn forward(
    dp: &DataPlane,
    conn: &ConnInfo,
    action: &Action,
    cluster: &Cluster,
    req: FastReq,
    spans: &mut Vec<Span>,
    (started, mut timer): (Instant, Pin<&mut Sleep>),
) -> Answer {
    let s = &dp.settings;
    // Held until the response head is back, as on the general path.
    let Ok(_admitted) = action.admit(conn.remote.ip()) else {
        let resp = limited(s.limit_status);
        return Answer::General(finish(dp, conn, action, resp, true, started));
    };
    let request_timeout = action.request_timeout.unwrap_or(s.request_timeout);
    let mut fwd = conn.proxy_headers();
    fwd.request_id = req.request_id;
    fwd.underscores = action.underscores_in_headers;
    let up_head = request_head(&req, spans, &fwd);
    let head_request = req.is_head();
    let local_answer = |resp| Answer::General(finish(dp, conn, action, resp, true, started));
    let answer = {
        let exchange = retry::exchange_h1(
            cluster,
            &up_head,
            ReqBody::empty(),
            ReqFraming::Empty,
            Plan::new(
                &req.method,
                &action.next_upstream,
                s.upstream_tries,
                direct_key(&cluster.balance, conn, &req),
            ),
            |c, cx| c.poll_raw_head(cx, spans),
            started,
        );
        // Pinned where it is made and raced against the deadline by hand: wrapping it in
        // `timeout` moved the (kilobyte-sized) future twice more per request. The deadline comes
        // from the instant already read.
        tokio::pin!(exchange);
        let deadline = tokio::time::Instant::from_std(started) + request_timeout;
        if timer.deadline() > deadline {
            // Set for a longer wait (a head that came in pieces): the request's is nearer.
            timer.as_mut().reset(deadline);
        }
        let answer = poll_fn(|cx| {
            loop {
                if let Poll::Ready(r) = exchange.as_mut().poll(cx) {
                    return Poll::Ready(Ok(r));
                }
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Poll::Ready(Err(()));
                }
                // The wait's time ran out, not the request's.
                timer.as_mut().reset(deadline);
            }
        });
        answer.await
    };
    let answer = match answer {
        Err(()) => return local_answer(timed_out(&cluster.name, request_timeout)),
        Ok(Err(e)) => return local_answer(error_response(&cluster.name, &e)),
        Ok(Ok(a)) => a,
    };
    let H1Answer {
        head,
        conn: upconn,
        upload,
        in_flight,
        endpoint,
        answered,
        retries,
    } = answer;
    if head.status == StatusCode::SWITCHING_PROTOCOLS {
        // Nobody asked to switch: passing it on would leave the client speaking a protocol we
        // do not tunnel. The connection is dropped with `upconn`.
        return local_answer(unasked_switch(&cluster.name));
    }
    let f = match framing_of(
        head.status,
        head.version,
        fields(&head.bytes, spans),
        head_request,
    ) {
        Ok(f) => f,
        Err(e) => {
            retry::count_against(&endpoint, &e);
            let e = e.at(endpoint.addr);
            return local_answer(error_response(&cluster.name, &e));
        }
    };
    action.stats.record(
        head.status.as_u16(),
        answered.saturating_duration_since(started),
    );
    cluster
        .stats
        .response_duration
        .observe(answered.saturating_duration_since(started));
    let logged = dp.access_log().map(|_| {
        Box::new((
            action.names.clone(),
            UpstreamSeen {
                addr: endpoint.addr,
                status: head.status.as_u16(),
                duration: answered.saturating_duration_since(started),
                retries,
            },
        ))
    });
    Answer::Direct(Direct {
        body: H1Body::new(upconn, f.framing, f.keep_alive, in_flight, upload),
        head,
        drop_length: f.drop_length,
        rules: ResponseRules::copied(ResponseRules::hsts(conn, action)),
        logged,
    })
}

impl Direct {
    /// What the access log says of this answer (the body's length comes from the written
    /// head's framing).
    pub(crate) fn answered(&self) -> access_log::Answered {
        access_log::Answered {
            status: self.head.status.as_u16(),
            bytes: None,
            route: self.logged.as_ref().map(|l| l.0.clone()),
            upstream: self.logged.as_ref().map(|l| l.1),
        }
    }

    /// Writes the response head into `out` (what [`crate::handler::general`]'s general path would send
    /// for the same answer) and returns the body with its framing.
    pub(crate) fn write_head(
        self,
        out: &mut BytesMut,
        spans: &[Span],
        head_request: bool,
        close: bool,
    ) -> (H1Body, BodyFraming) {
        let Direct {
            head,
            body,
            drop_length,
            rules,
            logged: _,
        } = self;
        let bytes = &head.bytes[..];
        // Rare: a `Connection` header naming other fields, which are hop-by-hop too.
        let named = fields(bytes, spans)
            .any(|(n, v)| Field::of(n) == Field::Connection && hop::names_other_fields(v));
        let listed = |name: &[u8]| {
            named
                && fields(bytes, spans)
                    .any(|(n, v)| Field::of(n) == Field::Connection && value_lists(v, name))
        };
        let dropped = |kind: Field, value: &[u8]| {
            hop::is_hop(kind, value)
                || rules.replaces(kind)
                || (drop_length && kind == Field::ContentLength)
        };
        let mut w = HeadWriter::new(out, head.status);
        // Whole lines, adjacent ones in one copy, when every line ends in CRLF; else field by
        // field. `Content-Length` always goes through the writer, which checks it and
        // remembers the length.
        let whole_lines = field::lines_contiguous(bytes, spans);
        let mut run = Run::default();
        for (i, (name, value)) in fields(bytes, spans).enumerate() {
            let kind = Field::of(name);
            if dropped(kind, value) || listed(name) {
                continue;
            }
            if !whole_lines || kind == Field::ContentLength {
                run.flush(bytes, w.out());
                w.field(name, value);
            } else {
                if kind == Field::Date {
                    w.has_date();
                }
                run.keep(bytes, field::line(bytes, spans, i), w.out());
            }
        }
        run.flush(bytes, w.out());
        rules.write(&mut w);
        let framing = w.finish(
            head_request,
            http_body::Body::size_hint(&body).exact(),
            close,
            false,
        );
        (body, framing)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::server::fastpath::{Parsed, parse};

    /// The upstream head for a raw client head, as the direct path writes it.
    fn upstream_head(raw: &str) -> String {
        let mut buf = BytesMut::from(raw);
        let mut spans = Vec::new();
        let Ok(Parsed::Fast(req)) = parse(&mut buf, &mut spans, 8192) else {
            panic!("not a fast-path head: {raw:?}");
        };
        let (ip, port) = (
            HeaderValue::from_static("10.0.0.9"),
            HeaderValue::from_static("80"),
        );
        let fwd = ProxyHeaders {
            client_ip: &ip,
            tls: false,
            port: &port,
            request_id: None,
            trusted: true,
            underscores: false,
        };
        String::from_utf8(request_head(&req, &spans, &fwd).to_vec()).unwrap()
    }

    #[test]
    fn client_lines_are_copied_as_they_came_without_hop_by_hop_or_replaced_ones() {
        let raw = "GET /a?b HTTP/1.1\r\nHost: x.example\r\nConnection: keep-alive\r\n\
                   User-Agent: t\r\nKeep-Alive: 5\r\nX-Forwarded-For: 1.1.1.1\r\nAccept: */*\r\n\
                   X-Forwarded-Proto: spoof\r\nX-Request-ID: id1\r\nTE: trailers\r\n\
                   Content-Length: 0\r\n\r\n";
        let out = upstream_head(raw);
        assert_eq!(
            out,
            "GET /a?b HTTP/1.1\r\nHost: x.example\r\nUser-Agent: t\r\nAccept: */*\r\n\
             X-Request-ID: id1\r\nTE: trailers\r\nx-forwarded-for: 1.1.1.1, 10.0.0.9\r\nx-real-ip: 10.0.0.9\r\n\
             x-forwarded-proto: http\r\nx-forwarded-host: x.example\r\nx-forwarded-port: 80\r\n\
             content-length: 0\r\n\r\n"
        );
        // Bare-LF line ends: field by field, to the same head.
        assert_eq!(upstream_head(&raw.replace("\r\n", "\n")), out);
    }

    #[test]
    fn a_request_id_is_generated_and_a_body_less_post_says_its_length() {
        let out = upstream_head("POST /f HTTP/1.1\r\nHost: h\r\n\r\n");
        let id = out
            .split("\r\n")
            .find_map(|l| l.strip_prefix("x-request-id: "))
            .unwrap();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{out}"
        );
        assert!(out.ends_with("\r\ncontent-length: 0\r\n\r\n"), "{out}");
        assert!(out.starts_with(
            "POST /f HTTP/1.1\r\nHost: h\r\nx-forwarded-for: 10.0.0.9\r\nx-real-ip: 10.0.0.9\r\n"
        ));
    }
}
