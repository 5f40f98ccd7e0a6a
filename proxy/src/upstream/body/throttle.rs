//! Response bandwidth limits (ingress-nginx's `limit-rate` and `limit-rate-after`, nginx's
//! `limit_rate`/`limit_rate_after`): per response, the first `after` bytes go at full speed,
//! the rest at `rate` bytes a second on average. Frames are cut into pieces of a tenth of a
//! second's worth so that the pace is smooth, and the wait falls between pieces, never inside
//! the upstream read: a slow-to-drain client still holds only one piece.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::RespBody;
use crate::error::Error;

/// A response body paced to a byte rate.
#[derive(Debug)]
pub struct Throttled {
    inner: RespBody,
    rate: u64,
    after: u64,
    sent: u64,
    /// When the first limited byte went.
    limited_since: Option<Instant>,
    pending: Option<Bytes>,
    wait: Option<Pin<Box<Sleep>>>,
}

impl Throttled {
    /// Paces `inner` to `rate` bytes a second after its first `after` bytes. A zero rate is
    /// treated as one byte a second (callers do not throttle at rate zero: it means "off").
    pub fn new(inner: RespBody, rate: u64, after: u64) -> Self {
        Self {
            inner,
            rate: rate.max(1),
            after,
            sent: 0,
            limited_since: None,
            pending: None,
            wait: None,
        }
    }

    /// Splits off what may go now; the rest waits for the next poll.
    fn piece(&mut self, mut data: Bytes) -> Bytes {
        let free = self.after.saturating_sub(self.sent);
        let cap = if free > 0 {
            free
        } else {
            (self.rate / 10).max(512)
        };
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        if data.len() > cap {
            self.pending = Some(data.split_off(cap));
        }
        let now = Instant::now();
        self.sent += data.len() as u64;
        if self.sent > self.after {
            // Each piece is due when the limited bytes so far would have taken at the rate.
            let since = *self.limited_since.get_or_insert(now);
            let limited = self.sent - self.after;
            let due = since + Duration::from_secs_f64(limited as f64 / self.rate as f64);
            if due > now {
                self.wait = Some(Box::pin(tokio::time::sleep_until(due)));
            }
        }
        data
    }
}

impl Body for Throttled {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        if let Some(w) = &mut this.wait {
            ready!(w.as_mut().poll(cx));
            this.wait = None;
        }
        let data = match this.pending.take() {
            Some(d) => d,
            None => match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(d) => d,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                other => return Poll::Ready(other),
            },
        };
        Poll::Ready(Some(Ok(Frame::data(this.piece(data)))))
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let pending = self.pending.as_ref().map_or(0, |p| p.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + pending);
        if let Some(u) = inner.upper() {
            hint.set_upper(u + pending);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn the_first_bytes_go_at_once_and_the_rest_at_the_rate() {
        let body = RespBody::full(vec![b'x'; 30_000]);
        let mut t = Throttled::new(body, 10_000, 10_000);
        let start = Instant::now();
        let mut got = 0;
        let mut first_free = None;
        while let Some(f) = t.frame().await {
            got += f
                .unwrap_or_else(|e| panic!("{e}"))
                .into_data()
                .map_or(0, |d| d.len());
            if got >= 10_000 && first_free.is_none() {
                first_free = Some(start.elapsed());
            }
        }
        assert_eq!(got, 30_000);
        assert_eq!(
            first_free,
            Some(Duration::ZERO),
            "limit-rate-after bytes are free"
        );
        // 20,000 limited bytes at 10,000/s: 2 s, less the last piece's own wait.
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(1_800) && took <= Duration::from_millis(2_100),
            "{took:?}"
        );
    }
}
