//! Idle and first-request deadlines for connections that hyper serves (HTTP/2, h2c, HTTP/1
//! with bodies) and for tunnels: a stream wrapper that notes when the client last sent
//! anything, and a watchdog that says when the connection is to end (the server asks an idle
//! one to end gracefully first, `server/ending.rs`; one that never sent a request is dropped):
//!
//! - it has not sent more than a connection preface within the header timeout (a client that
//!   sends `PRI * HTTP/2.0` and waits, holding a connection slot), or
//! - nothing has crossed it, either way, for the idle timeout (an idle HTTP/2 connection, a
//!   silent tunnel; nginx's `keepalive_timeout` and `proxy_read_timeout` play these roles). A
//!   response still being written keeps a connection alive.
//!
//! The HTTP/1 fast path has its own header and keep-alive deadlines and is not wrapped; the
//! wrapper costs one clock read per read call, on these connections only.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::clock::now_nanos;

/// Bytes a client must send beyond this before the header timeout (the HTTP/2 preface is 24).
const PREFACE: u64 = 24;

/// What [`Activity::expired`] says of a connection silent for the idle timeout (the other
/// reason, no request in time, is a timeout the connection is dropped for without a goodbye).
pub const IDLE_TIMEOUT: &str = "idle timeout";

/// What the watchdog reads.
#[derive(Debug)]
pub struct Activity {
    started: u64,
    last_io: AtomicU64,
    bytes_read: AtomicU64,
}

impl Activity {
    /// A fresh record (the connection starts now).
    pub fn new() -> Arc<Self> {
        let now = now_nanos();
        Arc::new(Self {
            started: now,
            last_io: AtomicU64::new(now),
            bytes_read: AtomicU64::new(0),
        })
    }

    fn wrote(&self) {
        self.last_io.store(now_nanos(), Ordering::Relaxed);
    }

    fn read(&self, n: usize) {
        self.last_io.store(now_nanos(), Ordering::Relaxed);
        self.bytes_read
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Why the connection should be dropped now, if it should: `first` is the time allowed to
    /// send more than a preface, `idle` the longest silence.
    pub fn expired(&self, first: Duration, idle: Duration) -> Option<&'static str> {
        let now = now_nanos();
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if self.bytes_read.load(Ordering::Relaxed) <= PREFACE
            && now.saturating_sub(self.started) > nanos(first)
        {
            return Some("no request within the header timeout");
        }
        if now.saturating_sub(self.last_io.load(Ordering::Relaxed)) > nanos(idle) {
            return Some(IDLE_TIMEOUT);
        }
        None
    }

    /// Resolves when [`Activity::expired`] says so, checking a few times per `first`/`idle`.
    pub async fn watch(&self, first: Duration, idle: Duration) -> &'static str {
        let every = (first.min(idle) / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        loop {
            tokio::time::sleep(every).await;
            if let Some(why) = self.expired(first, idle) {
                return why;
            }
        }
    }
}

/// A stream whose reads are noted in an [`Activity`].
#[derive(Debug)]
pub struct Watched<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I> Watched<I> {
    /// Wraps `inner`.
    pub fn new(inner: I, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.activity.read(n);
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.wrote();
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.wrote();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A client stream whose writes fail with `TimedOut` when one stays blocked for longer than
/// the send timeout: a client that stops reading (a slow-read attack, or a dead peer behind a
/// silent network) cannot hold its connection — and the upstream connection feeding it —
/// forever (nginx's `send_timeout`, 60 s). Costs nothing while writes go through.
#[derive(Debug)]
pub struct SendDeadline<I> {
    inner: I,
    limit: Duration,
    /// The timer, made on the first blocked write and re-armed (not re-made) after that: a
    /// large response to a client that reads at its own pace blocks often.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl<I> SendDeadline<I> {
    /// Wraps `inner`.
    pub fn new(inner: I, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
            armed: false,
        }
    }

    fn check<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => {
                let limit = self.limit;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if !self.armed {
                    timer.as_mut().reset(tokio::time::Instant::now() + limit);
                    self.armed = true;
                }
                if timer.as_mut().poll(cx).is_ready() {
                    self.armed = false;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "client did not read for the send timeout",
                    )));
                }
                Poll::Pending
            }
            ready => {
                self.armed = false;
                ready
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for SendDeadline<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for SendDeadline<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, r)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(cx, r)
    }

    /// Under the deadline too: over TLS, closing writes (`close_notify`, and whatever records
    /// were still queued), and a client that stopped reading would hold the close forever.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Staging writes nothing; the flush that sends what was staged runs under the deadline.
impl<I: super::finish::Finish> super::finish::Finish for SendDeadline<I> {
    fn stage(&mut self, bytes: &[u8]) -> usize {
        self.inner.stage(bytes)
    }

    fn stage_close(&mut self) {
        self.inner.stage_close();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_write_the_client_does_not_read_fails_at_the_send_timeout() {
        let (client, server) = tokio::io::duplex(64);
        let mut w = SendDeadline::new(server, Duration::from_millis(200));
        // Fits the pipe: goes through at once.
        w.write_all(&[1u8; 64]).await.unwrap();
        let t = std::time::Instant::now();
        let e = w.write_all(&[2u8; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(200));
        drop(client);
    }

    /// A close that cannot finish (a TLS `close_notify` to a client that stopped reading)
    /// fails at the send timeout instead of holding the connection.
    #[tokio::test]
    async fn a_close_the_client_does_not_read_fails_at_the_send_timeout() {
        struct Stuck;
        impl AsyncWrite for Stuck {
            fn poll_write(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                b: &[u8],
            ) -> Poll<io::Result<usize>> {
                Poll::Ready(Ok(b.len()))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Pending
            }
        }
        let mut w = SendDeadline::new(Stuck, Duration::from_millis(200));
        let t = std::time::Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(5), w.shutdown()).await;
        let e = closed
            .expect("the close waited past the send timeout")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn a_client_that_reads_slowly_but_steadily_is_not_cut() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut w = SendDeadline::new(server, Duration::from_millis(200));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut got = 0;
            while got < 64 * 20 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                got += client.read(&mut buf).await.unwrap();
            }
            got
        });
        // Twenty pipe-fulls at a pace slower than the pipe: about a second in all, five times
        // the send timeout, but no single write waits that long.
        w.write_all(&[3u8; 64 * 20]).await.unwrap();
        assert_eq!(reader.await.unwrap(), 64 * 20);
    }

    #[tokio::test]
    async fn a_preface_alone_expires_at_the_header_timeout_and_silence_at_the_idle_timeout() {
        let (mut client, server) = tokio::io::duplex(1024);
        let act = Activity::new();
        let mut w = Watched::new(server, Arc::clone(&act));
        let (first, idle) = (Duration::from_millis(200), Duration::from_millis(400));
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(w.read(&mut buf).await.unwrap(), 24);
        assert_eq!(act.expired(first, idle), None);
        let t = std::time::Instant::now();
        assert_eq!(
            act.watch(first, idle).await,
            "no request within the header timeout"
        );
        assert!(t.elapsed() >= first);

        // A client that sends a request is then only held to the idle timeout.
        let act = Activity::new();
        let (mut c2, s2) = tokio::io::duplex(1024);
        let mut w = Watched::new(s2, Arc::clone(&act));
        c2.write_all(&[0u8; 100]).await.unwrap();
        let mut big = [0u8; 128];
        assert_eq!(w.read(&mut big).await.unwrap(), 100);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            act.expired(first, idle),
            None,
            "past the header timeout, not idle yet"
        );
        assert_eq!(act.watch(first, idle).await, "idle timeout");
    }
}
