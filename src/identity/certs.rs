//! Workload certificates, one per (namespace, ServiceAccount), issued on first use, cached,
//! and re-issued after half their lifetime.
//!
//! IO edge, but pure of tasks and of the clock: every function that decides validity takes
//! `now`. The daemon calls [`Identities::rotate_due`] periodically; the TLS resolvers call
//! [`Identities::certificate`] on each handshake with `crate::time::wall()`.
//!
//! A certificate carries (model.md §14):
//! - the URI SAN `spiffe://<trust-domain>/ns/<ns>/sa/<sa>` (the caller identity a destination
//!   authorizes);
//! - the DNS SAN `*.<sa>.<ns>.<mesh-domain>`: the mesh hop's SNI is
//!   `<port>.<svc>.<ns>.<mesh-domain>` and the service IS the ServiceAccount, so the client's
//!   standard server-name check binds the hop to the service whatever the port.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use rcgen::{ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use super::id::{InvalidSpiffeId, SpiffeId};
use super::{Ca, IdentityError};

/// The settings of workload identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentitySettings {
    /// The SPIFFE trust domain of issued and accepted identities. Default `cluster.local`
    /// (ARCHITECTURE.md, "Defaults").
    pub trust_domain: String,
    /// The mesh domain, suffix of the hop's SNI and of the certificates' DNS SAN. Default
    /// `aether.internal`.
    pub mesh_domain: String,
    /// How long a workload certificate is valid, counted from its issue time. Default 24 h.
    /// It is re-issued once half of its lifetime has passed.
    pub validity: Duration,
    /// How far `notBefore` lies before the issue time, for peers whose clocks lag. Default
    /// 5 min.
    pub backdate: Duration,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        Self {
            trust_domain: "cluster.local".to_owned(),
            mesh_domain: "aether.internal".to_owned(),
            validity: Duration::from_secs(24 * 3600),
            backdate: Duration::from_secs(5 * 60),
        }
    }
}

/// One issued workload certificate with its key, ready for rustls.
#[derive(Debug)]
pub struct WorkloadCert {
    /// The identity it proves.
    pub id: SpiffeId,
    /// The chain (leaf only: peers trust the CA directly) and the signing key.
    pub key: Arc<CertifiedKey>,
    /// `notBefore`.
    pub not_before: SystemTime,
    /// `notAfter`.
    pub not_after: SystemTime,
}

impl WorkloadCert {
    /// When more than half of the lifetime has passed and the certificate is due for
    /// re-issue.
    pub fn rotate_at(&self) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + life / 2
    }

    /// The leaf certificate (DER).
    pub fn leaf(&self) -> &CertificateDer<'static> {
        // Invariant: `issue` builds the chain with the leaf in it.
        &self.key.cert[0]
    }

    /// The leaf's serial number, as colon-separated hex bytes (as `openssl x509 -serial`
    /// groups them); `None` if the leaf does not parse.
    pub fn serial(&self) -> Option<String> {
        let (_, x509) = x509_parser::parse_x509_certificate(self.leaf()).ok()?;
        Some(
            x509.raw_serial()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":"),
        )
    }
}

/// The workload certificates of this node, per (namespace, ServiceAccount).
///
/// Use:
/// 1. build it once from the [`Ca`] and [`IdentitySettings`] and share it in an `Arc`;
/// 2. give it to [`super::server_config`] / [`super::client_config`], whose resolvers call
///    [`Identities::certificate`] on every handshake (the first call for an identity issues);
/// 3. call [`Identities::rotate_due`] periodically (well under half the validity); lookups
///    after it return the new certificates, with no config rebuilt.
#[derive(Debug)]
pub struct Identities {
    ca: Arc<Ca>,
    settings: IdentitySettings,
    provider: Arc<CryptoProvider>,
    cache: DashMap<(String, String), Arc<WorkloadCert>>,
}

impl Identities {
    /// The identities signed by `ca`, under `settings`. Fails when the trust domain is not a
    /// valid SPIFFE trust domain.
    pub fn new(ca: Arc<Ca>, settings: IdentitySettings) -> Result<Self, InvalidSpiffeId> {
        // Checks the trust domain once, with a placeholder path that is always valid.
        SpiffeId::new(&settings.trust_domain, "ns", "sa")?;
        Ok(Self {
            ca,
            settings,
            // The hop's TLS uses aws-lc: its AES-GCM took a third to a half of ring's time per
            // 16 KiB record on the project's machine (docs/performance.md, issue #11).
            provider: Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
            cache: DashMap::new(),
        })
    }

    /// The trust domain of issued and accepted identities.
    pub fn trust_domain(&self) -> &str {
        &self.settings.trust_domain
    }

    /// The settings this was built with.
    pub fn settings(&self) -> &IdentitySettings {
        &self.settings
    }

