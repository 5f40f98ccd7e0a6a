//! The body of an upstream HTTP/1.1 response, read straight from the upstream socket as the
//! client connection asks for it. When it ends where its framing said, the connection goes
//! back to the pool at once (before the client has even been sent the last bytes).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::conn::Upload;
use crate::error::{Error, Kind};
use crate::upstream::endpoint::InFlight;
use crate::upstream::pool::PooledH1;
use crate::wire::decode::{Chunk, Framing, decode_chunk};

/// A streaming upstream response body that owns its connection until it ends.
#[derive(Debug)]
pub struct H1Body {
    conn: Option<PooledH1>,
    framing: Framing,
    keep_alive: bool,
    in_flight: Option<InFlight>,
    /// The rest of a request the upstream answered before reading all of it, written while
    /// the response is read.
    upload: Option<Box<Upload>>,
    /// Armed only while the body waits for the upstream (a body that arrives with its head
    /// never needs one); fires after the pool's read timeout without a byte.
    silence: Option<Pin<Box<Sleep>>>,
    /// Bytes arrived since `silence` was last armed.
    progressed: bool,
}

/// What one poll of the body produced, decided while the connection is borrowed.
enum Step {
    Frame(Frame<Bytes>, bool),
    End,
    Fail(Error),
}

impl H1Body {
    /// A body read from `conn` with this framing; `keep_alive` says whether the connection may
    /// be reused once the body has been read. The in-flight mark ends with the body. `upload`
    /// is the unsent rest of the request, if any: it is written as the body is read, and the
    /// connection is reused only if it completed by the end of the response.
    pub fn new(
        conn: PooledH1,
        framing: Framing,
        keep_alive: bool,
        in_flight: InFlight,
        upload: Option<Box<Upload>>,
    ) -> Self {
        let mut b = Self {
            conn: Some(conn),
            framing,
            keep_alive,
            in_flight: Some(in_flight),
            upload,
            silence: None,
            progressed: false,
        };
        if matches!(b.framing, Framing::Empty) {
            b.finish();
        }
        b
    }

    /// The body is complete: return the connection when it is clean, end the in-flight mark.
    fn finish(&mut self) {
        self.framing = Framing::Empty;
        // An upload still under way when the answer is complete is cut off with the connection.
        if let Some(p) = self.conn.take()
            && self.keep_alive
            && self.upload.is_none()
        {
            p.release();
        }
        self.upload = None;
        self.in_flight = None;
    }

    /// Moves a pending upload on; a failed one only makes the connection unusable afterwards.
    fn drive_upload(&mut self, cx: &mut Context<'_>) {
        if let (Some(up), Some(p)) = (self.upload.as_mut(), self.conn.as_mut())
            && let Poll::Ready(ok) = up.poll_rest(&mut p.conn, cx)
        {
            self.upload = None;
            self.keep_alive &= ok;
        }
    }

    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        let Some(p) = self.conn.as_mut() else {
            return Poll::Ready(Step::End);
        };
        let c = &mut p.conn;
        loop {
            match &mut self.framing {
                Framing::Empty => return Poll::Ready(Step::End),
                Framing::Length(rest) => {
                    if !c.rbuf.is_empty() {
                        let n = usize::try_from(*rest)
                            .unwrap_or(usize::MAX)
                            .min(c.rbuf.len());
                        let data = c.rbuf.split_to(n).freeze();
                        *rest -= n as u64;
                        return Poll::Ready(Step::Frame(Frame::data(data), *rest == 0));
                    }
                }
                Framing::Chunked(state) => match decode_chunk(state, &mut c.rbuf) {
                    Ok(Chunk::Data(d)) => return Poll::Ready(Step::Frame(Frame::data(d), false)),
                    Ok(Chunk::Trailers(t)) => {
                        return Poll::Ready(Step::Frame(Frame::trailers(t), true));
                    }
                    Ok(Chunk::End) => return Poll::Ready(Step::End),
                    Ok(Chunk::NeedMore) => {}
                    Err(e) => return Poll::Ready(Step::Fail(e)),
                },
                Framing::UntilClose => {
                    if !c.rbuf.is_empty() {
                        let data = c.rbuf.split().freeze();
                        return Poll::Ready(Step::Frame(Frame::data(data), false));
                    }
                }
            }
            let filled = match c.poll_fill(cx) {
                Poll::Ready(r) => r,
                Poll::Pending => {
                    let limit = p.read_timeout();
                    let timer = match self.silence.as_mut() {
                        Some(t) if self.progressed => {
                            t.as_mut().reset(Instant::now() + limit);
                            t
                        }
                        Some(t) => t,
                        None => self.silence.insert(Box::pin(tokio::time::sleep(limit))),
                    };
                    self.progressed = false;
                    ready!(timer.as_mut().poll(cx));
                    return Poll::Ready(Step::Fail(Error::new(Kind::UpstreamReadTimeout(limit))));
                }
            };
            match filled {
                Ok(0) if matches!(self.framing, Framing::UntilClose) => {
                    return Poll::Ready(Step::End);
                }
                Ok(0) => return Poll::Ready(Step::Fail(Error::new(Kind::Truncated))),
                Ok(_) => self.progressed = true,
                Err(e) => return Poll::Ready(Step::Fail(Error::upstream_io(e))),
            }
        }
    }
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        this.drive_upload(cx);
        match ready!(this.poll_step(cx)) {
            Step::Frame(f, last) => {
                if last {
                    // Released before the frame is handed on (`release` itself refuses a
                    // connection with unread bytes).
                    this.finish();
                }
                Poll::Ready(Some(Ok(f)))
            }
            Step::End => {
                this.finish();
                Poll::Ready(None)
            }
            Step::Fail(e) => {
                // A broken connection is never reused.
                this.conn = None;
                this.framing = Framing::Empty;
                this.in_flight = None;
                Poll::Ready(Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.framing, Framing::Empty | Framing::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Empty => SizeHint::with_exact(0),
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}
