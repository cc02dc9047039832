//! Relaying bytes both ways between two streams (raw TCP, L4 hops, passthroughs, spliced
//! upgrades) without holding a buffer while the connection is idle, and with an idle deadline.
//!
//! `tokio::io::copy_bidirectional` gives each direction a heap buffer for the life of the
//! connection (two 8 KiB buffers, 16 KiB a relayed pair on each daemon it crosses, idle or
//! not: issue #8 finding 13 measured it). Here every read goes into one scratch buffer per
//! thread and is written on from there in the same poll; only bytes the writer cannot take at
//! once are copied into a buffer of the connection's own, which is freed as soon as the writer
//! has taken them. An idle relay holds no buffer at all, and a busy one copies no more than
//! tokio's does (the extra copy happens only under back-pressure). No crate offers a relay
//! that releases its buffers while idle, hence this module.
//!
//! May import: nothing of the proxy. Invariants: every byte read is written before the next
//! read of the same direction; end of stream on one side shuts the other side's writing down
//! once everything read before it is written and flushed, and the relay ends when both
//! directions have.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The size of one read: four whole TLS records' plaintext, so that a relay into the mesh hop
/// writes full records, and a bulk stream costs a quarter of the reads 16 KiB took (issue #11).
/// One buffer per thread, so its size costs no idle connection anything.
pub const READ_SIZE: usize = 64 * 1024;

thread_local! {
    /// The buffer every relay on this thread reads into. A poll never yields while it holds it.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; READ_SIZE].into_boxed_slice());
}

/// How a relay ended without an IO error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Both sides closed their writing, and everything each sent was delivered.
    Closed {
        /// Bytes from `a` to `b`.
        a_to_b: u64,
        /// Bytes from `b` to `a`.
        b_to_a: u64,
    },
    /// No byte moved either way for the idle timeout; the relay stopped (the caller drops both
    /// streams).
    Idle,
}

/// Relay bytes between `a` and `b` until both directions end, or until no byte moves either way
/// for `idle` (`None`: no idle deadline). A connection is closed between `idle` and twice
/// `idle` after its last byte: the deadline is checked when it passes, and re-armed once if a
/// byte moved since it was armed.
pub async fn bidirectional<A, B>(a: &mut A, b: &mut B, idle: Option<Duration>) -> io::Result<Ended>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    bidirectional_counted(a, b, idle, &mut Moved::default()).await
}

/// Bytes a relay moved each way, however it ended (an IO error included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Bytes from `a` to `b`.
    pub a_to_b: u64,
    /// Bytes from `b` to `a`.
    pub b_to_a: u64,
}

/// [`bidirectional`], writing the bytes moved each way to `moved` when it returns.
pub async fn bidirectional_counted<A, B>(
    a: &mut A,
    b: &mut B,
    idle: Option<Duration>,
    moved: &mut Moved,
) -> io::Result<Ended>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut a_to_b = Half::default();
    let mut b_to_a = Half::default();
    let mut timer = idle.map(|d| (d, Box::pin(tokio::time::sleep(d)), 0u64));
    let ended = poll_fn(|cx| {
        let forward = a_to_b.poll(cx, &mut *a, &mut *b)?;
        let backward = b_to_a.poll(cx, &mut *b, &mut *a)?;
        if forward.is_ready() && backward.is_ready() {
            return Poll::Ready(Ok(Ended::Closed {
                a_to_b: a_to_b.moved,
                b_to_a: b_to_a.moved,
            }));
        }
        if let Some((period, sleep, seen)) = &mut timer {
            let moved = a_to_b.moved + b_to_a.moved;
            while poll_sleep(sleep, cx).is_ready() {
                if moved == *seen {
                    return Poll::Ready(Ok(Ended::Idle));
                }
                *seen = moved;
                sleep.as_mut().reset(Instant::now() + *period);
            }
        }
        Poll::Pending
    })
    .await;
    *moved = Moved {
        a_to_b: a_to_b.moved,
        b_to_a: b_to_a.moved,
    };
    ended
}

fn poll_sleep(sleep: &mut Pin<Box<Sleep>>, cx: &mut Context<'_>) -> Poll<()> {
    sleep.as_mut().poll(cx)
}

/// One direction of a relay.
#[derive(Debug, Default)]
struct Half {
    /// Bytes read but not yet taken by the writer, from `pending.1` on.
    pending: Option<(Box<[u8]>, usize)>,
    /// Bytes written since the writer was last flushed.
    unflushed: bool,
    /// The reader reached its end.
    eof: bool,
    /// The writer was shut down: this direction is done.
    done: bool,
    /// Bytes written so far.
    moved: u64,
}

/// What one read into the scratch buffer gave.
enum Step {
    /// The reader has nothing now.
    Idle,
    /// Everything read was written.
    Wrote,
    /// The writer took part of what was read; the rest is kept.
    Stalled(Box<[u8]>),
    /// End of stream.
    Eof,
}

impl Half {
    fn poll<R, W>(&mut self, cx: &mut Context<'_>, r: &mut R, w: &mut W) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            if let Some((buf, from)) = &mut self.pending {
                while *from < buf.len() {
                    let n = ready!(Pin::new(&mut *w).poll_write(cx, &buf[*from..]))?;
                    if n == 0 {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                    }
                    *from += n;
                    self.moved += n as u64;
                    self.unflushed = true;
                }
                self.pending = None;
            }
            if self.eof {
                ready!(Pin::new(&mut *w).poll_flush(cx))?;
                ready!(Pin::new(&mut *w).poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            match self.read_and_write(cx, r, w)? {
                Step::Idle => {
                    if self.unflushed {
                        ready!(Pin::new(&mut *w).poll_flush(cx))?;
                        self.unflushed = false;
                    }
                    return Poll::Pending;
                }
                Step::Wrote => {}
                Step::Stalled(rest) => self.pending = Some((rest, 0)),
                Step::Eof => self.eof = true,
            }
        }
    }

    /// Read once into the thread's scratch buffer and write what was read, as far as the
    /// writer takes it without waiting.
    fn read_and_write<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        r: &mut R,
        w: &mut W,
    ) -> io::Result<Step>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => self.step(cx, r, w, &mut scratch),
            // Only a reader or writer that relays on the same thread from inside its own poll
            // could get here; it gets a buffer of its own rather than a panic.
            Err(_) => self.step(cx, r, w, &mut vec![0; READ_SIZE]),
        })
    }

    fn step<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        r: &mut R,
        w: &mut W,
        scratch: &mut [u8],
    ) -> io::Result<Step>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        let mut buf = ReadBuf::new(scratch);
        match Pin::new(&mut *r).poll_read(cx, &mut buf) {
            Poll::Pending => return Ok(Step::Idle),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Ready(Ok(())) => {}
        }
        let data = buf.filled();
        if data.is_empty() {
            return Ok(Step::Eof);
        }
        let mut from = 0;
        while from < data.len() {
            match Pin::new(&mut *w).poll_write(cx, &data[from..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => {
                    from += n;
                    self.moved += n as u64;
                    self.unflushed = true;
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(Step::Stalled(data[from..].into())),
            }
        }
        Ok(Step::Wrote)
    }
}

#[cfg(test)]
mod tests;
