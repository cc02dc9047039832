//! The process's log subscriber with a filter that can be changed while it runs
//! (`aether debug log-level`, issue #10 §3): tracing-subscriber's `reload` layer holds the
//! `EnvFilter`, and a [`LogFilter`] handle, given to the daemon at start, swaps it.
//!
//! IO edge (Layer 1): no global is read by the model; the handle is passed in.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

/// A filter text that is refused.
#[derive(Debug, thiserror::Error)]
pub enum InvalidFilter {
    /// Nothing was given (`EnvFilter` would read it as "errors only": a slip, not a wish).
    #[error(
        "the log filter is empty (expected LEVEL[,target=LEVEL...], e.g. info,aether::proxy=debug)"
    )]
    Empty,
    /// `EnvFilter` does not accept it.
    #[error(
        "log filter {text:?} is not valid (expected LEVEL[,target=LEVEL...], e.g. info,aether::proxy=debug)"
    )]
    Syntax {
        /// What was given.
        text: String,
        /// Why it was refused.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
}

/// Changes the filter of the process's log subscriber.
///
/// Use: [`init`] installs the subscriber and returns the handle; give it to the daemon, whose
/// admin socket calls [`LogFilter::set`]. [`LogFilter::detached`] is a handle with no
/// subscriber behind it (tests, and processes that installed their own): it keeps the text
/// and changes nothing.
#[derive(Clone)]
pub struct LogFilter {
    current: Arc<parking_lot::Mutex<String>>,
    reload: Option<reload::Handle<EnvFilter, Registry>>,
}

impl std::fmt::Debug for LogFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFilter")
            .field("current", &*self.current.lock())
            .field("attached", &self.reload.is_some())
            .finish()
    }
}

impl LogFilter {
    /// A handle with no subscriber behind it, holding `text`.
    pub fn detached(text: &str) -> Self {
        Self {
            current: Arc::new(parking_lot::Mutex::new(text.to_owned())),
            reload: None,
        }
    }

    /// The filter in force, as it was given.
    pub fn current(&self) -> String {
        self.current.lock().clone()
    }

    /// Replace the filter (`LEVEL[,target=LEVEL...]`, `EnvFilter` syntax); the earlier text.
    /// A text that does not parse changes nothing.
    pub fn set(&self, text: &str) -> Result<String, InvalidFilter> {
        let filter = parse(text)?;
        let mut current = self.current.lock();
        if let Some(handle) = &self.reload {
            // Fails only when the subscriber is gone (the process is exiting): nothing to
            // filter any more, and the text is kept for the answer.
            let _ = handle.reload(filter);
        }
        Ok(std::mem::replace(&mut *current, text.to_owned()))
    }
}

fn parse(text: &str) -> Result<EnvFilter, InvalidFilter> {
    if text.trim().is_empty() {
        return Err(InvalidFilter::Empty);
    }
    EnvFilter::try_new(text).map_err(|source| InvalidFilter::Syntax {
        text: text.to_owned(),
        source,
    })
}

/// How logs are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Install the process's subscriber: `format` on stderr (ANSI colours on a terminal), filtered
/// by `level` (`info` when it does not parse). Returns the handle that changes the filter; a
/// process that already has a subscriber gets a detached one.
pub fn init(format: LogFormat, level: &str) -> LogFilter {
    let (filter, text) = match parse(level) {
        Ok(f) => (f, level.to_owned()),
        Err(_) => (EnvFilter::new("info"), "info".to_owned()),
    };
    let (filter, handle) = reload::Layer::new(filter);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let output = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .try_init()
        .is_ok();
    LogFilter {
        current: Arc::new(parking_lot::Mutex::new(text)),
        reload: installed.then_some(handle),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_filter_takes_effect_and_a_bad_one_changes_nothing() {
        let (layer, handle) = reload::Layer::new(EnvFilter::new("info"));
        let logs = LogFilter {
            current: Arc::new(parking_lot::Mutex::new("info".into())),
            reload: Some(handle),
        };
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            assert!(!tracing::enabled!(target: "aether::proxy", tracing::Level::DEBUG));
            assert_eq!(logs.set("warn,aether::proxy=debug").unwrap(), "info");
            tracing::callsite::rebuild_interest_cache();
            assert!(tracing::enabled!(target: "aether::proxy", tracing::Level::DEBUG));
            assert!(!tracing::enabled!(target: "aether::node", tracing::Level::INFO));
            let err = logs.set("aether::proxy=loud").unwrap_err().to_string();
            assert!(err.contains("not valid"), "{err}");
            assert!(logs.set("").is_err());
            assert_eq!(logs.current(), "warn,aether::proxy=debug");
            assert!(tracing::enabled!(target: "aether::proxy", tracing::Level::DEBUG));
        });
    }
}
