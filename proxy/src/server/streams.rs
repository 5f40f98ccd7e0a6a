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

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};

/// A stream's future, type-erased so one set holds them all.
type Stream = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A connection's running streams.
struct Streams {
    /// Made when the first stream starts, so a connection that never has one (HTTP/1 through
    /// hyper, an HTTP/2 client that sends nothing) carries no set; kept after that (about
    /// 150 bytes), so that a busy connection does not make one per batch of streams.
    set: RefCell<Option<FuturesUnordered<Isolated<Stream>>>>,
    /// A stream was added: `FuturesUnordered::push` queues it without waking anyone.
    pushed: Cell<bool>,
    /// A stream was polled in this turn.
    ran: Cell<bool>,
}

tokio::task_local! {
    /// The streams of the connection whose task is running.
    static STREAMS: Streams;
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
        let _ = STREAMS.try_with(|streams| {
            if let Ok(mut set) = streams.set.try_borrow_mut()
                && let Some(f) = fut.take()
            {
                let f: Stream = Box::pin(f);
                set.get_or_insert_with(FuturesUnordered::new)
                    .push(Isolated(f));
                streams.pushed.set(true);
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
///
/// Not an `async fn`: one would keep `conn` twice in its state (the argument, then the pinned
/// local), and hyper's connection state is kilobytes in every idle connection's task. A stream
/// must not itself call `run` (a task-local scope cannot be entered while its value is
/// borrowed, as it is while the streams are polled); hyper's streams do not.
pub fn run<C: Future>(conn: C) -> impl Future<Output = C::Output> {
    let streams = Streams {
        set: RefCell::new(None),
        pushed: Cell::new(false),
        ran: Cell::new(false),
    };
    STREAMS.scope(streams, Together { conn })
}

pin_project_lite::pin_project! {
    /// A connection and its streams, polled as one future.
    struct Together<C> {
        #[pin]
        conn: C,
    }
}

impl<C: Future> Future for Together<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let mut conn = self.project().conn;
        // Read: new requests start streams into the set, where the next step polls them.
        if let Poll::Ready(out) = conn.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        if !poll_streams(cx) {
            return Poll::Pending;
        }
        // Streams ran: what they queued (headers, body, a reset) is written now rather than
        // on another trip through the scheduler.
        let _ = STREAMS.try_with(|s| s.pushed.set(false));
        if let Poll::Ready(out) = conn.poll(cx) {
            return Poll::Ready(out);
        }
        // That poll read too, and may have started streams: nothing else would wake the task
        // for them.
        if STREAMS.try_with(|s| s.pushed.take()).unwrap_or(false) {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// Polls the connection's ready streams until none is left; true if any was polled.
fn poll_streams(cx: &mut Context<'_>) -> bool {
    STREAMS
        .try_with(|streams| {
            let Ok(mut set) = streams.set.try_borrow_mut() else {
                return false;
            };
            let Some(set) = set.as_mut().filter(|s| !s.is_empty()) else {
                return false;
            };
            streams.ran.set(false);
            // `FuturesUnordered` yields (returns Pending after waking itself) once it has
            // polled as many futures as it holds, so this loop ends.
            while let Poll::Ready(Some(())) = set.poll_next_unpin(cx) {}
            streams.ran.get()
        })
        .unwrap_or(false)
}

/// A stream that panics ends alone, as it did as a task of its own: the connection and its
/// other streams go on. (sluice does not panic on input; this keeps a bug's reach to one
/// request.)
struct Isolated<F>(F);

impl<F: Future<Output = ()> + Unpin> Future for Isolated<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let _ = STREAMS.try_with(|s| s.ran.set(true));
        let fut = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(fut).poll(cx))) {
            Ok(p) => p,
            Err(_) => {
                tracing::error!("an HTTP/2 stream's handler panicked; that stream was reset");
                Poll::Ready(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    /// A stream started while a connection is polled goes into that connection's set (not
    /// spawned) and finishes there.
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
                let held = STREAMS.with(|s| s.set.borrow().as_ref().map(FuturesUnordered::len));
                assert_eq!(held, Some(1));
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
                        // Spawned: a task of its own, outside the connection's scope.
                        let outside = STREAMS.try_with(|_| ()).is_err();
                        if let Some(tx) = tx {
                            let _ = tx.send(outside);
                        }
                    });
                });
            }
            Poll::<()>::Pending
        });
        tokio::select! {
            () = run(conn) => unreachable!("the connection never ends"),
            v = rx => assert_eq!(v.ok(), Some(true)),
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

    /// A stream that panics ends alone: the connection's other stream still finishes, and the
    /// connection itself goes on to its end.
    #[tokio::test(flavor = "current_thread")]
    async fn a_panicking_stream_ends_alone() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = Arc::clone(&done);
        let mut started = false;
        let conn = std::future::poll_fn(move |cx| {
            if !started {
                started = true;
                ConnExec.execute(async {
                    tokio::task::yield_now().await;
                    panic!("a bug in one request");
                });
                let d = Arc::clone(&d);
                ConnExec.execute(async move {
                    tokio::task::yield_now().await;
                    tokio::task::yield_now().await;
                    d.fetch_add(1, Ordering::SeqCst);
                });
            }
            if d.load(Ordering::SeqCst) == 1 {
                Poll::Ready("ended")
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        });
        assert_eq!(run(conn).await, "ended");
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }

    /// A stream woken from elsewhere (its upstream answered) runs although its connection
    /// never wakes itself, and the connection is polled again after it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_woken_stream_runs_in_a_quiet_connection() {
        let done = Arc::new(AtomicUsize::new(0));
        let conn = quiet_conn(&done, |poll, d| {
            if poll == 1 {
                let (tx, rx) = oneshot::channel::<()>();
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    let _ = tx.send(());
                });
                let d = Arc::clone(d);
                ConnExec.execute(async move {
                    let _ = rx.await;
                    d.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        let ended = ended_in_time(run(conn)).await;
        assert!(ended, "the stream's wake reached the connection's task");
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }

    /// A stream started by the connection's second poll of a turn (the one after its streams
    /// ran) is polled on the next turn: `push` wakes nobody, so the set's owner must.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stream_started_by_the_second_poll_is_not_forgotten() {
        let done = Arc::new(AtomicUsize::new(0));
        let conn = quiet_conn(&done, |poll, d| match poll {
            // First poll of the turn: a stream that finishes at once, so that the connection
            // is polled a second time.
            1 => ConnExec.execute(async {}),
            // The second: a stream, and no wake of the connection's own.
            2 => {
                let d = Arc::clone(d);
                ConnExec.execute(async move {
                    d.fetch_add(1, Ordering::SeqCst);
                });
            }
            _ => {}
        });
        let ended = ended_in_time(run(conn)).await;
        assert!(ended, "the stream started by the second poll ran");
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }

    /// A connection that never wakes itself: `start` runs on each of its polls (numbered from
    /// 1), and it ends once `done` reads 1.
    fn quiet_conn(
        done: &Arc<AtomicUsize>,
        mut start: impl FnMut(u32, &Arc<AtomicUsize>),
    ) -> impl Future<Output = ()> {
        let done = Arc::clone(done);
        let mut polls = 0;
        std::future::poll_fn(move |_cx| {
            polls += 1;
            start(polls, &done);
            if done.load(Ordering::SeqCst) == 1 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Whether `fut` ends before a 5 s timer. The timer is looked at first: a `timeout` would
    /// poll `fut` once more when it fires, and so hide a missing wake.
    async fn ended_in_time(fut: impl Future<Output = ()>) -> bool {
        tokio::select! {
            biased;
            () = tokio::time::sleep(std::time::Duration::from_secs(5)) => false,
            () = fut => true,
        }
    }
}
