//! The request body on its way upstream: the client's body (from hyper), streamed with a size
//! limit. It neither boxes nor buffers.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::error::{Error, Kind};

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
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
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
                        return Poll::Ready(Some(Err(Error::new(Kind::RequestBodyTooLarge(
                            this.limit,
                        )))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::caused(Kind::ClientBody, e)))),
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
