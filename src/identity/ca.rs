//! The mesh's certificate authority: an ECDSA P-256 key and its self-signed certificate,
//! which signs every workload certificate and is the whole trust bundle.
//!
//! IO: reads and writes the two PEM files. A CA is either given (`load`) or kept by the
//! daemon in a directory (`load_or_create`, used by the demo and the file registry).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::IdentityError;

/// The file name of the CA certificate in a [`Ca::load_or_create`] directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The file name of the CA private key (mode 0600) in a [`Ca::load_or_create`] directory.
pub const CA_KEY_FILE: &str = "ca-key.pem";

/// How long a CA that [`Ca::load_or_create`] creates is valid: ten years.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How far a new CA's `notBefore` lies in the past, for clocks that lag a little.
const CA_BACKDATE: Duration = Duration::from_secs(3600);

/// A signing CA: the key that signs workload certificates and the certificate peers trust.
///
/// Use: `Ca::load` or `Ca::load_or_create` at start-up, then hand it to
/// [`super::Identities::new`]; [`Ca::bundle`] is the trust anchor set of every verifier.
#[derive(Debug)]
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    cert_pem: String,
    key_pem: String,
}

impl Ca {
    /// A new CA with a fresh key, valid for ten years from an hour before `now`. Nothing is
    /// written; see [`Ca::load_or_create`] for a CA that persists.
    pub fn generate(now: SystemTime) -> Result<Self, IdentityError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = named_params("aether mesh ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = (now - CA_BACKDATE).into();
        params.not_after = (now + CA_VALIDITY).into();
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let key_pem = key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert: cert.der().clone(),
            cert_pem,
            key_pem,
        })
    }

    /// Loads a CA from a PEM certificate and a PEM private key (PKCS#8, ECDSA P-256 or any
    /// key rcgen can sign with). The key must be the certificate's.
    pub fn load(cert_pem_path: &Path, key_pem_path: &Path) -> Result<Self, IdentityError> {
        let cert_pem = read(cert_pem_path)?;
        let key_pem = read(key_pem_path)?;
        Self::from_pem(&cert_pem, &key_pem, cert_pem_path, key_pem_path)
    }

    /// The CA kept in `dir`: loads `ca.pem` and `ca-key.pem` when `ca.pem` exists, otherwise
    /// creates the directory and a new CA there (the key file with mode 0600). A later call
    /// returns the same CA.
    ///
    /// The key is renamed into place before the certificate, so an existing `ca.pem` always
    /// has its key beside it; a stray key without a certificate is replaced.
    pub fn load_or_create(dir: &Path) -> Result<Self, IdentityError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        if cert_path.exists() {
            return Self::load(&cert_path, &key_path);
        }
        fs::create_dir_all(dir).map_err(|source| IdentityError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let ca = Self::generate(crate::time::wall())?;
        write_then_rename(&key_path, &ca.key_pem, 0o600)?;
        write_then_rename(&cert_path, &ca.cert_pem, 0o644)?;
        Ok(ca)
    }

    /// The trust anchors (DER): the CA certificate.
    pub fn bundle(&self) -> Vec<CertificateDer<'static>> {
        vec![self.cert.clone()]
    }

    /// The CA certificate in PEM, for distribution to peers and tools.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The signer of workload certificates.
    pub(super) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    fn from_pem(
        cert_pem: &str,
        key_pem: &str,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<Self, IdentityError> {
        let no_cert = || IdentityError::Pem {
            path: cert_path.to_path_buf(),
            what: "certificate",
        };
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|_| no_cert())?;
        let key = KeyPair::from_pem(key_pem).map_err(|_| IdentityError::Pem {
            path: key_path.to_path_buf(),
            what: "private key",
        })?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert).map_err(|_| no_cert())?;
        if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(IdentityError::Pem {
                path: key_path.to_path_buf(),
                what: "private key matching the certificate",
            });
        }
        let issuer = Issuer::from_ca_cert_der(&cert, key)?;
        Ok(Self {
            issuer,
            cert,
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
        })
    }
}

fn read(path: &Path) -> Result<String, IdentityError> {
    fs::read_to_string(path).map_err(|source| IdentityError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `text` to `<path>.tmp` with `mode`, then renames it onto `path`.
fn write_then_rename(path: &Path, text: &str, mode: u32) -> Result<(), IdentityError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| IdentityError::Io { path: p, source }
    };
    // A stale temporary file may carry another mode; start afresh so `mode` applies.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&tmp)(e)),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    file.write_all(text.as_bytes()).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

/// Certificate parameters whose subject is organization `aether` and the given common name.
pub(crate) fn named_params(common_name: impl Into<String>) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "aether");
    params
        .distinguished_name
        .push(DnType::CommonName, common_name.into());
    params
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "aether-identity-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn load_or_create_twice_in_one_dir_returns_the_same_ca() {
        let dir = temp_dir("ca");
        let first = Ca::load_or_create(&dir).unwrap();
        let second = Ca::load_or_create(&dir).unwrap();
        assert_eq!(first.bundle(), second.bundle());
        let mode = fs::metadata(dir.join(CA_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the key file is private");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_refuses_a_key_that_is_not_the_certificates() {
        let dir = temp_dir("mismatch");
        let a = Ca::load_or_create(&dir.join("a")).unwrap();
        let b = Ca::load_or_create(&dir.join("b")).unwrap();
        assert_ne!(a.bundle(), b.bundle());
        let err = Ca::load(
            &dir.join("a").join(CA_CERT_FILE),
            &dir.join("b").join(CA_KEY_FILE),
        )
        .unwrap_err();
        assert!(matches!(err, IdentityError::Pem { .. }), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_reports_a_missing_file() {
        let dir = temp_dir("missing");
        let err = Ca::load(&dir.join("ca.pem"), &dir.join("ca-key.pem")).unwrap_err();
        assert!(matches!(err, IdentityError::Io { .. }), "{err}");
    }
}