    /// The trust anchors (DER) every peer's chain must end in.
    pub fn bundle(&self) -> Vec<CertificateDer<'static>> {
        self.ca.bundle()
    }

    /// The rustls crypto provider (ring) every config built from this uses.
    pub fn provider(&self) -> &Arc<CryptoProvider> {
        &self.provider
    }

    /// The SPIFFE ID of a ServiceAccount in this trust domain.
    pub fn spiffe_id(
        &self,
        namespace: &str,
        service_account: &str,
    ) -> Result<SpiffeId, InvalidSpiffeId> {
        SpiffeId::new(&self.settings.trust_domain, namespace, service_account)
    }

    /// The mesh hop's server name for `port` of service `svc` in `ns`:
    /// `<port>.<svc>.<ns>.<mesh-domain>` (model.md §14).
    pub fn server_name(
        &self,
        port: u16,
        svc: &str,
        ns: &str,
    ) -> Result<ServerName<'static>, rustls_pki_types::InvalidDnsNameError> {
        ServerName::try_from(format!("{port}.{svc}.{ns}.{}", self.settings.mesh_domain))
    }

    /// The current certificate of `service_account` in `namespace`: the cached one while it
    /// is valid at `now`, otherwise a new one (issued and cached).
    pub fn certificate(
        &self,
        namespace: &str,
        service_account: &str,
        now: SystemTime,
    ) -> Result<Arc<WorkloadCert>, IdentityError> {
        let key = (namespace.to_owned(), service_account.to_owned());
        if let Some(cert) = self.cache.get(&key)
            && now < cert.not_after
        {
            return Ok(Arc::clone(&cert));
        }
        // The entry lock serializes concurrent first uses, so one certificate is issued.
        let mut entry = self.cache.entry(key);
        match &mut entry {
            dashmap::Entry::Occupied(o) if now < o.get().not_after => Ok(Arc::clone(o.get())),
            _ => {
                let cert = Arc::new(self.issue(namespace, service_account, now)?);
                entry.insert(Arc::clone(&cert));
                Ok(cert)
            }
        }
    }

    /// Every certificate issued and held now, by (namespace, ServiceAccount), in that order
    /// (for metrics and the debug CLI).
    pub fn certificates(&self) -> Vec<((String, String), Arc<WorkloadCert>)> {
        let mut all: Vec<_> = self
            .cache
            .iter()
            .map(|e| (e.key().clone(), Arc::clone(e.value())))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Re-issues every cached certificate whose half-life has passed at `now` and returns how
    /// many were re-issued. A certificate that fails to re-issue is kept (and logged); the
    /// next call tries again.
    pub fn rotate_due(&self, now: SystemTime) -> usize {
        let due: Vec<(String, String)> = self
            .cache
            .iter()
            .filter(|e| e.value().rotate_at() <= now)
            .map(|e| e.key().clone())
            .collect();
        let mut rotated = 0;
        for (ns, sa) in due {
            match self.issue(&ns, &sa, now) {
                Ok(cert) => {
                    self.cache.insert((ns, sa), Arc::new(cert));
                    rotated += 1;
                }
                Err(error) => {
                    tracing::warn!(namespace = %ns, service_account = %sa, %error, "workload certificate rotation failed");
                }
            }
        }
        rotated
    }

    /// Reads the peer's SPIFFE ID from its chain and checks it is of our trust domain
    /// (see [`super::peer_identity`]).
    pub fn peer_identity(&self, certs: &[CertificateDer<'_>]) -> Result<SpiffeId, IdentityError> {
        super::peer_identity(&self.settings.trust_domain, certs)
    }

    fn issue(
        &self,
        namespace: &str,
        service_account: &str,
        now: SystemTime,
    ) -> Result<WorkloadCert, IdentityError> {
        let id = self.spiffe_id(namespace, service_account)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let not_before = now - self.settings.backdate;
        let not_after = now + self.settings.validity;
        let mut params = super::ca::named_params(format!("{service_account}.{namespace}"));
        params.subject_alt_names = vec![
            SanType::URI(id.to_string().try_into()?),
            SanType::DnsName(
                format!(
                    "*.{service_account}.{namespace}.{}",
                    self.settings.mesh_domain
                )
                .try_into()?,
            ),
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // The hop is mutual: the same certificate serves and dials.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let cert = params.signed_by(&key, self.ca.issuer())?;
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let certified = CertifiedKey::from_der(vec![cert.der().clone()], private, &self.provider)?;
        Ok(WorkloadCert {
            id,
            key: Arc::new(certified),
            not_before,
            not_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identities() -> Identities {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ca = Arc::new(Ca::generate(now).unwrap());
        Identities::new(ca, IdentitySettings::default()).unwrap()
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn a_certificate_carries_the_spiffe_id_and_the_service_wildcard() {
        let ids = identities();
        let cert = ids.certificate("mp", "mp-multi", t(0)).unwrap();
        let (_, x509) = x509_parser::parse_x509_certificate(cert.leaf()).unwrap();
        let sans: Vec<String> = x509
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            sans,
            [
                "URI(spiffe://cluster.local/ns/mp/sa/mp-multi)",
                "DNSName(*.mp-multi.mp.aether.internal)"
            ]
        );
        assert_eq!(
            cert.not_after.duration_since(cert.not_before).unwrap(),
            Duration::from_secs(24 * 3600 + 300)
        );
    }

    #[test]
    fn lookups_return_the_cached_certificate_until_rotation() {
        let ids = identities();
        let a = ids.certificate("mp", "x", t(0)).unwrap();
        let b = ids.certificate("mp", "x", t(3600)).unwrap();
        assert_eq!(a.leaf(), b.leaf());
        assert_eq!(ids.rotate_due(t(3600)), 0, "not yet at half-life");
        assert_eq!(ids.rotate_due(t(13 * 3600)), 1, "past half-life");
        let c = ids.certificate("mp", "x", t(13 * 3600)).unwrap();
        assert_ne!(a.leaf(), c.leaf());
        assert_eq!(ids.rotate_due(t(13 * 3600)), 0, "the new one is fresh");
    }

    #[test]
    fn an_expired_certificate_is_reissued_on_lookup() {
        let ids = identities();
        let a = ids.certificate("mp", "x", t(0)).unwrap();
        let b = ids.certificate("mp", "x", t(25 * 3600)).unwrap();
        assert_ne!(a.leaf(), b.leaf());
        assert!(b.not_after > t(25 * 3600));
    }

    #[test]
    fn an_invalid_service_account_is_refused() {
        let ids = identities();
        let err = ids.certificate("mp", "a/b", t(0)).unwrap_err();
        assert!(matches!(err, IdentityError::InvalidSpiffeId(_)), "{err}");
    }
}
