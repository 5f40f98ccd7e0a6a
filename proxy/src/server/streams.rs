//! HTTP/2 streams run inside their connection's task.
//!
//! hyper hands every HTTP/2 stream (and every upgraded CONNECT stream) to its executor. With
//! `TokioExecutor` each became a task of its own: an allocation sized for the whole handler's
//! future, a trip through the scheduler's run queue, and a wake of the connection's task for
//! every answer the stream queued. nginx runs a connection's streams in the worker that owns the
//! connection; [`ConnExec`] does the same. Streams started while a connection is being polled
//! through [`run`] go into that connection's own set, polled by the same task right after the
//! connection, so an answer a stream queues is written by the next poll of the connection in
//! that same turn. Outside [`run`] (or on a re-entrant start) a stream is spawned as before.
//!
//! The trade: one connection's streams share one core. That is how the connection's frames were
//! already handled (hyper's `h2` connection is one future), and how nginx and HAProxy do it.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};

/// A stream's future, type-erased so one set holds them all.
type Stream = Pin<Box<dyn Future<Output = ()> + Send>>;

tokio::task_local! {
    /// The streams of the connection whose task is running.
    static STREAMS: RefCell<FuturesUnordered<Stream>>;
}

/// hyper's executor for client connections: runs a stream inside the connection's task when
/// the connection is served through [`run`], and spawns it otherwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnExec;

impl<F> hyper::rt::Executor<F> for ConnExec
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut fut = Some(fut);
        // `try_borrow_mut` fails only when a stream itself starts one (hyper's upgraded
        // CONNECT), while the set is being polled: that one is spawned.
        let _ = STREAMS.try_with(|set| {
            if let Ok(set) = set.try_borrow_mut()
                && let Some(f) = fut.take()
            {
                set.push(Box::pin(f));
            }
        });
        if let Some(f) = fut {
            tokio::spawn(f);
        }
    }
}

/// Serves `conn` with its HTTP/2 streams in the same task. Resolves with the connection's own
/// output; streams still running then are dropped with it (their client connection is gone, so
/// no answer of theirs could be delivered, and dropping them cancels their upstream requests).
pub async fn run<C: Future>(conn: C) -> C::Output {
    let mut conn = std::pin::pin!(conn);
    let together = std::future::poll_fn(move |cx| {
        // Read: new requests start streams into the set.
        if let Poll::Ready(out) = conn.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        if !poll_streams(cx) {
            return Poll::Pending;
        }
        // A stream ran: what it queued (headers, body, a reset) is written now rather than
        // on another trip through the scheduler.
        conn.as_mut().poll(cx)
    });
    STREAMS
        .scope(RefCell::new(FuturesUnordered::new()), together)
        .await
}

/// Polls the running streams until none is ready; true if any ran.
fn poll_streams(cx: &mut Context<'_>) -> bool {
    STREAMS
        .try_with(|set| {
            let Ok(mut set) = set.try_borrow_mut() else {
                return false;
            };
            if set.is_empty() {
                return false;
            }
            // `FuturesUnordered` yields (returns Pending after waking itself) once it has
            // polled as many futures as it holds, so this loop ends.
            while let Poll::Ready(Some(())) = set.poll_next_unpin(cx) {}
            true
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    /// A stream started while a connection is polled runs in that connection's task: it
    /// finishes although the runtime never runs another task, and the connection sees it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stream_started_by_the_connection_runs_in_its_task() {
        let ran = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = oneshot::channel::<()>();
        let r = Arc::clone(&ran);
        let mut started = false;
        let mut rx = Some(rx);
        let mut tx = Some(tx);
        let conn = std::future::poll_fn(move |cx| {
            if !started {
                started = true;
                let (r, rx) = (Arc::clone(&r), rx.take());
                ConnExec.execute(async move {
                    if let Some(rx) = rx {
                        let _ = rx.await;
                    }
                    r.fetch_add(1, Ordering::SeqCst);
                });
                // In the set, not spawned.
                let held = STREAMS.with(|s| s.borrow().len());
                assert_eq!(held, 1);
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
            if r.load(Ordering::SeqCst) == 1 {
                Poll::Ready(7)
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        });
        assert_eq!(run(conn).await, 7);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    /// Outside `run`, a stream is spawned.
    #[tokio::test(flavor = "current_thread")]
    async fn outside_a_connection_a_stream_is_spawned() {
        let (tx, rx) = oneshot::channel();
        ConnExec.execute(async move {
            let _ = tx.send(5);
        });
        assert_eq!(rx.await.ok(), Some(5));
    }

    /// A stream that starts another (hyper's upgraded CONNECT) while the set is being polled
    /// gets it spawned, not a panic from a second borrow.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stream_starting_a_stream_spawns_it() {
        let (tx, rx) = oneshot::channel();
        let mut once = false;
        let mut tx = Some(tx);
        let conn = std::future::poll_fn(move |_cx| {
            if !once {
                once = true;
                let tx = tx.take();
                ConnExec.execute(async move {
                    ConnExec.execute(async move {
                        if let Some(tx) = tx {
                            let _ = tx.send(9);
                        }
                    });
                });
            }
            Poll::<()>::Pending
        });
        tokio::select! {
            () = run(conn) => unreachable!("the connection never ends"),
            v = rx => assert_eq!(v.ok(), Some(9)),
        }
    }

    /// When the connection ends, streams still running are dropped with it.
    #[tokio::test(flavor = "current_thread")]
    async fn streams_end_with_their_connection() {
        struct Flag(Arc<AtomicUsize>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let d = Arc::clone(&dropped);
        let mut polls = 0;
        let conn = std::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 1 {
                let flag = Flag(Arc::clone(&d));
                ConnExec.execute(async move {
                    let _flag = flag;
                    std::future::pending::<()>().await;
                });
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(())
        });
        run(conn).await;
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }
}
