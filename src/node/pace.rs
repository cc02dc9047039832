//! When the publisher takes a registry change (`node::publish`).
//!
//! The watched sources' changes are whole objects: a change after a quiet spell is published
//! at once (the leading edge), and publishes are then kept at least `publish_coalesce_ms` apart,
//! every change meanwhile taken by the next one. A file in the registry directory may be read
//! while a generator is still writing it, and a write is many file events: a change there waits
//! `watch_debounce_ms` of its own before the directory is read (the trailing edge).

use std::time::Duration;

use tokio::time::Instant;

/// Which edge a change is recompiled on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Edge {
    /// At once after a quiet spell, then at most once per spacing (the Kubernetes source).
    Leading,
    /// Always a spacing after the change (the registry directory).
    Trailing,
}

/// The spacing of reloads, and when the last one started.
#[derive(Debug)]
pub(crate) struct Pace {
    edge: Edge,
    spacing: Duration,
    last: Option<Instant>,
}

impl Pace {
    pub(crate) fn new(edge: Edge, spacing: Duration) -> Self {
        Self {
            edge,
            spacing,
            last: None,
        }
    }

    /// How long a change seen at `now` waits before its reload starts.
    pub(crate) fn wait(&self, now: Instant) -> Duration {
        match (self.edge, self.last) {
            (Edge::Trailing, _) => self.spacing,
            (Edge::Leading, None) => Duration::ZERO,
            (Edge::Leading, Some(last)) => (last + self.spacing).saturating_duration_since(now),
        }
    }

    /// A reload starts at `now`.
    pub(crate) fn started(&mut self, now: Instant) {
        self.last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPACING: Duration = Duration::from_millis(200);

    #[test]
    fn a_kubernetes_change_after_a_quiet_spell_is_reloaded_at_once() {
        let t0 = Instant::now();
        let mut pace = Pace::new(Edge::Leading, SPACING);
        assert_eq!(pace.wait(t0), Duration::ZERO, "the first change");
        pace.started(t0);
        let later = t0 + SPACING + Duration::from_millis(1);
        assert_eq!(
            pace.wait(later),
            Duration::ZERO,
            "a change after the spacing"
        );
    }

    #[test]
    fn kubernetes_reloads_are_kept_a_spacing_apart() {
        let t0 = Instant::now();
        let mut pace = Pace::new(Edge::Leading, SPACING);
        pace.started(t0);
        assert_eq!(pace.wait(t0), SPACING);
        assert_eq!(
            pace.wait(t0 + Duration::from_millis(150)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn a_directory_change_always_waits_the_spacing() {
        let t0 = Instant::now();
        let mut pace = Pace::new(Edge::Trailing, SPACING);
        assert_eq!(pace.wait(t0), SPACING, "even the first change");
        pace.started(t0);
        assert_eq!(pace.wait(t0 + Duration::from_secs(60)), SPACING);
    }
}
