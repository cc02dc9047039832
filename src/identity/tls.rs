//! rustls configurations of the mesh hop (model.md §14): TLS 1.3 only, the aws-lc provider,
//! mutual authentication against the mesh CA, and certificates that follow rotation.
//!
//! Both sides resolve their own certificate through [`Identities`] on every handshake, so a
//! rotation ([`Identities::rotate_due`]) needs no new config. The server requires a client
//! certificate chaining to the CA; the client checks the server's chain and its name (the
//! hop's SNI `<port>.<svc>.<ns>.<mesh-domain>` against the server's `*.<sa>.<ns>.<mesh-domain>`).
//! Who the peer is (its SPIFFE ID) is read after the handshake with [`peer_identity`].

use std::sync::Arc;

use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

use super::{Identities, IdentityError, SpiffeId};

/// The server side of the mesh hop for a local workload of `service_account` in `namespace`:
/// presents its (rotating) certificate, requires a client certificate chaining to the CA and
/// offers `alpn` in order.
pub fn server_config(
    identities: &Arc<Identities>,
    namespace: &str,
    service_account: &str,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, IdentityError> {
    let provider = Arc::clone(identities.provider());
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots(identities)?, Arc::clone(&provider))
            .build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(WorkloadResolver::new(
            identities,
            namespace,
            service_account,
        )));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The client side of the mesh hop for a source workload of `service_account` in
/// `namespace`: presents its (rotating) certificate and verifies the server's chain and name
/// against the CA bundle. Connect with [`Identities::server_name`] as the server name.
pub fn client_config(
    identities: &Arc<Identities>,
    namespace: &str,
    service_account: &str,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, IdentityError> {
    let provider = Arc::clone(identities.provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(identities)?)
        .with_client_cert_resolver(Arc::new(WorkloadResolver::new(
            identities,
            namespace,
            service_account,
        )));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The SPIFFE ID a verified peer chain proves: the end entity's one URI SAN, parsed, of
/// `trust_domain`. A certificate of another trust domain is refused even when our CA signed
/// it. Call it on `peer_certificates()` after the handshake (which checked the chain).
pub fn peer_identity(
    trust_domain: &str,
    certs: &[CertificateDer<'_>],
) -> Result<SpiffeId, IdentityError> {
    let leaf = certs.first().ok_or(IdentityError::NoPeerCertificate)?;
    let (_, x509) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|_| IdentityError::UnparsablePeerCertificate)?;
    let sans = x509
        .subject_alternative_name()
        .map_err(|_| IdentityError::UnparsablePeerCertificate)?;
    let uris: Vec<&str> = sans
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect();
    let [uri] = uris.as_slice() else {
        return Err(IdentityError::UriSanCount { count: uris.len() });
    };
    let id = SpiffeId::parse(uri)?;
    if id.trust_domain != trust_domain {
        return Err(IdentityError::ForeignTrustDomain {
            expected: trust_domain.to_owned(),
            got: id.trust_domain,
        });
    }
    Ok(id)
}

fn roots(identities: &Identities) -> Result<Arc<RootCertStore>, IdentityError> {
    let mut roots = RootCertStore::empty();
    for cert in identities.bundle() {
        roots.add(cert)?;
    }
    Ok(Arc::new(roots))
}

/// Resolves one workload's current certificate from [`Identities`] on every handshake, on
/// either side of it.
#[derive(Debug)]
struct WorkloadResolver {
    identities: Arc<Identities>,
    namespace: String,
    service_account: String,
}

impl WorkloadResolver {
    fn new(identities: &Arc<Identities>, namespace: &str, service_account: &str) -> Self {
        Self {
            identities: Arc::clone(identities),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        }
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        match self.identities.certificate(
            &self.namespace,
            &self.service_account,
            crate::time::wall(),
        ) {
            Ok(cert) => Some(Arc::clone(&cert.key)),
            Err(error) => {
                // The handshake fails without a certificate; the log says why.
                tracing::warn!(namespace = %self.namespace, service_account = %self.service_account, %error, "no workload certificate");
                None
            }
        }
    }
}

impl ResolvesServerCert for WorkloadResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl ResolvesClientCert for WorkloadResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
