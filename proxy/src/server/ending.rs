//! A connection that hyper serves, asked to end gracefully when sluice ends it: at shutdown, and
//! when it has been idle for the keep-alive time. Graceful means what each protocol has for it:
//! HTTP/2 sends `GOAWAY` (naming the last stream it will answer, so that a client racing a new
//! request against the close knows to retry it elsewhere) and HTTP/1 closes once idle, both then
//! ending TLS with `close_notify`, as nginx ends idle connections.
//!
//! Why not hyper-util's graceful `Watcher` alone: it asks only at shutdown, and the idle timeout
//! used to drop the connection outright (no `GOAWAY`, no `close_notify`). The watcher's trait is
//! sealed, so this wrapper takes both signals: the server's shutdown ([`IdleWatch`], set just
//! before the graceful drain starts) and the idle flag that the connection's watchdog sets.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use hyper::body::{Body, Incoming};
use hyper::rt::{Read, Write};
use hyper::service::HttpService;
use hyper_util::server::conn::auto::{HttpServerConnExec, UpgradeableConnection};

use super::close_idle::IdleWatch;

/// A connection that can be asked to finish what it has and close.
pub trait Graceful {
    /// Starts the graceful close (once; the connection future then runs to its end).
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, E, B> Graceful for UpgradeableConnection<'_, I, S, E>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    I: Read + Write + Unpin,
    B: Body + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
    E: HttpServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        UpgradeableConnection::graceful_shutdown(self);
    }
}

pin_project_lite::pin_project! {
    /// `conn`, asked to end gracefully once shutdown begins or `idle` is set.
    pub struct Ending<C> {
        #[pin]
        conn: C,
        shutdown: IdleWatch,
        idle: Arc<AtomicBool>,
        asked: bool,
    }
}

impl<C> Ending<C> {
    /// Wraps `conn`; setting `idle` (then polling) asks it to end.
    pub fn new(conn: C, shutdown: IdleWatch, idle: Arc<AtomicBool>) -> Self {
        Self {
            conn,
            shutdown,
            idle,
            asked: false,
        }
    }
}

impl<C: Future + Graceful> Future for Ending<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let mut this = self.project();
        if !*this.asked
            && (this.idle.load(Ordering::Relaxed) || this.shutdown.poll_closing(cx).is_ready())
        {
            *this.asked = true;
            this.conn.as_mut().graceful_shutdown();
        }
        this.conn.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::close_idle::CloseIdle;
    use std::sync::atomic::AtomicUsize;

    /// A connection that counts the graceful asks and ends on the first.
    struct Conn {
        asks: Arc<AtomicUsize>,
    }

    impl Future for Conn {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if self.asks.load(Ordering::Relaxed) > 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    impl Graceful for Conn {
        fn graceful_shutdown(self: Pin<&mut Self>) {
            self.asks.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn ending(close: &Arc<CloseIdle>) -> (Ending<Conn>, Arc<AtomicBool>, Arc<AtomicUsize>) {
        let (idle, asks) = (Arc::new(AtomicBool::new(false)), Arc::default());
        let conn = Conn {
            asks: Arc::clone(&asks),
        };
        (
            Ending::new(conn, close.watch(), Arc::clone(&idle)),
            idle,
            asks,
        )
    }

    #[tokio::test]
    async fn shutdown_asks_once_and_wakes_the_connection() {
        let close = Arc::new(CloseIdle::default());
        let (e, _, asks) = ending(&close);
        let task = tokio::spawn(e);
        tokio::task::yield_now().await;
        assert_eq!(asks.load(Ordering::Relaxed), 0, "asked before shutdown");
        close.close();
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the close woke the connection")
            .expect("no panic");
        assert_eq!(asks.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn the_idle_flag_asks_on_the_next_poll() {
        let close = Arc::new(CloseIdle::default());
        let (mut e, idle, asks) = ending(&close);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(Pin::new(&mut e).poll(&mut cx).is_pending());
        idle.store(true, Ordering::Relaxed);
        assert!(Pin::new(&mut e).poll(&mut cx).is_ready());
        assert_eq!(asks.load(Ordering::Relaxed), 1);
    }
}
