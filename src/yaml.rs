//! Every YAML the daemon and the lab read or write: manifests, the settings file, the lab API
//! server's apply bodies, `aether debug -o yaml`.
//!
//! One parser, `serde-saphyr` (maintained, and already in the build through kube's client),
//! with one set of options and bounds, so that no reader is looser than another:
//!
//! - **Size** is checked before anything is parsed ([`MAX_BYTES`]).
//! - **Depth** is bounded inside the parser ([`MAX_DEPTH`]): it stops at the first event past
//!   the bound (its scanner at the 256th open flow collection), so a file of 100,000 nested
//!   `[` costs what its first few hundred bytes cost.
//! - **Documents** are split here, by their `---` and `...` markers, so that every document
//!   keeps its index in the file (the parser skips empty ones) and is parsed with a budget of
//!   its own.
//! - The core schema of YAML 1.2: `yes`, `no`, `on` and `off` are strings, not booleans, as
//!   Kubernetes reads them; a key written twice is an error, not a silent overwrite.
//!
//! Hand-written: the document split ([`documents`]), about forty lines, because the parser's
//! multi-document readers drop empty documents (so an index in an error would point at the
//! wrong document) and share one budget across the whole stream.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The most bytes one YAML text may have: a manifest file, the settings file, a request body.
/// 64 MiB holds a 100,000-pod registry in one file; a larger text is refused unparsed.
pub const MAX_BYTES: usize = 64 * 1024 * 1024;

/// The deepest nesting of sequences and mappings a document may have. A Kubernetes object
/// nests about a dozen deep (the MeshFilter CRD 18, Gateway API's about thirty); the bound
/// keeps a hostile document from costing the parser's time or the stack: deserializing
/// recurses once a level, about 18 KB a level in a debug build, so 64 levels stay well inside
/// a 2 MiB thread stack (128 did not).
pub const MAX_DEPTH: usize = 64;

/// Why a YAML text was not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    /// The text is over [`MAX_BYTES`]; it was not parsed.
    #[error("{bytes} bytes, over the limit of {limit}")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A document nests deeper than [`MAX_DEPTH`].
    #[error("nested deeper than {limit} levels")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// The parser refused it, or the value is not of the expected shape.
    #[error("{0}")]
    Invalid(String),
}

impl YamlError {
    /// A short name of the kind of refusal, for a metric's label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too-large",
            Self::TooDeep { .. } => "too-deep",
            Self::Invalid(_) => "invalid",
        }
    }
}

#[allow(deprecated)] // `budget!` and `options!` set the fields the crate deprecates setting directly.
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            // Everything else is bounded by the size: at most an event, a node, a document
            // per byte.
            max_events: MAX_BYTES,
            max_nodes: MAX_BYTES,
            max_documents: MAX_BYTES,
            max_total_scalar_bytes: MAX_BYTES,
            max_total_comment_bytes: MAX_BYTES,
        },
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        strict_booleans: true,
        with_snippet: false,
    }
}

fn error(e: &serde_saphyr::Error) -> YamlError {
    match e {
        serde_saphyr::Error::Budget {
            breach: serde_saphyr::budget::BudgetBreach::Depth { .. },
            ..
        } => YamlError::TooDeep { limit: MAX_DEPTH },
        // The scanner counts flow levels (`[`, `{`) in a byte, ahead of the parser's events:
        // past 255 it stops before the budget sees the depth.
        other => match other.to_string() {
            m if m.starts_with("recursion limit exceeded") => {
                YamlError::TooDeep { limit: MAX_DEPTH }
            }
            m => YamlError::Invalid(m),
        },
    }
}

fn check_size(text: &str) -> Result<(), YamlError> {
    if text.len() > MAX_BYTES {
        return Err(YamlError::TooLarge {
            bytes: text.len(),
            limit: MAX_BYTES,
        });
    }
    Ok(())
}

/// One YAML document read into `T`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    check_size(text)?;
    serde_saphyr::from_str_with_options(text, options()).map_err(|e| error(&e))
}

/// [`from_str`] of bytes that must be UTF-8.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, YamlError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| YamlError::Invalid(format!("not UTF-8: {e}")))?;
    from_str(text)
}

/// Every document of `text` as a generic value (an empty one as `Null`), up to the first that
/// does not read, and that one's 1-based index and why.
pub fn documents_of(text: &str) -> (Vec<serde_json::Value>, Option<(usize, YamlError)>) {
    if let Err(e) = check_size(text) {
        return (Vec::new(), Some((1, e)));
    }
    let mut out = Vec::new();
    for (i, document) in documents(text).into_iter().enumerate() {
        match serde_saphyr::from_str_with_options::<Option<serde_json::Value>>(document, options())
        {
            Ok(value) => out.push(value.unwrap_or(serde_json::Value::Null)),
            Err(e) => return (out, Some((i + 1, error(&e)))),
        }
    }
    (out, None)
}

/// `value` as YAML text.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, YamlError> {
    serde_saphyr::to_string(value).map_err(|e| YamlError::Invalid(e.to_string()))
}

/// The texts of a stream's documents, each with its own markers.
///
/// A line that starts with `---` (then a space, a tab or its end) starts a document, and one
/// that starts with `...` ends one: YAML forbids both inside any scalar, so no content is cut.
/// Lines before the first marker that hold only comments, directives (`%YAML`) or blanks
/// belong to the document the marker starts; after an explicit `---` an empty document is a
/// document (`Null`), as the YAML spec reads it.
pub fn documents(text: &str) -> Vec<&str> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let marker = |line: &str, m: &str| {
        line.strip_prefix(m)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
    };
    let mut out = Vec::new();
    let (mut start, mut explicit, mut content) = (0, false, false);
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let line_start = at;
        at += line.len();
        if marker(line, "---") {
            if explicit || content {
                out.push(&text[start..line_start]);
                start = line_start;
            }
            (explicit, content) = (true, false);
        } else if marker(line, "...") {
            if explicit || content {
                out.push(&text[start..at]);
            }
            (start, explicit, content) = (at, false, false);
        } else {
            let trimmed = line.trim_start();
            let quiet = trimmed.is_empty() || trimmed.starts_with('#') || line.starts_with('%');
            content |= !quiet;
        }
    }
    if explicit || content {
        out.push(&text[start..]);
    }
    out
}

#[cfg(test)]
mod tests;
