//! Writes held until the connection's task comes round again, so that the HTTP/2 answers that
//! are ready together leave in one TLS record and one system call.
//!
//! Why: the `h2` crate flushes its codec before every frame that follows a DATA frame whose
//! payload it passes by reference (any payload of 256 bytes or more), so a connection with ten
//! answers ready writes ten times: ten `writev`s and ten TLS records, each record with its own
//! header, tag and encryption set-up. On loopback under load the client-side `writev`s alone were
//! 17% of the proxy's CPU. nginx writes one answer per system call too; writing several at once
//! is where a proxy can do less work than nginx per request without doing less.
//!
//! How: with holding on, a write copies into a buffer and succeeds at once; a flush with
//! something held succeeds at once too and wakes the task, which the runtime then polls again
//! after the tasks already queued (the other connections, and the upstream reads that bring the
//! answers of this connection's streams, which run in its task: `server/streams.rs`).
//! The held bytes go out first thing on that next turn: before any read, and before the stream
//! is shut down. The wake makes the next turn certain; `h2` reads on every turn of an open
//! connection, and flushes then shuts down the stream on every close. The cost is one more poll
//! of the connection after a burst, and up to one scheduler round of delay for its answers.
//!
//! Bounded: a write takes at most what fits under [`HOLD_MAX`] held bytes, and past that waits
//! for the socket like any other, so a client that does not read still pushes back on the
//! streams that write to it; bytes already sent are dropped from the buffer's front as new ones
//! arrive, so a long answer never accumulates.
//!
//! Only HTTP/2: holding starts once the client's first bytes are the HTTP/2 preface. A client
//! that chose h2 in the TLS handshake but speaks HTTP/1 is served by hyper's HTTP/1 code, which
//! does not read on every turn; its writes pass straight through.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Held bytes beyond which writes wait for the socket: four full TLS records.
pub const HOLD_MAX: usize = 64 * 1024;

/// The buffer's first size: one full TLS record, enough for a burst of small answers without
/// growing.
const HOLD_FIRST: usize = 16 * 1024;

/// The HTTP/2 connection preface: holding starts only once the client has sent it.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether writes are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Never: the connection started with something other than the preface (HTTP/1).
    Off,
    /// Not yet: this many bytes of the HTTP/2 preface have been read so far. A client that
    /// chose h2 in the TLS handshake and then speaks HTTP/1 (which hyper serves) is never
    /// held: hyper's HTTP/1 code does not read on every turn, and a 101's bytes would be
    /// handed on inside the upgraded stream.
    Unsure(usize),
    /// Yes: the client sent the preface.
    On,
}

/// `inner` with its writes held until the task's next turn (once the client has shown it
/// speaks HTTP/2), or passed straight through (HTTP/1, where one answer at a time is all a
/// connection has).
#[derive(Debug)]
pub struct Coalesce<I> {
    inner: I,
    /// Bytes written to this stream and not yet to `inner`, from `sent` on.
    held: Vec<u8>,
    sent: usize,
    /// A flush was promised: `held` (possibly empty) must reach `inner` and `inner` must be
    /// flushed before anything else is read or written.
    owed: bool,
    hold: Hold,
}

impl<I> Coalesce<I> {
    /// Wraps `inner`; writes are held once the HTTP/2 preface has been read from it, and
    /// pass straight through on a connection that starts any other way.
    pub fn new(inner: I) -> Self {
        Self {
            inner,
            held: Vec::new(),
            sent: 0,
            owed: false,
            hold: Hold::Unsure(0),
        }
    }

    /// Bytes held and not yet written to `inner`.
    fn pending(&self) -> usize {
        self.held.len() - self.sent
    }

    /// Follows the preface through the bytes just read (`read`): holding turns on when it is
    /// complete, and off for good at the first byte that differs.
    fn saw(&mut self, read: &[u8]) {
        if let Hold::Unsure(matched) = self.hold {
            let want = &PREFACE[matched..];
            let n = want.len().min(read.len());
            self.hold = if read[..n] != want[..n] {
                Hold::Off
            } else if matched + n == PREFACE.len() {
                Hold::On
            } else {
                Hold::Unsure(matched + n)
            };
        }
    }

