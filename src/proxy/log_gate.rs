//! A warning a peer can cause, logged at most once a second: each refusal is counted in its
//! metric, and the log says that it happens and how often, without becoming a flood that a
//! hostile peer drives (every refusal is also a `debug` event).
//!
//! May import: the clock. Invariant: no lock; a warning lost to a race is one more
//! suppressed, never a second line in the same second.

use std::sync::atomic::{AtomicU64, Ordering};

/// The gate of one kind of warning.
#[derive(Debug, Default)]
pub struct LogGate {
    /// The wall clock (ms) before which nothing more is logged.
    next_ms: AtomicU64,
    /// Events not logged since the last line.
    suppressed: AtomicU64,
}

/// How long a gate stays shut after a line.
const INTERVAL_MS: u64 = 1000;

impl LogGate {
    /// `Some(n)` when this event may be logged, `n` the events left out since the last line;
    /// `None` when it is left out.
    pub fn pass(&self) -> Option<u64> {
        self.pass_at(crate::time::wall_ms())
    }

    fn pass_at(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Acquire);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms + INTERVAL_MS,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::AcqRel));
        }
        self.suppressed.fetch_add(1, Ordering::AcqRel);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_second_with_the_count_left_out() {
        let g = LogGate::default();
        assert_eq!(g.pass_at(10_000), Some(0));
        assert_eq!(g.pass_at(10_001), None);
        assert_eq!(g.pass_at(10_999), None);
        assert_eq!(g.pass_at(11_000), Some(2));
        assert_eq!(g.pass_at(11_500), None);
        assert_eq!(g.pass_at(20_000), Some(1));
    }
}
