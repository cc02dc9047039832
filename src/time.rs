//! The clock, read in one place (clippy.toml bans `Instant::now` and `SystemTime::now`
//! elsewhere). IO code calls these; pure code takes `now` as an argument.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The monotonic clock.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

/// The wall clock.
#[allow(clippy::disallowed_methods)]
pub fn wall() -> SystemTime {
    SystemTime::now()
}

/// The wall clock in milliseconds since the Unix epoch (0 before it).
pub fn wall_ms() -> u64 {
    wall()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The wall clock as RFC 3339 in whole seconds (a Kubernetes `metav1.Time`).
pub fn rfc3339_seconds() -> String {
    let secs = wall_ms() / 1000;
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|t| t.to_string())
        .unwrap_or_default()
}
