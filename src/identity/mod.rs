//! Workload identity: SPIFFE IDs from ServiceAccounts, a CA, per-ServiceAccount workload
//! certificates that rotate, and the rustls configurations of the mesh hop (model.md §14).
//!
//! Layer 2 (IO edge): it reads key files and the wall clock (through [`crate::time`]). Its
//! pure part is [`id`]. The rest:
//! - [`ca::Ca`] loads or creates the signing CA and gives the trust bundle; [`ca_key`] reads its
//!   key in every PEM form CA tools write;
//! - [`certs::Identities`] issues, caches and rotates workload certificates;
//! - [`tls`] builds TLS 1.3 server and client configs whose certificates follow rotation
//!   without a rebuild, and reads the peer's identity from its certificate.

pub mod ca;
pub mod ca_key;
pub mod certs;
pub use aether_core::identity::id;
pub mod tls;

use std::io;
use std::path::PathBuf;

pub use ca::Ca;
pub use certs::{Identities, IdentitySettings, WorkloadCert};
pub use id::{InvalidSpiffeId, SpiffeId};
pub use tls::{client_config, peer_identity, server_config};

/// What broke while loading a CA, issuing a certificate, building a TLS config or reading a
/// peer's identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A CA file could not be read or written.
    #[error("ca file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A CA file holds no usable PEM certificate, or a key that is not the certificate's.
    #[error("ca file {path} holds no usable pem {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// `certificate` or `private key matching the certificate`.
        what: &'static str,
    },
    /// The CA key file holds no key the CA can sign with: the form and why.
    #[error("ca key file {path} {problem}")]
    CaKey {
        /// The file.
        path: PathBuf,
        /// What is wrong with its key.
        problem: ca_key::InvalidCaKey,
    },
    /// Generating a key or signing a certificate failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused a key, a certificate or a configuration.
    #[error("tls setup failed: {0}")]
    Tls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built from the bundle.
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The peer presented no certificate.
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
    /// The peer's end-entity certificate is not parsable X.509.
    #[error("the peer's certificate is not parsable x.509")]
    UnparsablePeerCertificate,
    /// The peer's certificate does not carry exactly one URI SAN.
    #[error("the peer's certificate carries {count} uri sans, not exactly one")]
    UriSanCount {
        /// How many URI SANs it carries.
        count: usize,
    },
    /// The peer's URI SAN is not a SPIFFE ID of the mesh's form.
    #[error("the peer's uri san: {0}")]
    InvalidSpiffeId(#[from] InvalidSpiffeId),
    /// The peer's SPIFFE ID belongs to another trust domain.
    #[error("the peer's trust domain {got} is not {expected}")]
    ForeignTrustDomain {
        /// Ours.
        expected: String,
        /// The peer's.
        got: String,
    },
}
