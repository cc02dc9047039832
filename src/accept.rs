//! Accepting connections without giving up: the one accept loop step every listener of the
//! daemon uses (issue #8, finding 5).
//!
//! An `accept` fails for reasons that pass: the process or the system is out of file
//! descriptors (`EMFILE`, `ENFILE`), out of memory for socket buffers (`ENOBUFS`, `ENOMEM`), or
//! a connection was reset while it waited in the backlog (`ECONNABORTED`). None of them is a
//! reason to stop serving, and retrying at once only spins: the connection that could not be
//! taken is still waiting, so the listener stays readable. [`Acceptor::accept`] therefore
//! waits after each error, exponentially longer from [`BACKOFF_MIN`] to [`BACKOFF_MAX`], starts
//! again from the minimum after a success, counts every error, and logs at most one line per
//! [`LOG_EVERY`] (with the number of errors it did not log).
//!
//! Use: wrap the listener once, then loop on [`Acceptor::accept`], which only returns a
//! connection:
//!
//! ```no_run
//! # async fn f(listener: tokio::net::TcpListener, errors: prometheus_client::metrics::counter::Counter) {
//! let mut acceptor = aether::accept::Acceptor::new(listener, "capture", errors);
//! loop {
//!     let (stream, _peer) = acceptor.accept().await;
//!     tokio::spawn(async move { drop(stream) });
//! }
//! # }
//! ```
//!
//! Layer 1 (glue): tokio's clock and listeners, a prometheus counter, `tracing`.

use std::io;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

/// The first wait after an accept error.
pub const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest wait between two accept attempts while errors last.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one log line per this long, per listener.
pub const LOG_EVERY: Duration = Duration::from_secs(1);

/// A listener whose `accept` may fail: tokio's TCP and unix listeners, or a test's stand-in.
pub trait Listener {
    /// What one accept gives: the connection and its peer address.
    type Conn;
    /// Accept one connection.
    fn accept(&self) -> impl Future<Output = io::Result<Self::Conn>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Conn = (tokio::net::TcpStream, std::net::SocketAddr);

    fn accept(&self) -> impl Future<Output = io::Result<Self::Conn>> + Send {
        Self::accept(self)
    }
}

impl Listener for tokio::net::UnixListener {
    type Conn = (tokio::net::UnixStream, tokio::net::unix::SocketAddr);

    fn accept(&self) -> impl Future<Output = io::Result<Self::Conn>> + Send {
        Self::accept(self)
    }
}

/// What to do after one accept error ([`Backoff::on_error`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AfterError {
    /// Wait this long before the next attempt.
    pub wait: Duration,
    /// Log this error, with this many earlier ones that were not logged; `None`: stay quiet.
    pub log: Option<u64>,
}

/// The wait and log schedule of one listener's accept errors. Takes the time as an argument, so
/// that the schedule is tested without a clock.
#[derive(Clone, Debug)]
pub struct Backoff {
    next: Duration,
    last_log: Option<Instant>,
    unlogged: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_MIN,
            last_log: None,
            unlogged: 0,
        }
    }
}

impl Backoff {
    /// One accept failed at `now`: how long to wait, and whether to log.
    pub fn on_error(&mut self, now: Instant) -> AfterError {
        let wait = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        let log = match self.last_log {
            Some(at) if now.saturating_duration_since(at) < LOG_EVERY => {
                self.unlogged += 1;
                None
            }
            _ => {
                self.last_log = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        };
        AfterError { wait, log }
    }

    /// One accept succeeded: the next error waits the minimum again.
    pub fn on_success(&mut self) {
        self.next = BACKOFF_MIN;
    }
}

/// A listener with its error schedule and counter (see the module doc).
#[derive(Debug)]
pub struct Acceptor<L> {
    listener: L,
    what: &'static str,
    errors: Counter,
    backoff: Backoff,
}

impl<L: Listener> Acceptor<L> {
    /// Accept on `listener`, named `what` in logs, counting errors in `errors`.
    pub fn new(listener: L, what: &'static str, errors: Counter) -> Self {
        Self {
            listener,
            what,
            errors,
            backoff: Backoff::default(),
        }
    }

    /// The listener.
    pub fn listener(&self) -> &L {
        &self.listener
    }

    /// The next connection. Errors are counted, logged at most once per [`LOG_EVERY`] and
    /// waited out; this never returns an error and never gives up.
    pub async fn accept(&mut self) -> L::Conn {
        loop {
            match self.listener.accept().await {
                Ok(conn) => {
                    self.backoff.on_success();
                    return conn;
                }
                Err(error) => {
                    self.errors.inc();
                    let step = self.backoff.on_error(Instant::now());
                    if let Some(unlogged) = step.log {
                        tracing::warn!(listener = self.what, %error, retry_in = ?step.wait,
                            errors_not_logged = unlogged, "accept failed; retrying");
                    }
                    tokio::time::sleep(step.wait).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn the_wait_doubles_from_5_ms_to_1_s_and_a_success_starts_it_again() {
        let mut b = Backoff::default();
        let now = Instant::now();
        let waits: Vec<u128> = (0..10).map(|_| b.on_error(now).wait.as_millis()).collect();
        assert_eq!(waits, vec![5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.on_success();
        assert_eq!(b.on_error(now).wait, BACKOFF_MIN);
    }

    #[test]
    fn errors_are_logged_at_most_once_a_second_with_the_number_left_unlogged() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(b.on_error(at(0)).log, Some(0));
        assert_eq!(b.on_error(at(10)).log, None);
        assert_eq!(b.on_error(at(999)).log, None);
        assert_eq!(b.on_error(at(1000)).log, Some(2));
        assert_eq!(b.on_error(at(1500)).log, None);
        // A success does not reset the log schedule: a flapping listener still logs once a second.
        b.on_success();
        assert_eq!(b.on_error(at(1600)).log, None);
        assert_eq!(b.on_error(at(2100)).log, Some(2));
    }

    /// A listener that fails `failures` times (EMFILE), then hands out numbered connections.
    #[derive(Debug, Default)]
    struct Scripted {
        failures: AtomicU32,
        accepted: AtomicU32,
        attempts: AtomicU32,
    }

    impl Listener for Arc<Scripted> {
        type Conn = u32;

        fn accept(&self) -> impl Future<Output = io::Result<u32>> + Send {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let failing = self
                .failures
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
            std::future::ready(if failing {
                Err(io::Error::from_raw_os_error(nix::libc::EMFILE))
            } else {
                Ok(self.accepted.fetch_add(1, Ordering::Relaxed) + 1)
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_waited_out_counted_and_the_listener_serves_again() {
        let script = Arc::new(Scripted::default());
        script.failures.store(12, Ordering::Relaxed);
        let errors = Counter::default();
        let mut acceptor = Acceptor::new(script.clone(), "test", errors.clone());
        let start = Instant::now();
        assert_eq!(acceptor.accept().await, 1);
        assert_eq!(errors.get(), 12);
        assert_eq!(script.attempts.load(Ordering::Relaxed), 13);
        // 5+10+...+640 ms, then 1 s for each of the last four: no attempt without a wait.
        assert_eq!(start.elapsed(), Duration::from_millis(1275 + 4000));
        // After the success, the next error waits the minimum again.
        script.failures.store(1, Ordering::Relaxed);
        let again = Instant::now();
        assert_eq!(acceptor.accept().await, 2);
        assert_eq!(again.elapsed(), BACKOFF_MIN);
        assert_eq!(errors.get(), 13);
    }
}
