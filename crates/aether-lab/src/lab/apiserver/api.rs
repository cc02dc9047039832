//! The names and refusals the stand-in API server's parts share: where an object is stored
//! ([`Key`]) and a request refused as the API server's `Status` says it ([`ApiError`]). Its own
//! module so the store and the selectors each read it without reading each other.

use super::resources::ResourceType;

/// Where an object is stored.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// Its type.
    pub resource: ResourceType,
    /// Its namespace (empty for a cluster-scoped type).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A request the store refuses, as the API server's `Status` says it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub code: u16,
    /// The `Status` reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

impl ApiError {
    /// `code reason` with `message`.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }
}
