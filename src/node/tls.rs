//! The mesh hop's TLS, from workload identities: configs cached per (workload, ALPN); the
//! certificates inside rotate without a rebuild.

use std::sync::Arc;

use dashmap::DashMap;
use rustls::pki_types::CertificateDer;
use tracing::warn;

use crate::identity::Identities;
use crate::identity::tls::{client_config, peer_identity, server_config};
use crate::proxy::{ALPNS, HopTls, Peer};

/// [`HopTls`] over [`Identities`].
#[derive(Debug)]
pub struct IdentityTls {
    identities: Arc<Identities>,
    clients: DashMap<(String, String, Vec<u8>), Arc<rustls::ClientConfig>>,
    servers: DashMap<(String, String), Arc<rustls::ServerConfig>>,
}

impl IdentityTls {
    /// Over these identities.
    pub fn new(identities: Arc<Identities>) -> Self {
        Self {
            identities,
            clients: DashMap::new(),
            servers: DashMap::new(),
        }
    }
}

/// A config that refuses every handshake: used only if building the real one failed, so that a
/// broken identity never turns into plaintext.
fn refusing_client() -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    )
}

impl HopTls for IdentityTls {
    fn client(
        &self,
        namespace: &str,
        service_account: &str,
        alpn: &[u8],
    ) -> Arc<rustls::ClientConfig> {
        let key = (
            namespace.to_owned(),
            service_account.to_owned(),
            alpn.to_vec(),
        );
        if let Some(c) = self.clients.get(&key) {
            return c.clone();
        }
        match client_config(&self.identities, namespace, service_account, &[alpn]) {
            Ok(c) => {
                self.clients.insert(key, c.clone());
                c
            }
            Err(e) => {
                warn!(error = %e, namespace, service_account, "client tls config");
                refusing_client()
            }
        }
    }

    fn server(&self, namespace: &str, service_account: &str) -> Option<Arc<rustls::ServerConfig>> {
        let key = (namespace.to_owned(), service_account.to_owned());
        if let Some(c) = self.servers.get(&key) {
            return Some(c.clone());
        }
        match server_config(&self.identities, namespace, service_account, ALPNS) {
            Ok(c) => {
                self.servers.insert(key, c.clone());
                Some(c)
            }
            Err(e) => {
                warn!(error = %e, namespace, service_account, "server tls config");
                None
            }
        }
    }

    fn peer(&self, chain: &[CertificateDer<'_>]) -> Option<Peer> {
        let id = peer_identity(self.identities.trust_domain(), chain).ok()?;
        Some(Peer {
            namespace: id.namespace.clone(),
            service_account: id.service_account.clone(),
            id: id.to_string(),
        })
    }
}
