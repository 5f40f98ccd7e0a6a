//! Body types: the request body forwarded upstream (streamed, with a size limit) and the response
//! body returned to the client (streamed from upstream, or a small local answer). Neither boxes
//! nor buffers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::endpoint::InFlight;
use crate::h1::{H1Body, H1Error};

/// Errors while streaming a body.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The request body went past `--max-body-size`.
    #[error("request body larger than {0} bytes")]
    TooLarge(u64),
    /// The underlying connection failed.
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    /// The HTTP/1.1 upstream connection failed or sent a malformed body.
    #[error(transparent)]
    Upstream(#[from] H1Error),
}

/// A request body on its way upstream.
#[derive(Debug)]
pub struct ReqBody {
    inner: Option<Incoming>,
    limit: u64,
    seen: u64,
}

impl ReqBody {
    /// Wraps a client body (none for a body-less request) with a size limit.
    pub fn new(inner: Option<Incoming>, limit: u64) -> Self {
        Self {
            inner,
            limit,
            seen: 0,
        }
    }

    /// An empty body (used to replay a body-less request).
    pub fn empty() -> Self {
        Self {
            inner: None,
            limit: 0,
            seen: 0,
        }
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.seen += d.len() as u64;
                    if this.seen > this.limit {
                        this.inner = None;
                        return Poll::Ready(Some(Err(BodyError::TooLarge(this.limit))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

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
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RespBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RespBody::H1(b) => Pin::new(b).poll_frame(cx).map_err(BodyError::Upstream),
            RespBody::H2 { inner, in_flight } => {
                let r = Pin::new(&mut *inner).poll_frame(cx);
                match &r {
                    Poll::Ready(None | Some(Err(_))) => *in_flight = None,
                    Poll::Ready(Some(Ok(_))) if inner.is_end_stream() => *in_flight = None,
                    _ => {}
                }
                r.map_err(BodyError::Hyper)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Full(b) => b.is_none(),
            RespBody::H1(b) => b.is_end_stream(),
            RespBody::H2 { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
            RespBody::H1(b) => b.size_hint(),
            RespBody::H2 { inner, .. } => inner.size_hint(),
        }
    }
}
