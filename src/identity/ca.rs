//! The mesh's certificate authority: a key and its self-signed certificate, which signs every
//! workload certificate and is the whole trust bundle.
//!
//! IO: reads and writes the two PEM files. A CA is either given (`load`: a key of any kind and
//! PEM form [`super::ca_key`] reads, as cert-manager or openssl write it) or kept by the daemon in
//! a directory (`load_or_create`, used by the demo and the file registry: ECDSA P-256, PKCS#8).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::IdentityError;
use super::ca_key::{CaKey, KeyForm};

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
    issuer: Issuer<'static, CaKey>,
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
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        // A key rcgen just made always loads; a failure is reported, never unwrapped.
        let key = CaKey::from_der(KeyForm::Pkcs8, &der)
            .map_err(|_| IdentityError::Generate(rcgen::Error::CouldNotParseKeyPair))?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert: cert.der().clone(),
            cert_pem,
            key_pem,
        })
    }

    /// Loads a CA from a PEM certificate and a PEM private key: PKCS#8, PKCS#1 or SEC1; ECDSA
    /// P-256 or P-384, RSA or Ed25519 ([`super::ca_key`]). The key must be the certificate's.
    /// Any other key is refused with the file and the form named ([`IdentityError::CaKey`]).
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
    pub(super) fn issuer(&self) -> &Issuer<'static, CaKey> {
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
        let key = CaKey::from_pem(key_pem).map_err(|problem| IdentityError::CaKey {
            path: key_path.to_path_buf(),
            problem,
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

    /// A file of `tests/fixtures/ca-keys` (made by its `gen.sh`).
    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/ca-keys")
            .join(name)
    }

    #[test]
    fn a_ca_key_in_each_pem_form_and_kind_loads_and_signs_in_its_own_algorithm() {
        use rcgen::{PKCS_ECDSA_P384_SHA384, PKCS_ED25519, PKCS_RSA_SHA256};
        for (name, form, algorithm) in [
            ("p256-pkcs8", KeyForm::Pkcs8, &PKCS_ECDSA_P256_SHA256),
            ("p256-sec1", KeyForm::Sec1, &PKCS_ECDSA_P256_SHA256),
            ("p384-pkcs8", KeyForm::Pkcs8, &PKCS_ECDSA_P384_SHA384),
            ("p384-sec1", KeyForm::Sec1, &PKCS_ECDSA_P384_SHA384),
            ("rsa-pkcs8", KeyForm::Pkcs8, &PKCS_RSA_SHA256),
            ("rsa-pkcs1", KeyForm::Pkcs1, &PKCS_RSA_SHA256),
            ("ed25519-pkcs8", KeyForm::Pkcs8, &PKCS_ED25519),
        ] {
            let ca = Ca::load(
                &fixture(&format!("{name}.crt.pem")),
                &fixture(&format!("{name}.key.pem")),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(ca.issuer().key().form(), form, "{name}");
            assert_eq!(ca.issuer().key().signature_algorithm(), algorithm, "{name}");
        }
    }

    #[test]
    fn the_pkcs8_and_the_sec1_or_pkcs1_file_of_one_key_match_the_same_certificate() {
        for (cert, key) in [
            ("p256-pkcs8", "p256-sec1"),
            ("p384-sec1", "p384-pkcs8"),
            ("rsa-pkcs8", "rsa-pkcs1"),
        ] {
            let a = Ca::load(
                &fixture(&format!("{cert}.crt.pem")),
                &fixture(&format!("{key}.key.pem")),
            )
            .unwrap_or_else(|e| panic!("{cert} with {key}: {e}"));
            assert_eq!(a.bundle().len(), 1);
        }
        // Another key of the same form is still refused.
        let err = Ca::load(
            &fixture("p256-pkcs8.crt.pem"),
            &fixture("p384-sec1.key.pem"),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "ca file {} holds no usable pem private key matching the certificate",
                fixture("p384-sec1.key.pem").display()
            )
        );
    }

    #[test]
    fn a_key_the_ca_cannot_sign_with_is_refused_naming_the_file_and_the_form() {
        let cert = fixture("p256-pkcs8.crt.pem");
        for (key, want) in [
            (
                "encrypted-pkcs8.key.pem",
                "holds an encrypted private key (ENCRYPTED PRIVATE KEY): give the key unencrypted",
            ),
            (
                "encrypted-pkcs1.key.pem",
                "holds an encrypted private key (RSA PRIVATE KEY with Proc-Type: 4,ENCRYPTED)",
            ),
            (
                "public.key.pem",
                "holds a public key (PUBLIC KEY), not the CA's private key",
            ),
            (
                "p521-sec1.key.pem",
                "holds a SEC1 (BEGIN EC PRIVATE KEY) key of the elliptic curve secp521r1 (1.3.132.0.35): the CA signs with ECDSA P-256 or P-384, RSA of 2048 bits or more, or Ed25519",
            ),
            (
                "p521-pkcs8.key.pem",
                "holds a PKCS#8 (BEGIN PRIVATE KEY) key of the elliptic curve secp521r1 (1.3.132.0.35)",
            ),
            (
                "secp256k1-sec1.key.pem",
                "holds a SEC1 (BEGIN EC PRIVATE KEY) key of the elliptic curve 1.3.132.0.10",
            ),
            (
                "rsa1024-pkcs1.key.pem",
                "holds a PKCS#1 (BEGIN RSA PRIVATE KEY) key that cannot sign (",
            ),
            (
                "two-keys.key.pem",
                "holds 2 private keys: give the CA's key alone",
            ),
            (
                "p256-pkcs8.crt.pem",
                "holds no private key, only: CERTIFICATE",
            ),
        ] {
            let path = fixture(key);
            let err = Ca::load(&cert, &path).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, IdentityError::CaKey { .. }), "{key}: {text}");
            let file = format!("ca key file {} ", path.display());
            assert!(
                text.starts_with(&file) && text[file.len()..].starts_with(want),
                "{key}: {text}"
            );
        }
    }

    #[test]
    fn a_key_file_that_is_not_pem_is_refused_as_such() {
        let dir = temp_dir("notpem");
        fs::create_dir_all(&dir).unwrap();
        let cert = fixture("p256-pkcs8.crt.pem");
        for (name, text, want) in [
            ("empty.pem", "", "holds no PEM block"),
            (
                "cut.pem",
                "-----BEGIN PRIVATE KEY-----\nMIGHAgEA\n",
                "is not readable PEM: a BEGIN line without its matching END line",
            ),
            (
                "base64.pem",
                "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n",
                "is not readable PEM: ",
            ),
        ] {
            let path = dir.join(name);
            fs::write(&path, text).unwrap();
            let text = Ca::load(&cert, &path).unwrap_err().to_string();
            assert!(
                text.starts_with(&format!("ca key file {} {want}", path.display())),
                "{name}: {text}"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_reports_a_missing_file() {
        let dir = temp_dir("missing");
        let err = Ca::load(&dir.join("ca.pem"), &dir.join("ca-key.pem")).unwrap_err();
        assert!(matches!(err, IdentityError::Io { .. }), "{err}");
    }
}
