//! A connection's last answer and its close, in as few writes as the transport allows.
//!
//! A TLS connection that ends after an answer (`Connection: close`) used to take three
//! system calls to say goodbye: a `writev` for the answer's record, another for the
//! `close_notify` alert (each one a loopback packet, a softirq and a wake-up of the client),
//! and a `shutdown` for the FIN. [`finish`] hands the answer to rustls without sending it,
//! queues `close_notify` behind it, and sends both records in one `writev`; the FIN then
//! leaves with `close` when the caller drops the socket. Under `sluice-bench tps` (a new
//! connection per request) that is one `writev` and one `shutdown` fewer per connection (five
//! `writev`s and a `shutdown` before, four after); the handshake rate itself, bound by the RSA
//! signature, did not move beyond the machine's noise.
//!
//! An answer cut short ends without `close_notify` ([`finish`] with `clean` false), and so does
//! a connection whose write failed (the caller drops it): the goodbye would tell the client a
//! cut body was whole, and would wait on a client that stopped reading.
//!
//! An idle connection that the server ends (keep-alive time over, shutdown) has no answer to
//! send: [`goodbye`] queues the close alone and tries once, so that a client that stopped
//! reading cannot hold the close.
//!
//! Not calling `shutdown` first changes nothing a client can see: the socket is closed right
//! after either way, and `close` sends the FIN just as `shutdown` would (or a RST in both cases,
//! if the client sent bytes that were never read).

use std::future::poll_fn;
use std::io::{self, Write};
use std::pin::Pin;
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// A stream that may hold a connection's last bytes and its close for one write.
pub trait Finish {
    /// Takes what it can of `bytes` to send with [`Finish::stage_close`]'s goodbye, without
    /// writing yet; returns how many it took. Plain sockets take none.
    fn stage(&mut self, _bytes: &[u8]) -> usize {
        0
    }

    /// Queues the protocol's goodbye (TLS `close_notify`) behind what was staged; the next
    /// flush sends them together. Plain sockets have none.
    fn stage_close(&mut self) {}
}

/// Sends `last`, then, for a `clean` answer, the protocol's goodbye, and flushes; the caller
/// drops the stream, which closes it. An answer cut short gets no goodbye: over TLS the missing
/// `close_notify` is how a client tells a cut body from a whole one when nothing else frames
/// it.
pub async fn finish<I>(io: &mut I, last: &[u8], clean: bool) -> io::Result<()>
where
    I: AsyncWrite + Unpin + Finish,
{
    let staged = if clean { io.stage(last) } else { 0 };
    io.write_all(last.get(staged..).unwrap_or_default()).await?;
    if clean {
        io.stage_close();
    }
    io.flush().await
}

/// Queues the protocol's goodbye on an idle connection and makes one attempt to send it: it
/// goes if the socket takes it now, and otherwise the caller drops the stream without it
/// (a client whose window is full of an earlier answer gets a bare close rather than holding
/// this one up to the send deadline).
pub async fn goodbye<I>(io: &mut I)
where
    I: AsyncWrite + Unpin + Finish,
{
    io.stage_close();
    let _ = poll_fn(|cx| Poll::Ready(Pin::new(&mut *io).poll_flush(cx))).await;
}

impl Finish for tokio::net::TcpStream {}

impl<I: Finish> Finish for Box<I> {
    fn stage(&mut self, bytes: &[u8]) -> usize {
        (**self).stage(bytes)
    }

