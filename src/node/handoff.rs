//! Handing the listening sockets of every served pod from a running daemon to its successor,
//! so that an upgrade drops no new connection (issue #8 §4).
//!
//! The running daemon listens on `<state_dir>/handoff.sock`. A new daemon started beside it
//! connects before it serves any pod and asks for the listeners ([`take`]); the old one answers
//! with one JSON line naming each listener (pod, kind, address), then passes the sockets
//! themselves (`SCM_RIGHTS`, at most [`FDS_PER_MESSAGE`] per message). Both processes now hold
//! the same listening sockets, and a connection waiting in a queue is accepted by one of them:
//! none is refused. The new daemon serves its pods on the sockets it was given (binding the
//! same addresses again would fail while the old one holds them), then says `ready`
//! ([`Taken::ready`]); only then does the old daemon stop accepting and drain: the connections
//! it has run on until it is stopped (SIGTERM) and then to the drain deadline, and it leaves
//! the state directory's sockets to the new one.
//!
//! From `take` to `ready` the old daemon is *handing over* (`node::run`): it answers `/ready`
//! 503, answers CNI ADDs "try again" and reconciles no pod, so that the listeners it passed are
//! all there are and every ADD it accepted is recorded before the new daemon reads the records.
//! Should the exchange fail (the new daemon dies, or says something else), it serves on as
//! before. The node-wide listeners (metrics, admin) are passed too ([`ListenerId::node`],
//! `node::listeners`).
//!
//! Wire format (version 1), on a unix stream socket:
//! ```text
//! new → old   take 1\n
//! old → new   {"listeners":[{"namespace":..,"pod":..,"kind":"capture","addr":"0.0.0.0:18001"},..]}\n
//! old → new   the sockets, in the order of the list, in messages of one byte each
//! new → old   ready\n
//! ```
//! Sockets come back as [`OwnedFd`] through `rustix` (no `unsafe` here). The exchange is short
//! and rare, so it is written with blocking sockets, each side on a blocking thread.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

/// The most sockets passed in one message (the kernel allows 253).
pub const FDS_PER_MESSAGE: usize = 64;

/// How long either side waits for the other at each step.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the old daemon waits for `ready`: the new one lists the whole registry first (18 s
/// of a node's CPU at 100,000 pods, docs/kubernetes.md "Scale"). A new daemon that dies closes
/// the socket, which ends the wait at once; this bounds only one that hangs.
pub const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// What one listening socket is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ListenerId {
    /// The pod's namespace (empty for a node-wide listener).
    pub namespace: String,
    /// The pod's name (empty for a node-wide listener).
    pub pod: String,
    /// A pod's `capture`, `loopback`, `hop`, `udp`, `dns-udp` or `dns-tcp`; the node's
    /// `metrics` or `admin` ([`super::listeners`]).
    pub kind: String,
    /// The address it is bound to.
    pub addr: SocketAddr,
}