    /// Copies as much of `bufs` as fits under [`HOLD_MAX`] behind what is held, and says how
    /// much. Bytes already sent are dropped from the front first, so that a long answer to a
    /// client that keeps the socket nearly full does not accumulate in the buffer. The buffer
    /// is taken at its first size on first use, and grows past it only for a larger burst.
    fn hold(&mut self, bufs: &[io::IoSlice<'_>]) -> usize {
        if self.sent > 0 {
            self.held.drain(..self.sent);
            self.sent = 0;
        }
        let mut room = HOLD_MAX.saturating_sub(self.held.len());
        let n: usize = bufs.iter().map(|b| b.len()).sum::<usize>().min(room);
        if self.held.capacity() == 0 {
            self.held.reserve(HOLD_FIRST.max(n));
        }
        for b in bufs {
            let take = b.len().min(room);
            self.held.extend_from_slice(&b[..take]);
            room -= take;
            if room == 0 {
                break;
            }
        }
        n
    }
}

impl<I: AsyncWrite + Unpin> Coalesce<I> {
    /// Writes everything held to `inner` and flushes it. The buffer is freed once empty, so an
    /// idle connection holds none.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        if self.held.capacity() > 0 {
            self.held = Vec::new();
            self.sent = 0;
        }
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        self.owed = false;
        Poll::Ready(Ok(()))
    }

    /// Room for more: below [`HOLD_MAX`] held, after trying to send what is.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending() >= HOLD_MAX {
            if let Poll::Ready(Err(e)) = self.poll_send(cx) {
                return Poll::Ready(Err(e));
            }
            if self.pending() >= HOLD_MAX {
                // `inner` returned Pending and will wake the task when it can take more.
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncRead for Coalesce<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A new turn: what the last one held goes out first. If the socket is full the read
        // goes ahead anyway (`inner` wakes the task when it has room).
        if this.owed
            && let Poll::Ready(Err(e)) = this.poll_send(cx)
        {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(this.hold, Hold::Unsure(_)) {
            this.saw(&buf.filled()[before..]);
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Coalesce<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.hold != Hold::On {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        ready!(this.poll_room(cx))?;
        Poll::Ready(Ok(this.hold(bufs)))
    }

    fn is_write_vectored(&self) -> bool {
        // Held writes take any number of slices in one call (and `h2` then passes large
        // payloads by reference instead of copying them into its own buffer first).
        self.hold == Hold::On || self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.hold != Hold::On || (this.pending() == 0 && !this.owed) {
            return Pin::new(&mut this.inner).poll_flush(cx);
        }
        if !this.owed {
            // Promised for the next turn, which this wake makes certain.
            this.owed = true;
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.owed || this.pending() > 0 {
            ready!(this.poll_send(cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    /// Counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (Arc::clone(&c), Waker::from(c))
    }

    /// A socket that records each write, takes at most `room` bytes, reads `incoming`, and
    /// fails writes once `broken`.
    #[derive(Default)]
    struct Sock {
        writes: Vec<Vec<u8>>,
        room: usize,
        flushes: usize,
        shut: bool,
        broken: bool,
        incoming: Vec<u8>,
    }

    impl Sock {
        fn with_room(room: usize) -> Self {
            Self {
                room,
                ..Self::default()
            }
        }
        fn written(&self) -> Vec<u8> {
            self.writes.concat()
        }
    }

    impl AsyncRead for Sock {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if this.incoming.is_empty() {
                return Poll::Pending;
            }
            buf.put_slice(&std::mem::take(&mut this.incoming));
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Sock {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            if this.broken {
                return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
            }
            let n = buf.len().min(this.room);
            if n == 0 {
                return Poll::Pending;
            }
            this.room -= n;
            this.writes.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().flushes += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    fn write(c: &mut Coalesce<Sock>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(c).poll_write(cx, b)
    }

    fn flush(c: &mut Coalesce<Sock>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(c).poll_flush(cx)
    }

    fn read(c: &mut Coalesce<Sock>, cx: &mut Context<'_>) -> Poll<io::Result<Vec<u8>>> {
        let mut mem = [0u8; 64];
        let mut buf = ReadBuf::new(&mut mem);
        Pin::new(c)
            .poll_read(cx, &mut buf)
            .map_ok(|()| buf.filled().to_vec())
    }

    /// A held stream over `Sock::with_room(room)` whose client has sent the HTTP/2 preface.
    fn held(room: usize) -> Coalesce<Sock> {
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = Coalesce::new(Sock::with_room(room));
        c.inner.incoming = PREFACE.to_vec();
        assert!(read(&mut c, &mut cx).is_ready());
        assert_eq!(c.hold, Hold::On);
        c
    }

    #[test]
    fn holding_starts_once_the_preface_is_read_even_in_pieces() {
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = Coalesce::new(Sock::with_room(usize::MAX));
        // Before the preface (hyper's first read): straight through.
        assert!(write(&mut c, &mut cx, b"early").is_ready());
        assert_eq!(c.inner.writes.len(), 1);
        for piece in [&PREFACE[..5], &PREFACE[5..20], &PREFACE[20..]] {
            assert_ne!(c.hold, Hold::On);
            c.inner.incoming = piece.to_vec();
            assert!(read(&mut c, &mut cx).is_ready());
        }
        assert_eq!(c.hold, Hold::On);
        assert!(write(&mut c, &mut cx, b"held").is_ready());
        assert!(flush(&mut c, &mut cx).is_ready());
        assert_eq!(c.inner.writes.len(), 1);
    }

    #[test]
    fn a_client_that_chose_h2_but_speaks_http1_is_never_held() {
        let (wakes, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = Coalesce::new(Sock::with_room(usize::MAX));
        c.inner.incoming = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec();
        assert!(read(&mut c, &mut cx).is_ready());
        assert_eq!(c.hold, Hold::Off);
        // Not even if the preface follows.
        c.inner.incoming = PREFACE.to_vec();
        assert!(read(&mut c, &mut cx).is_ready());
        assert_eq!(c.hold, Hold::Off);
        assert!(write(&mut c, &mut cx, b"HTTP/1.1 200 OK").is_ready());
        assert!(flush(&mut c, &mut cx).is_ready());
        assert_eq!(c.inner.writes, vec![b"HTTP/1.1 200 OK".to_vec()]);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn answers_flushed_in_one_turn_leave_in_one_write_on_the_next() {
        let (wakes, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = held(usize::MAX);
        for answer in [&b"one "[..], b"two ", b"three"] {
            assert!(matches!(write(&mut c, &mut cx, answer), Poll::Ready(Ok(_))));
            assert!(flush(&mut c, &mut cx).is_ready());
        }
        // Nothing reached the socket yet; the task was woken once to come back for it.
        assert!(c.inner.writes.is_empty());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        // The next turn starts with a read: the held bytes go first, in one write, in order.
        c.inner.incoming = b"request".to_vec();
        let got = read(&mut c, &mut cx);
        assert!(matches!(got, Poll::Ready(Ok(ref b)) if b == b"request"));
        assert_eq!(c.inner.writes, vec![b"one two three".to_vec()]);
        assert_eq!(c.inner.flushes, 1);
        // And the buffer is given back: an idle connection holds none.
        assert_eq!(c.held.capacity(), 0);
        // A turn with nothing to write neither writes nor wakes.
        assert!(read(&mut c, &mut cx).is_pending());
        assert_eq!(c.inner.writes.len(), 1);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn off_it_passes_every_call_straight_through() {
        let (wakes, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = Coalesce::new(Sock::with_room(usize::MAX));
        // An HTTP/1 connection: its first bytes are not the preface.
        c.inner.incoming = b"GET / HTTP/1.1\r\n".to_vec();
        assert!(read(&mut c, &mut cx).is_ready());
        for answer in [&b"one"[..], b"two"] {
            assert!(matches!(write(&mut c, &mut cx, answer), Poll::Ready(Ok(3))));
            assert!(flush(&mut c, &mut cx).is_ready());
        }
        assert_eq!(c.inner.writes, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(c.inner.flushes, 2);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        assert!(!c.is_write_vectored());
    }

    #[test]
    fn shutdown_sends_what_is_held_first() {
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = held(usize::MAX);
        assert!(write(&mut c, &mut cx, b"GOAWAY").is_ready());
        assert!(flush(&mut c, &mut cx).is_ready());
        assert!(Pin::new(&mut c).poll_shutdown(&mut cx).is_ready());
        assert_eq!(c.inner.written(), b"GOAWAY");
        assert!(c.inner.shut);
    }

    #[test]
    fn a_client_that_reads_nothing_holds_at_most_the_bound() {
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        // The socket takes 1,000 bytes and then no more.
        let mut c = held(1000);
        let chunk = vec![7u8; 4096];
        let mut accepted = 0;
        while let Poll::Ready(Ok(n)) = write(&mut c, &mut cx, &chunk) {
            accepted += n;
            assert!(c.pending() <= HOLD_MAX, "{}", c.pending());
        }
        // Writes wait once the bound is reached, with the socket's share sent.
        assert_eq!(c.pending(), HOLD_MAX);
        assert_eq!(accepted, HOLD_MAX + 1000);
        assert_eq!(c.inner.written().len(), 1000);
        assert!(write(&mut c, &mut cx, &chunk).is_pending());
        // Room again: everything held leaves in order when the next turn reads.
        c.inner.room = usize::MAX;
        assert!(flush(&mut c, &mut cx).is_ready());
        assert!(read(&mut c, &mut cx).is_pending());
        assert_eq!(c.inner.written().len(), accepted);
        assert!(c.inner.written().iter().all(|b| *b == 7));
    }

    #[test]
    fn one_large_write_is_taken_only_up_to_the_bound() {
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = held(0);
        assert!(write(&mut c, &mut cx, &[1u8; 1000]).is_ready());
        let big = vec![2u8; 1 << 20];
        let n = match write(&mut c, &mut cx, &big) {
            Poll::Ready(Ok(n)) => n,
            other => panic!("{other:?}"),
        };
        assert_eq!(n, HOLD_MAX - 1000);
        assert_eq!(c.pending(), HOLD_MAX);
    }

    #[test]
    fn a_long_answer_to_a_client_that_keeps_the_socket_nearly_full_does_not_pile_up() {
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = held(0);
        let chunk = vec![9u8; 16 * 1024];
        let mut total = 0;
        // 64 MB through a socket that takes 10 KB per turn, written whenever there is room.
        while total < (64 << 20) {
            c.inner.room = 10 * 1024;
            assert!(matches!(
                read(&mut c, &mut cx),
                Poll::Pending | Poll::Ready(Ok(_))
            ));
            while let Poll::Ready(Ok(n)) = write(&mut c, &mut cx, &chunk) {
                total += n;
                assert!(flush(&mut c, &mut cx).is_ready());
            }
            assert!(c.held.len() <= HOLD_MAX, "{} held", c.held.len());
            assert!(
                c.held.capacity() <= 2 * HOLD_MAX,
                "{} capacity",
                c.held.capacity()
            );
        }
        // Sent in order, nothing lost.
        assert!(c.inner.written().iter().all(|b| *b == 9));
    }

    #[test]
    fn a_socket_full_at_the_next_turn_is_tried_again_at_the_one_after() {
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = held(0);
        assert!(write(&mut c, &mut cx, b"answer").is_ready());
        assert!(flush(&mut c, &mut cx).is_ready());
        // Full: the read still goes ahead, and the flush stays owed.
        c.inner.incoming = b"more".to_vec();
        assert!(matches!(read(&mut c, &mut cx), Poll::Ready(Ok(_))));
        assert!(c.owed && c.inner.writes.is_empty());
        c.inner.room = usize::MAX;
        assert!(read(&mut c, &mut cx).is_pending());
        assert_eq!(c.inner.written(), b"answer");
        assert!(!c.owed);
    }

    #[test]
    fn a_broken_socket_fails_the_next_read() {
        let (_, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut c = held(usize::MAX);
        assert!(write(&mut c, &mut cx, b"answer").is_ready());
        assert!(flush(&mut c, &mut cx).is_ready());
        c.inner.broken = true;
        c.inner.incoming = b"more".to_vec();
        assert!(
            matches!(read(&mut c, &mut cx), Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset)
        );
    }
}
