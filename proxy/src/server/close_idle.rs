//! Telling fast-path connections that wait for their next request to close (graceful
//! shutdown), without a lock per request; hyper-served connections hear the same signal and
//! are asked to end gracefully (`ending.rs`).
//!
//! A `watch` channel (or a `Notify`) enters each waiting task in a list under a mutex and takes
//! it out again when the wait ends: two takes of that lock for every request a keep-alive
//! connection serves, for a signal sent once in the process's life. Here each connection has an
//! [`AtomicWaker`] of its own, entered once when the connection starts; a wait registers its
//! task's waker there (lock-free, and nothing to undo when the request arrives) and then reads
//! the flag. [`CloseIdle::close`] sets the flag and wakes every connection still entered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use crossbeam_queue::SegQueue;

/// The shutdown signal for idle fast-path connections, shared by the server and its
/// connections.
#[derive(Debug, Default)]
pub struct CloseIdle {
    closing: AtomicBool,
    /// One entry per connection since the last [`CloseIdle::prune`].
    waiting: SegQueue<Weak<AtomicWaker>>,
    /// Held by `close` and `prune` (never by a connection): a prune holds entries out of the
    /// queue while it runs, and a close then would miss them.
    exclusive: Mutex<()>,
}

impl CloseIdle {
    /// A connection's handle on the signal.
    pub fn watch(self: &Arc<Self>) -> IdleWatch {
        let waker = Arc::new(AtomicWaker::new());
        self.waiting.push(Arc::downgrade(&waker));
        IdleWatch {
            shared: Arc::clone(self),
            waker,
        }
    }

    /// Closes: every connection waiting now is woken, and every later wait ends at once.
    pub fn close(&self) {
        let _only = self
            .exclusive
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.closing.store(true, Ordering::SeqCst);
        while let Some(w) = self.waiting.pop() {
            if let Some(w) = w.upgrade() {
                w.wake();
            }
        }
    }

    /// Forgets connections that have ended; returns how many are still entered. The server's
    /// idle sweep calls it every few seconds, so the queue holds about one entry per open
    /// connection.
    pub fn prune(&self) -> usize {
        let _only = self
            .exclusive
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut kept = 0;
        for _ in 0..self.waiting.len() {
            let Some(w) = self.waiting.pop() else { break };
            if w.strong_count() > 0 {
                self.waiting.push(w);
                kept += 1;
            }
        }
        kept
    }
}

/// One connection's handle on [`CloseIdle`].
#[derive(Debug)]
pub struct IdleWatch {
    shared: Arc<CloseIdle>,
    waker: Arc<AtomicWaker>,
}

impl IdleWatch {
    /// Whether idle connections are to close.
    pub fn is_closing(&self) -> bool {
        self.shared.closing.load(Ordering::SeqCst)
    }

    /// Ready once idle connections are to close; until then the task is woken when they are.
    pub fn poll_closing(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.waker.register(cx.waker());
        // After registering: a close that set the flag before this read is seen here, and one
        // that sets it after finds the waker registered.
        if self.is_closing() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Waits until idle connections are to close.
    pub async fn closing(&self) {
        std::future::poll_fn(|cx| self.poll_closing(cx)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiting_connection_is_woken_and_later_ones_see_the_close_at_once() {
        let signal = Arc::new(CloseIdle::default());
        let a = signal.watch();
        assert!(!a.is_closing());
        let waiting = tokio::spawn(async move { a.closing().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "nothing closed yet");
        signal.close();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken by the close")
            .unwrap();
        let later = signal.watch();
        assert!(later.is_closing());
        tokio::time::timeout(Duration::from_millis(10), later.closing())
            .await
            .expect("a wait after the close ends at once");
    }

    #[tokio::test]
    async fn waits_that_ended_leave_nothing_to_undo_and_prune_forgets_closed_connections() {
        let signal = Arc::new(CloseIdle::default());
        let a = signal.watch();
        // Many waits on one connection, each ended by something else (a request arriving).
        for _ in 0..100 {
            let r = tokio::time::timeout(Duration::from_millis(1), a.closing()).await;
            assert!(r.is_err());
        }
        let b = signal.watch();
        assert_eq!(
            signal.prune(),
            2,
            "one entry per connection, however many waits"
        );
        drop(b);
        assert_eq!(signal.prune(), 1, "a closed connection is forgotten");
        let waiting = tokio::spawn(async move { a.closing().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        signal.close();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("a pruned queue still wakes the live connection")
            .unwrap();
    }
}