impl ListenerId {
    /// A node-wide listener (no pod): `metrics` or `admin`. A daemon that does not know these
    /// closes them with the sockets no pod took, and binds its own.
    pub fn node(kind: &str, addr: SocketAddr) -> Self {
        Self {
            namespace: String::new(),
            pod: String::new(),
            kind: kind.to_owned(),
            addr,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    listeners: Vec<ListenerId>,
}

/// The handoff failed; the old daemon keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// The socket failed.
    #[error("handoff socket")]
    Io(#[from] std::io::Error),
    /// The peer said something else than the protocol.
    #[error("handoff protocol: {0}")]
    Protocol(String),
}

/// Sockets received from the old daemon, taken one by one as the pods are served.
#[derive(Debug, Default)]
pub struct Inherited {
    fds: HashMap<ListenerId, OwnedFd>,
}

impl Inherited {
    /// The socket for `id`, if the old daemon passed one.
    pub fn take(&mut self, id: &ListenerId) -> Option<OwnedFd> {
        self.fds.remove(id)
    }

    /// Keep `fd` for `id` (a pod served again keeps its own sockets).
    pub fn insert(&mut self, id: ListenerId, fd: OwnedFd) {
        self.fds.insert(id, fd);
    }

    /// Close the sockets of pod `namespace/pod` that nothing took.
    pub fn drop_pod(&mut self, namespace: &str, pod: &str) {
        self.fds
            .retain(|id, _| !(id.namespace == namespace && id.pod == pod));
    }

    /// How many are left (not taken by any pod: their pods are gone).
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    /// Whether none is left.
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }
}

/// The new daemon's side once the sockets arrived: say [`Taken::ready`] after serving.
#[derive(Debug)]
pub struct Taken {
    stream: UnixStream,
    /// The sockets.
    pub inherited: Inherited,
}

impl Taken {
    /// Tell the old daemon the pods are served: it stops accepting and drains.
    pub fn ready(mut self) -> Result<(), HandoffError> {
        self.stream.write_all(b"ready\n")?;
        Ok(())
    }
}

/// The new daemon's side: ask the daemon listening on `path` for its listeners. `Ok(None)`
/// when no daemon listens there (a first start).
pub fn take(path: &Path) -> Result<Option<Taken>, HandoffError> {
    let stream = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    stream.set_read_timeout(Some(STEP_TIMEOUT))?;
    stream.set_write_timeout(Some(STEP_TIMEOUT))?;
    (&stream).write_all(b"take 1\n")?;
    let header = read_line(&stream)?;
    let header: Header = serde_json::from_str(&header)
        .map_err(|e| HandoffError::Protocol(format!("header: {e}")))?;
    let mut fds = Vec::with_capacity(header.listeners.len());
    while fds.len() < header.listeners.len() {
        let got = recv_fds(&stream)?;
        if got.is_empty() {
            return Err(HandoffError::Protocol(format!(
                "the old daemon sent {} of {} sockets",
                fds.len(),
                header.listeners.len()
            )));
        }
        fds.extend(got);
    }
    if fds.len() != header.listeners.len() {
        return Err(HandoffError::Protocol("more sockets than listeners".into()));
    }
    Ok(Some(Taken {
        stream,
        inherited: Inherited {
            fds: header.listeners.into_iter().zip(fds).collect(),
        },
    }))
}

/// The old daemon's side, for one connection on its handoff socket: pass `listeners` (dups of
/// its listening sockets) and wait for `ready`. `Ok` means the successor serves: stop
/// accepting and drain.
pub fn give(
    stream: &UnixStream,
    listeners: Vec<(ListenerId, OwnedFd)>,
) -> Result<(), HandoffError> {
    stream.set_read_timeout(Some(STEP_TIMEOUT))?;
    stream.set_write_timeout(Some(STEP_TIMEOUT))?;
    let hello = read_line(stream)?;
    if hello != "take 1" {
        return Err(HandoffError::Protocol(format!("unexpected {hello:?}")));
    }
    let (ids, fds): (Vec<_>, Vec<_>) = listeners.into_iter().unzip();
    let header = serde_json::to_string(&Header { listeners: ids })
        .map_err(|e| HandoffError::Protocol(e.to_string()))?;
    let mut writer = stream;
    writer.write_all(header.as_bytes())?;
    writer.write_all(b"\n")?;
    for chunk in fds.chunks(FDS_PER_MESSAGE) {
        send_fds(stream, chunk)?;
    }
    // The successor serves from here on (or died trying: then this daemon keeps serving).
    stream.set_read_timeout(Some(READY_TIMEOUT))?;
    let done = read_line(stream)?;
    if done == "ready" {
        Ok(())
    } else {
        Err(HandoffError::Protocol(format!("unexpected {done:?}")))
    }
}

/// One line, without its newline; byte by byte, so that nothing after it (the sockets' messages)
/// is read into a buffer.
fn read_line(stream: &UnixStream) -> Result<String, HandoffError> {
    let mut reader = BufReader::with_capacity(1, stream);
    let mut line = String::new();
    let n = reader.read_line(&mut line)?;
    if n == 0 {
        return Err(HandoffError::Protocol("the peer closed".into()));
    }
    Ok(line.trim_end_matches('\n').to_owned())
}

fn send_fds(stream: &UnixStream, fds: &[OwnedFd]) -> Result<(), HandoffError> {
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(HandoffError::Protocol(
            "too many sockets for one message".into(),
        ));
    }
    rustix::net::sendmsg(
        stream,
        &[IoSlice::new(b"s")],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(std::io::Error::from)?;
    Ok(())
}

fn recv_fds(stream: &UnixStream) -> Result<Vec<OwnedFd>, HandoffError> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let got = rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    if got.bytes == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            out.extend(fds);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn id(kind: &str, addr: SocketAddr) -> ListenerId {
        ListenerId {
            namespace: "mp".into(),
            pod: "p".into(),
            kind: kind.into(),
            addr,
        }
    }

    #[test]
    fn listeners_pass_to_the_successor_and_it_accepts_on_them() {
        let dir = std::env::temp_dir().join(format!("aether-handoff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("handoff.sock");
        let _ = std::fs::remove_file(&path);
        // No daemon yet: nothing to take.
        assert!(take(&path).unwrap().is_none());

        // More listeners than one message carries.
        let listeners: Vec<std::net::TcpListener> = (0..FDS_PER_MESSAGE + 3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let offered: Vec<(ListenerId, OwnedFd)> = listeners
            .iter()
            .map(|l| {
                let fd = l.as_fd().try_clone_to_owned().unwrap();
                (id("capture", l.local_addr().unwrap()), fd)
            })
            .collect();
        let server = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let old = std::thread::spawn(move || {
            let (stream, _) = server.accept().unwrap();
            give(&stream, offered)
        });
        let mut taken = take(&path).unwrap().unwrap();
        assert_eq!(taken.inherited.len(), listeners.len());
        let last = listeners.last().unwrap().local_addr().unwrap();
        let fd = taken.inherited.take(&id("capture", last)).unwrap();
        taken.ready().unwrap();
        old.join().unwrap().unwrap();

        // The old daemon stops accepting; a client connects; the successor accepts it.
        drop(listeners);
        let successor = std::net::TcpListener::from(fd);
        let mut client = std::net::TcpStream::connect(last).unwrap();
        let (mut accepted, _) = successor.accept().unwrap();
        client.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_peer_that_speaks_another_protocol_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        (&b).write_all(b"hello\n").unwrap();
        let err = give(&a, Vec::new()).unwrap_err();
        assert!(err.to_string().contains("unexpected"), "{err}");
    }
}