    fn stage_close(&mut self) {
        (**self).stage_close();
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Finish for tokio_rustls::server::TlsStream<S> {
    fn stage(&mut self, bytes: &[u8]) -> usize {
        let conn = self.get_mut().1;
        if conn.is_handshaking() {
            return 0;
        }
        // rustls encrypts at once and keeps the record until the next write to the socket;
        // it takes less than all when its outgoing buffer limit is reached.
        conn.writer().write(bytes).unwrap_or(0)
    }

    fn stage_close(&mut self) {
        self.get_mut().1.send_close_notify();
    }
}

#[cfg(test)]
impl<R, W> Finish for tokio::io::Join<R, W> {}

#[cfg(test)]
impl Finish for tokio::io::DuplexStream {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::{PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A rustls server and client over a pipe, the handshake done.
    async fn pair() -> (
        tokio_rustls::server::TlsStream<tokio::io::DuplexStream>,
        tokio_rustls::client::TlsStream<tokio::io::DuplexStream>,
    ) {
        let provider = Arc::new(crate::crypto::provider());
        let ck = rcgen::generate_simple_self_signed(vec!["f.test".to_string()]).unwrap();
        let key = PrivateKeyDer::try_from(ck.signing_key.serialize_der()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![ck.cert.der().clone()], key)
            .unwrap();
        // The self-signed certificate is the client's one root.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ck.cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let (a, b) = tokio::io::duplex(4096);
        let accept = tokio_rustls::TlsAcceptor::from(Arc::new(server)).accept(a);
        let name = ServerName::try_from("f.test").unwrap();
        let connect = tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, b);
        let (s, c) = tokio::join!(accept, connect);
        (s.unwrap(), c.unwrap())
    }

    /// What the client reads to the end, and whether the end was a `close_notify`.
    async fn read_all(
        mut c: tokio_rustls::client::TlsStream<tokio::io::DuplexStream>,
    ) -> (Vec<u8>, bool) {
        let mut got = Vec::new();
        match c.read_to_end(&mut got).await {
            Ok(_) => (got, true),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => (got, false),
            Err(e) => panic!("{e}"),
        }
    }

    /// Bytes whose order shows: a staged part sent out of place would not compare equal.
    fn patterned(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn a_clean_end_sends_everything_then_close_notify_even_past_the_staging_room() {
        let (mut s, c) = pair().await;
        // rustls keeps at most 100 bytes unsent here: most of the answer is written, not staged.
        s.get_mut().1.set_buffer_limit(Some(100));
        let reader = tokio::spawn(read_all(c));
        // Some bytes already written the usual way, as `send_body` does before the last ones.
        let first = patterned(5_000);
        s.write_all(&first).await.unwrap();
        let answer = patterned(20_000);
        finish(&mut s, &answer, true).await.unwrap();
        drop(s);
        let (got, clean) = reader.await.unwrap();
        assert!(clean, "no close_notify");
        assert_eq!(got.len(), 25_000);
        assert!(
            got[..5_000] == first[..] && got[5_000..] == answer[..],
            "out of order"
        );
    }

    #[tokio::test]
    async fn a_small_clean_end_is_staged_whole() {
        let (mut s, c) = pair().await;
        assert_eq!(s.stage(b"hello"), 5, "nothing left for a second write");
        s.stage_close();
        s.flush().await.unwrap();
        drop(s);
        assert_eq!(read_all(c).await, (b"hello".to_vec(), true));
    }

    #[tokio::test]
    async fn a_goodbye_on_an_idle_connection_is_a_close_notify() {
        let (mut s, c) = pair().await;
        goodbye(&mut s).await;
        drop(s);
        assert_eq!(read_all(c).await, (Vec::new(), true));
    }

    /// A client that stopped reading: the pipe is full, so the goodbye cannot go, and the one
    /// try returns at once instead of waiting for room.
    #[tokio::test]
    async fn a_goodbye_to_a_client_that_does_not_read_does_not_wait() {
        let (mut s, c) = pair().await;
        let mut full = vec![0u8; 64 * 1024];
        while let Ok(Ok(n)) =
            tokio::time::timeout(std::time::Duration::from_millis(100), s.write(&full)).await
        {
            full.truncate(n.max(1));
        }
        tokio::time::timeout(std::time::Duration::from_secs(1), goodbye(&mut s))
            .await
            .expect("the goodbye waited on a client that does not read");
        drop(c);
    }

    #[tokio::test]
    async fn a_cut_answer_ends_without_close_notify() {
        let (mut s, c) = pair().await;
        let reader = tokio::spawn(read_all(c));
        finish(&mut s, &patterned(3000), false).await.unwrap();
        drop(s);
        assert_eq!(reader.await.unwrap(), (patterned(3000), false));
    }
}
