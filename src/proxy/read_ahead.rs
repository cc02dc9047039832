//! Reading a TLS connection's socket in large reads, for rustls.
//!
//! rustls asks its transport for at most 4 KiB a read (`read_tls`), so a full 16 KiB record
//! took four or five `recvfrom` calls, and a relayed gigabyte about 300,000 of them on each
//! side of the hop (issue #11 counted 500,000 syscalls per GB of raw TCP against ztunnel's
//! 100,000). [`ReadAhead`] reads the socket up to [`READ_AHEAD`] bytes at once into one
//! scratch buffer per thread, hands rustls what it asked for, and keeps the rest in a buffer
//! of the connection's own only until rustls has taken it: an idle connection holds no buffer
//! (issue #8, finding 13). Writes pass straight through, vectored where the socket is. No
//! crate offers a read-ahead that releases its buffer when drained, hence this module.
//!
//! May import: nothing of the proxy. Invariants: bytes come out in the order the socket gave
//! them, none twice and none lost; end of stream and errors are reported only once every byte
//! read before them has been handed on.

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest read of the socket: four full TLS records.
pub const READ_AHEAD: usize = 64 * 1024;

thread_local! {
    /// The buffer every [`ReadAhead`] on this thread reads the socket into. A poll never
    /// yields while it holds it.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; READ_AHEAD].into_boxed_slice());
}

/// A transport that reads ahead: see the module documentation.
#[derive(Debug)]
pub struct ReadAhead<T> {
    io: T,
    /// Bytes read from the socket and not yet handed on, from `.1` on.
    kept: Option<(Box<[u8]>, usize)>,
}

impl<T> ReadAhead<T> {
    /// Wrap a transport.
    pub const fn new(io: T) -> Self {
        Self { io, kept: None }
    }

    /// The transport.
    pub const fn get_ref(&self) -> &T {
        &self.io
    }

    /// Bytes read ahead and not handed on yet.
    pub fn kept_len(&self) -> usize {
        self.kept.as_ref().map_or(0, |(b, from)| b.len() - from)
    }
}

impl<T: AsyncRead + Unpin> ReadAhead<T> {
    /// Read the socket into `scratch` and hand on what `out` takes, keeping the rest.
    fn fill(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
        scratch: &mut [u8],
    ) -> Poll<io::Result<()>> {
        let mut read = ReadBuf::new(scratch);
        match Pin::new(&mut self.io).poll_read(cx, &mut read) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {}
        }
        let data = read.filled();
        let now = data.len().min(out.remaining());
        out.put_slice(&data[..now]);
        if now < data.len() {
            self.kept = Some((data[now..].into(), 0));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if let Some((buf, from)) = &mut this.kept {
            let n = (buf.len() - *from).min(out.remaining());
            out.put_slice(&buf[*from..*from + n]);
            *from += n;
            if *from == buf.len() {
                this.kept = None;
            }
            return Poll::Ready(Ok(()));
        }
        // A reader that asks for a whole read-ahead or more gains nothing from the copy.
        if out.remaining() >= READ_AHEAD {
            return Pin::new(&mut this.io).poll_read(cx, out);
        }
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => this.fill(cx, out, &mut scratch),
            // Only a transport that reads another `ReadAhead` on the same thread from inside
            // its own poll could get here; it gets a buffer of its own rather than a panic.
            Err(_) => this.fill(cx, out, &mut vec![0; READ_AHEAD]),
        })
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Every byte comes out once and in order, whatever the reader's buffer sizes; the
    /// connection keeps no buffer once drained; end of stream follows the last byte.
    #[tokio::test]
    async fn small_reads_see_every_byte_in_order_and_a_drained_reader_keeps_nothing() {
        let (mut writer, reader) = tokio::io::duplex(4 * READ_AHEAD);
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let expected = sent.clone();
        let feeder = tokio::spawn(async move {
            writer.write_all(&sent).await.unwrap();
            // writer dropped: end of stream
        });
        let mut r = ReadAhead::new(reader);
        let mut got = Vec::new();
        let mut sizes = [4096usize, 1, 17, 16 * 1024, 4096, READ_AHEAD, 3]
            .iter()
            .cycle();
        let mut saw_kept = false;
        loop {
            let mut buf = vec![0; *sizes.next().unwrap()];
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            saw_kept |= r.kept_len() > 0;
            got.extend_from_slice(&buf[..n]);
        }
        feeder.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "bytes out of order or altered");
        assert!(saw_kept, "a 4 KiB reader never left bytes read ahead");
        assert_eq!(r.kept_len(), 0);
        assert!(r.kept.is_none(), "a drained reader still holds a buffer");
    }

    /// One socket read serves several of rustls's 4 KiB reads.
    #[tokio::test]
    async fn one_large_read_serves_many_small_ones() {
        let (mut writer, reader) = tokio::io::duplex(READ_AHEAD);
        writer.write_all(&[7u8; 48 * 1024]).await.unwrap();
        let mut r = ReadAhead::new(reader);
        let mut buf = [0u8; 4096];
        assert_eq!(r.read(&mut buf).await.unwrap(), 4096);
        assert_eq!(r.kept_len(), 44 * 1024);
        // The rest is served from memory: no wake-up is needed, the writer sends nothing more.
        for _ in 0..11 {
            assert_eq!(r.read(&mut buf).await.unwrap(), 4096);
        }
        assert!(r.kept.is_none());
        drop(writer);
        assert_eq!(r.read(&mut buf).await.unwrap(), 0);
    }
}
