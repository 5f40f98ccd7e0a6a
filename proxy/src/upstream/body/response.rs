//! The response body for the client: streamed from an HTTP/1 or h2 upstream (ending the
//! endpoint's in-flight mark with it), or a small local answer. It neither boxes nor buffers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::error::{Error, Kind};
use crate::upstream::endpoint::InFlight;
use crate::upstream::h1::H1Body;

/// A response body for the client.
#[derive(Debug)]
pub enum RespBody {
    /// A local answer (error page, redirect, admin output).
    Full(Option<Bytes>),
    /// Streamed from an HTTP/1.1 upstream (the body owns its connection until it ends).
    H1(H1Body),
    /// Streamed from an HTTP/2 upstream.
    H2 {
        /// The upstream body.
        inner: Incoming,
        /// The endpoint's in-flight mark, ended with the body.
        in_flight: Option<InFlight>,
    },
    /// Paced to a byte rate (`limit-rate`).
    Throttled(Box<super::Throttled>),
}

impl RespBody {
    /// A local body.
    pub fn full(b: impl Into<Bytes>) -> Self {
        RespBody::Full(Some(b.into()))
    }

    /// An empty local body.
    pub fn empty() -> Self {
        RespBody::Full(None)
    }

    /// This body paced to `rate` bytes a second after its first `after` bytes.
    pub fn throttled(self, rate: u64, after: u64) -> Self {
        RespBody::Throttled(Box::new(super::Throttled::new(self, rate, after)))
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match self.get_mut() {
            RespBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RespBody::H1(b) => Pin::new(b).poll_frame(cx),
            RespBody::Throttled(b) => Pin::new(b.as_mut()).poll_frame(cx),
            RespBody::H2 { inner, in_flight } => {
                let r = Pin::new(&mut *inner).poll_frame(cx);
                match &r {
                    Poll::Ready(None | Some(Err(_))) => *in_flight = None,
                    Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => *in_flight = None,
                    _ => {}
                }
                r.map_err(|e| Error::caused(Kind::UpstreamH2, e))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Full(b) => b.is_none(),
            RespBody::H1(b) => b.is_end_stream(),
            RespBody::Throttled(b) => b.is_end_stream(),
            RespBody::H2 { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
            RespBody::H1(b) => b.size_hint(),
            RespBody::Throttled(b) => b.size_hint(),
            RespBody::H2 { inner, .. } => inner.size_hint(),
        }
    }
}
