//! How often one kind's lists and watches may go to the API server (issue #36 item 1).
//!
//! kube-runtime's `StreamBackoff` resets on every event the watcher yields, and the watcher
//! yields `Init` before each list: a kind answered `404` or `403` was listed again every
//! ~1.2 s forever, and a watch the server ended at once was reopened 40 times a second. The
//! pace here is client-go's reflector made stricter, and it is kept per kind at the request
//! (the kind's client, [`super::Answered`]), where every list and watch passes:
//!
//! - A failure (no answer, an error status, a watch that ended at once with nothing in it)
//!   makes the next request of the kind wait: 0.8 s, doubling to 30 s, each wait jittered by
//!   ±25 % so that a fleet of nodes does not come back in step.
//! - The wait resets only once a watch has lived and delivered: its first event, or an end
//!   after it lived [`Backoff::short_watch`]. A list answered between failures does not reset
//!   it (a list that succeeds and a watch that fails would otherwise loop).
//! - A server that does not answer at all (connection refused, a timeout) costs it nothing:
//!   those waits stop at [`Backoff::max_unreachable`] (5 s), so that a node catches up within
//!   a few seconds of an outage's end.
//! - A kind the server does not serve (`404`: its CRD is not installed) is asked for again
//!   once per [`Backoff::absent_recheck`] (5 min).
//! - `410 Gone` is not a failure: the watcher relists at once, as client-go does.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The pace of one kind's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after a first failure.
    pub initial: Duration,
    /// The longest wait after failures the server answered (an error status, a watch that
    /// ended at once).
    pub max: Duration,
    /// The longest wait after failures the server did not answer.
    pub max_unreachable: Duration,
    /// A watch that ends sooner than this with nothing delivered ended "at once": a failure.
    pub short_watch: Duration,
    /// How often a kind the server does not serve is asked for again.
    pub absent_recheck: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            max_unreachable: Duration::from_secs(5),
            short_watch: Duration::from_secs(1),
            absent_recheck: Duration::from_secs(300),
        }
    }
}

/// What went wrong with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No answer: the connection failed or timed out.
    Unreachable,
    /// An answer with an error status (403, 429, 5xx, ...).
    Refused,
    /// A watch that ended at once with nothing delivered.
    ShortWatch,
}

/// One kind's pace: when its next request may go.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    backoff: Backoff,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Failures since a watch last lived and delivered.
    failures: u32,
    /// The next request waits until then.
    due: Option<Instant>,
}

impl Pacer {
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            inner: Mutex::default(),
        }
    }

    pub(crate) fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// When the next request may go, if it must wait.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.inner.lock().due
    }

    /// A request failed at `now`: the next one waits. Returns the wait.
    pub(crate) fn failed(&self, failure: Failure, now: Instant) -> Duration {
        let mut inner = self.inner.lock();
        inner.failures = inner.failures.saturating_add(1);
        let cap = match failure {
            Failure::Unreachable => self.backoff.max_unreachable,
            Failure::Refused | Failure::ShortWatch => self.backoff.max,
        };
        let wait = jittered(
            exponential(self.backoff.initial, inner.failures, cap),
            fastrand::f64(),
        );
        inner.due = Some(now + wait);
        wait
    }

    /// The server does not serve the kind (404) at `now`: ask again after the slow period.
    pub(crate) fn absent(&self, now: Instant) {
        let mut inner = self.inner.lock();
        inner.due = Some(now + jittered(self.backoff.absent_recheck, fastrand::f64()));
    }

    /// A watch lived and delivered: the failures are forgotten.
    pub(crate) fn delivered(&self) {
        let mut inner = self.inner.lock();
        inner.failures = 0;
        inner.due = None;
    }
}

/// `initial` doubled for each failure after the first, at most `cap`.
fn exponential(initial: Duration, failures: u32, cap: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    initial.saturating_mul(1 << doublings).min(cap)
}

/// `wait` spread over ±25 % by `unit` (uniform in `[0, 1)`).
fn jittered(wait: Duration, unit: f64) -> Duration {
    wait.mul_f64(0.75 + unit.clamp(0.0, 1.0) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_the_first_failure_to_their_cap() {
        let ms = Duration::from_millis;
        let waits: Vec<Duration> = (1..=8)
            .map(|n| exponential(ms(800), n, Duration::from_secs(30)))
            .collect();
        assert_eq!(
            waits,
            [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000].map(ms)
        );
        assert_eq!(
            exponential(ms(800), u32::MAX, Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(jittered(ms(1000), 0.0), ms(750));
        let top = jittered(ms(1000), 0.999_999);
        assert!(top > ms(1249) && top < ms(1250), "{top:?}");
    }

    #[test]
    fn only_a_watch_that_delivered_resets_the_wait() {
        let pacer = Pacer::new(Backoff::default());
        let now = Instant::now();
        assert_eq!(pacer.due(), None);
        let first = pacer.failed(Failure::Refused, now);
        let second = pacer.failed(Failure::ShortWatch, now);
        assert!(first <= Duration::from_millis(1000), "{first:?}");
        assert!(second >= Duration::from_millis(1200), "{second:?}");
        // A server that does not answer: short waits however many failures.
        for _ in 0..20 {
            pacer.failed(Failure::Unreachable, now);
        }
        assert!(pacer.due().expect("a wait") <= now + Duration::from_millis(6250));
        pacer.delivered();
        assert_eq!(pacer.due(), None);
        assert!(pacer.failed(Failure::Refused, now) <= Duration::from_millis(1000));
        pacer.absent(now);
        assert!(pacer.due().expect("a wait") >= now + Duration::from_secs(225));
    }
}
