//! Waiting for more of a client's first bytes without consuming them: the sniffer and the
//! first-head check read a prefix with `peek`, so that the bytes still reach whoever serves
//! the connection.
//!
//! `peek` alone cannot wait: while unread bytes are queued the socket stays readable, so a
//! loop over it spins, and the end of the stream hides behind the queued bytes. [`peek_more`]
//! clears the cached readiness before it waits, so that it wakes only for new bytes, the
//! peer's FIN (tokio keeps the read-closed state once the kernel reports it), or the deadline.
//!
//! May import: nothing of the proxy.

use std::io;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What waiting for more bytes gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peeked {
    /// `n` bytes are queued now (more than before).
    Bytes(usize),
    /// The peer closed its side: the queued bytes are all there will be.
    Closed,
    /// The deadline passed first.
    Timeout,
    /// The socket failed.
    Failed,
}

/// Wait until more than `seen` bytes are queued on `stream` (returning how many, up to
/// `buf.len()`), the peer closes, or `deadline` passes. Nothing is consumed.
pub async fn peek_more(
    stream: &TcpStream,
    buf: &mut [u8],
    seen: usize,
    deadline: Instant,
) -> Peeked {
    loop {
        if seen > 0 {
            // The `seen` bytes were already looked at: forget that the socket is readable, so
            // that the wait below is for what comes next. Closed states are never cleared.
            let _ = stream.try_io(Interest::READABLE, || {
                Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock))
            });
        }
        let ready = match tokio::time::timeout_at(deadline, stream.ready(Interest::READABLE)).await
        {
            Err(_) => return Peeked::Timeout,
            Ok(Err(_)) => return Peeked::Failed,
            Ok(Ok(ready)) => ready,
        };
        // Readable now, so this returns at once.
        let n = match tokio::time::timeout_at(deadline, stream.peek(buf)).await {
            Err(_) => return Peeked::Timeout,
            Ok(Err(_)) => return Peeked::Failed,
            Ok(Ok(n)) => n,
        };
        if n > seen {
            return Peeked::Bytes(n);
        }
        if n == 0 || ready.is_read_closed() {
            return Peeked::Closed;
        }
        if n == buf.len() {
            // Nothing more fits: the caller decides on what it has.
            return Peeked::Bytes(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn waits_for_new_bytes_then_sees_the_end_behind_queued_bytes() {
        let (mut client, server) = pair().await;
        let mut buf = [0u8; 64];
        let soon = || Instant::now() + Duration::from_secs(5);
        client.write_all(b"GET /").await.unwrap();
        assert_eq!(
            peek_more(&server, &mut buf, 0, soon()).await,
            Peeked::Bytes(5)
        );
        // Nothing new: the deadline, not a spin and not a false "more".
        let short = Instant::now() + Duration::from_millis(100);
        assert_eq!(
            peek_more(&server, &mut buf, 5, short).await,
            Peeked::Timeout
        );
        client.write_all(b"x HT").await.unwrap();
        assert_eq!(
            peek_more(&server, &mut buf, 5, soon()).await,
            Peeked::Bytes(9)
        );
        // The peer closes with 9 bytes still queued: seen at once.
        client.shutdown().await.unwrap();
        drop(client);
        let started = Instant::now();
        assert_eq!(
            peek_more(&server, &mut buf, 9, soon()).await,
            Peeked::Closed
        );
        assert!(started.elapsed() < Duration::from_secs(4));
        // And nothing was consumed.
        let mut all = [0u8; 16];
        let n = server.try_read(&mut all).unwrap();
        assert_eq!(&all[..n], b"GET /x HT");
    }

    #[tokio::test]
    async fn an_empty_connection_that_closes_is_closed() {
        let (client, server) = pair().await;
        drop(client);
        let mut buf = [0u8; 8];
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            peek_more(&server, &mut buf, 0, deadline).await,
            Peeked::Closed
        );
    }
}
