//! The handover's messages: a 4-byte big-endian length and a JSON body on a unix stream
//! socket, the listening sockets riding along as `SCM_RIGHTS` on the message that lists them.
//! Blocking I/O with timeouts: a handover happens once per process, off the async runtime.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

/// The protocol version this build speaks; a peer speaking another is refused, and the new
/// process then binds alone.
pub const VERSION: u32 = 1;

/// Most sockets one handover carries (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_SOCKETS: usize = 200;

/// Largest message body accepted (a list of 200 sockets is about 16 KiB).
const MAX_BODY: usize = 256 * 1024;

/// One listening socket as listed (its descriptor rides along, in the same order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    /// Its role (`http`, `https`, `admin`, `gateway`, `gateway-tls`).
    pub role: String,
    /// Where it is bound.
    pub addr: SocketAddr,
}

/// A message of the handover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// New → old: who asks, speaking which version.
    Hello {
        /// The protocol version.
        version: u32,
        /// The asking process.
        pid: u32,
        /// Its version of sluice, for the logs.
        sluice: String,
    },
    /// Old → new: the listening sockets (descriptors attached).
    Sockets {
        /// The protocol version.
        version: u32,
        /// The handing process.
        pid: u32,
        /// What each attached descriptor is.
        sockets: Vec<Listed>,
    },
    /// Old → new: not handed over, and why (another version).
    Refused {
        /// Why.
        reason: String,
    },
    /// Old → new: another successor is taking over right now; ask again shortly.
    Busy,
    /// Old → new: already handed over; the path moves to the successor; ask again shortly.
    Draining,
    /// New → old: serving on the sockets; stop accepting.
    Ready,
    /// Old → new: stopped accepting; draining.
    Stopped,
}

/// Sends a message with `fds` attached.
pub fn send(stream: &UnixStream, msg: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::other("handover message too long"))?
        .to_be_bytes();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many sockets for one message"));
    }
    let iov = [IoSlice::new(&len), IoSlice::new(&body)];
    let sent = rustix::net::sendmsg(stream, &iov, &mut control, SendFlags::NOSIGNAL)?;
    // The descriptors went with the first byte; the rest, if the socket took less, follows.
    let mut whole = Vec::with_capacity(4 + body.len());
    whole.extend_from_slice(&len);
    whole.extend_from_slice(&body);
    let mut rest = whole.get(sent..).unwrap_or_default();
    let mut w = stream;
    while !rest.is_empty() {
        let n = w.write(rest)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        rest = rest.get(n..).unwrap_or_default();
    }
    Ok(())
}

/// Receives one message and the descriptors attached to it.
pub fn recv(stream: &UnixStream) -> io::Result<(Message, Vec<OwnedFd>)> {
    let mut len = [0u8; 4];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = {
        let mut iov = [IoSliceMut::new(&mut len)];
        rustix::net::recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?.bytes
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    if got == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let mut r = stream;
    if let Some(rest) = len.get_mut(got..) {
        r.read_exact(rest)?;
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_BODY {
        return Err(io::Error::other(format!("handover message of {n} bytes")));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    let msg =
        serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((msg, fds))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn messages_and_sockets_cross_and_the_socket_is_the_same() {
        let (a, b) = UnixStream::pair().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let msg = Message::Sockets {
            version: VERSION,
            pid: 7,
            sockets: vec![Listed {
                role: "https".into(),
                addr: at,
            }],
        };
        send(&a, &msg, &[l.as_fd()]).unwrap();
        drop(l);
        let (got, fds) = recv(&b).unwrap();
        assert_eq!(got, msg);
        assert_eq!(fds.len(), 1);
        let received = std::net::TcpListener::from(fds.into_iter().next().unwrap());
        assert_eq!(received.local_addr().unwrap(), at);
        let _client = std::net::TcpStream::connect(at).unwrap();
        assert!(
            received.accept().is_ok(),
            "the very socket, still listening"
        );

        send(&b, &Message::Ready, &[]).unwrap();
        assert_eq!(recv(&a).unwrap().0, Message::Ready);
    }

    #[test]
    fn garbage_and_a_closed_peer_are_errors_not_panics() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&[0, 0, 0, 3, b'{', b'x', b'}']).unwrap();
        assert_eq!(recv(&b).unwrap_err().kind(), io::ErrorKind::InvalidData);
        (&a).write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(recv(&b).is_err(), "an absurd length is refused");
        drop(a);
        assert_eq!(recv(&b).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
