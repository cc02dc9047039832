//! A stream whose first bytes were already read (to sniff them) and are handed out again
//! before the rest: the destination of an L4 hop reads a prefix to tell HTTP from other bytes
//! (model.md §12.5 item 2), and whoever serves the connection then reads it whole. A TLS
//! stream cannot be peeked, so the prefix is read and replayed.
//!
//! May import: nothing of the proxy.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, with `prefix` read first.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    /// A stream that yields `prefix`, then `inner`'s bytes.
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Self { prefix, inner }
    }

    /// Whether the next read is still served from the prefix.
    pub fn replaying(&self) -> bool {
        !self.prefix.is_empty()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if self.prefix.is_empty() {
                // An emptied `Bytes` still holds its whole allocation (the first head's read
                // buffer, 16 KiB): let it go rather than keep it for the connection's life.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn the_prefix_comes_first_then_the_stream() {
        let inner: &[u8] = b" world";
        let mut r = Rewind::new(Bytes::from_static(b"hello"), inner);
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }

    #[tokio::test]
    async fn a_replayed_prefix_lets_its_buffer_go() {
        // The buffer a first head was read into: once replayed, the stream no longer holds it.
        let buffer = Bytes::from(vec![b'x'; 16 * 1024]);
        let inner: &[u8] = b"";
        let mut r = Rewind::new(buffer.clone(), inner);
        assert!(!buffer.is_unique());
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        assert_eq!(out.len(), 16 * 1024);
        assert!(buffer.is_unique(), "the replayed prefix is still held");
        assert!(!r.replaying());
    }
}
