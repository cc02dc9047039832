//! The mesh CA's signing key, read from PEM in each form CA tools write: PKCS#8 (`BEGIN PRIVATE
//! KEY`: openssl's default, Helm's `genPrivateKey`), PKCS#1 (`BEGIN RSA PRIVATE KEY`) and SEC1
//! (`BEGIN EC PRIVATE KEY`: cert-manager's ECDSA keys, `openssl ec`). ECDSA P-256 and P-384, RSA
//! (2048 bits or more) and Ed25519 sign. Anything else is refused with the form named
//! ([`InvalidCaKey`]): an encrypted key, a public key, another curve or algorithm, several keys.
//!
//! Part of the identity edge, but it does no IO itself: it reads text it is given. rustls' ring
//! provider loads the key (the same code that loads every TLS key, for all three forms) and signs
//! through its `Signer`; [`CaKey`] lends that to rcgen as a [`rcgen::SigningKey`], so workload
//! certificates are signed with whatever key the CA has, in that key's own signature algorithm,
//! which the mesh hop's verifiers (the same ring provider) accept.

use std::fmt;

use rcgen::{
    PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_ED25519, PKCS_RSA_SHA256,
    SignatureAlgorithm,
};
use rustls::SignatureScheme;
use rustls::sign::Signer;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs1KeyDer, PrivatePkcs8KeyDer, PrivateSec1KeyDer};
use x509_parser::asn1_rs::{Any, Class, FromDer, Oid, Tag};
use x509_parser::oid_registry::{self, OidRegistry};
use x509_parser::x509::SubjectPublicKeyInfo;

/// The PEM form a private key came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyForm {
    /// PKCS#8, `BEGIN PRIVATE KEY`: any algorithm.
    Pkcs8,
    /// PKCS#1, `BEGIN RSA PRIVATE KEY`: RSA only.
    Pkcs1,
    /// SEC1, `BEGIN EC PRIVATE KEY`: an elliptic-curve key.
    Sec1,
}

impl fmt::Display for KeyForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pkcs8 => "PKCS#8 (BEGIN PRIVATE KEY)",
            Self::Pkcs1 => "PKCS#1 (BEGIN RSA PRIVATE KEY)",
            Self::Sec1 => "SEC1 (BEGIN EC PRIVATE KEY)",
        })
    }
}

/// What the CA signs with, for the ends of the errors below.
const CAN_SIGN: &str =
    "the CA signs with ECDSA P-256 or P-384, RSA of 2048 bits or more, or Ed25519";

/// Why a CA key file's text is no key the CA can sign with. The text reads after "ca key file
/// `<path>`" ([`super::IdentityError::CaKey`]).
#[derive(Debug, thiserror::Error)]
pub enum InvalidCaKey {
    /// The text is not PEM (a block without its end line, bad base64).
    #[error("is not readable PEM: {reason}")]
    NotPem {
        /// What the PEM reader found wrong.
        reason: String,
    },
    /// No PEM block at all (an empty file, DER).
    #[error("holds no PEM block")]
    Empty,
    /// An encrypted key: PKCS#8 `ENCRYPTED PRIVATE KEY`, or openssl's traditional encryption of a
    /// PKCS#1 or SEC1 key (a `Proc-Type: 4,ENCRYPTED` header).
    #[error(
        "holds an encrypted private key ({label}): give the key unencrypted, for example from `openssl pkey -in <key> -out <plain key>`"
    )]
    Encrypted {
        /// The PEM label.
        label: String,
    },
    /// A public key where the private key belongs.
    #[error("holds a public key ({label}), not the CA's private key")]
    PublicKey {
        /// The PEM label.
        label: String,
    },
    /// PEM blocks, none of them a private key (a certificate, parameters).
    #[error("holds no private key, only: {labels}")]
    NoKey {
        /// The labels found, comma-separated.
        labels: String,
    },
    /// More than one private key: which one is the CA's is not guessed.
    #[error("holds {count} private keys: give the CA's key alone")]
    SeveralKeys {
        /// How many.
        count: usize,
    },
    /// A key of an algorithm or curve the CA cannot sign with.
    #[error("holds a {form} key of {algorithm}: {CAN_SIGN}")]
    Unsupported {
        /// Its form.
        form: KeyForm,
        /// What it is (algorithm and curve, with their OIDs).
        algorithm: String,
    },
    /// A key of a supported kind that still cannot sign (malformed, an RSA key under 2048 bits,
    /// an EC key without its public key).
    #[error("holds a {form} key that cannot sign ({reason}): {CAN_SIGN}")]
    Unusable {
        /// Its form.
        form: KeyForm,
        /// What the key loader said.
        reason: String,
    },
}

/// The signature algorithm each key kind signs certificates with: rustls' scheme (to choose
/// its signer) and rcgen's algorithm (what the certificate names).
const SCHEMES: [(SignatureScheme, &SignatureAlgorithm); 4] = [
    (
        SignatureScheme::ECDSA_NISTP256_SHA256,
        &PKCS_ECDSA_P256_SHA256,
    ),
    (
        SignatureScheme::ECDSA_NISTP384_SHA384,
        &PKCS_ECDSA_P384_SHA384,
    ),
    (SignatureScheme::ED25519, &PKCS_ED25519),
    (SignatureScheme::RSA_PKCS1_SHA256, &PKCS_RSA_SHA256),
];

/// The CA's private key, ready to sign certificates through rcgen.
///
/// Use: [`CaKey::from_pem`] on the key file's text, compare [`CaKey::public_key_raw`] with the
/// CA certificate's, then hand it to [`rcgen::Issuer`].
#[derive(Debug)]
pub struct CaKey {
    signer: Box<dyn Signer>,
    /// The raw public key (the SubjectPublicKeyInfo's bit string), as rcgen wants it.
    public_key: Vec<u8>,
    algorithm: &'static SignatureAlgorithm,
    form: KeyForm,
}

impl CaKey {
    /// The one private key in `text`, in any accepted form.
    pub fn from_pem(text: &str) -> Result<Self, InvalidCaKey> {
        let (form, der) = private_key_block(text)?;
        let der = match form {
            KeyForm::Pkcs8 => PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der)),
            KeyForm::Pkcs1 => PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(der)),
            KeyForm::Sec1 => PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(der)),
        };
        Self::from_der(form, &der)
    }

    /// The key `der`, which came in `form`.
    pub(super) fn from_der(form: KeyForm, der: &PrivateKeyDer<'_>) -> Result<Self, InvalidCaKey> {
        let refused = |reason: String| match unsupported_algorithm(form, der.secret_der()) {
            Some(algorithm) => InvalidCaKey::Unsupported { form, algorithm },
            None => InvalidCaKey::Unusable { form, reason },
        };
        let key = rustls::crypto::ring::sign::any_supported_type(der)
            .map_err(|e| refused(e.to_string()))?;
        let (signer, algorithm) = SCHEMES
            .iter()
            .find_map(|&(scheme, alg)| key.choose_scheme(&[scheme]).map(|s| (s, alg)))
            .ok_or_else(|| refused(format!("no signer for a {:?} key", key.algorithm())))?;
        let spki = key
            .public_key()
            .ok_or_else(|| refused("its public key cannot be derived".to_owned()))?;
        let (_, spki) = SubjectPublicKeyInfo::from_der(&spki)
            .map_err(|e| refused(format!("its public key does not parse: {e}")))?;
        Ok(Self {
            signer,
            public_key: spki.subject_public_key.data.to_vec(),
            algorithm,
            form,
        })
    }

    /// The raw public key: compare it with the CA certificate's subject public key.
    pub fn public_key_raw(&self) -> &[u8] {
        &self.public_key
    }

    /// The form the key came in.
    pub fn form(&self) -> KeyForm {
        self.form
    }

    /// The algorithm the certificates it signs name.
    pub fn signature_algorithm(&self) -> &'static SignatureAlgorithm {
        self.algorithm
    }
}

impl rcgen::PublicKeyData for CaKey {
    fn der_bytes(&self) -> &[u8] {
        &self.public_key
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.algorithm
    }
}

impl rcgen::SigningKey for CaKey {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        self.signer.sign(msg).map_err(|error| {
            tracing::warn!(%error, "the ca key failed to sign");
            rcgen::Error::RemoteKeyError
        })
    }
}

/// The one private-key block of `text`, with its form, or why there is none to use.
fn private_key_block(text: &str) -> Result<(KeyForm, Vec<u8>), InvalidCaKey> {
    let blocks = pem::parse_many(text).map_err(|e| InvalidCaKey::NotPem {
        reason: e.to_string(),
    })?;
    // The reader skips a block it cannot take whole; say so rather than "no block".
    if blocks.is_empty() && text.contains("-----BEGIN ") {
        return Err(InvalidCaKey::NotPem {
            reason: "a BEGIN line without its matching END line".to_owned(),
        });
    }
    let mut keys = Vec::new();
    let mut others = Vec::new();
    for block in blocks {
        let form = match block.tag() {
            "PRIVATE KEY" => KeyForm::Pkcs8,
            "RSA PRIVATE KEY" => KeyForm::Pkcs1,
            "EC PRIVATE KEY" => KeyForm::Sec1,
            // openssl writes the curve's parameters before a SEC1 key (`ecparam -genkey`).
            "EC PARAMETERS" => continue,
            "ENCRYPTED PRIVATE KEY" => {
                return Err(InvalidCaKey::Encrypted {
                    label: block.tag().to_owned(),
                });
            }
            other => {
                others.push(other.to_owned());
                continue;
            }
        };
        if block
            .headers()
            .get("Proc-Type")
            .is_some_and(|v| v.contains("ENCRYPTED"))
        {
            return Err(InvalidCaKey::Encrypted {
                label: format!("{} with Proc-Type: 4,ENCRYPTED", block.tag()),
            });
        }
        keys.push((form, block.into_contents()));
    }
    match keys.len() {
        1 => Ok(keys.remove(0)),
        0 => Err(match others.iter().find(|l| l.contains("PUBLIC KEY")) {
            Some(label) => InvalidCaKey::PublicKey {
                label: label.clone(),
            },
            None if others.is_empty() => InvalidCaKey::Empty,
            None => InvalidCaKey::NoKey {
                labels: others.join(", "),
            },
        }),
        count => Err(InvalidCaKey::SeveralKeys { count }),
    }
}

/// What a key that failed to load is, when it is of an algorithm or curve the CA cannot sign
/// with (`None` when it names a supported one, or nothing readable: the loader's reason says
/// more then).
fn unsupported_algorithm(form: KeyForm, der: &[u8]) -> Option<String> {
    let rsa = oid_registry::OID_PKCS1_RSAENCRYPTION;
    let ec = oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY;
    let ed25519 = oid_registry::OID_SIG_ED25519;
    let top = items(Any::from_der(der).ok()?.1.data);
    match form {
        KeyForm::Pkcs1 => None,
        // ECPrivateKey ::= SEQUENCE { version, privateKey, [0] parameters, [1] publicKey }
        KeyForm::Sec1 => {
            let params = top
                .iter()
                .find(|a| a.class() == Class::ContextSpecific && a.tag() == Tag(0))?;
            let curve = Oid::from_der(params.data).ok()?.1;
            unsupported_curve(&curve)
        }
        // PrivateKeyInfo ::= SEQUENCE { version, AlgorithmIdentifier { algorithm, parameters }, privateKey }
        KeyForm::Pkcs8 => {
            let algorithm = items(top.get(1)?.data);
            let oid = algorithm.first()?.as_oid().ok()?;
            if oid == rsa || oid == ed25519 {
                None
            } else if oid == ec {
                unsupported_curve(&algorithm.get(1)?.as_oid().ok()?)
            } else {
                Some(oid_registry::format_oid(&oid, &registry()))
            }
        }
    }
}

/// The description of an elliptic curve the CA cannot sign with; `None` for P-256 and P-384.
fn unsupported_curve(curve: &Oid<'_>) -> Option<String> {
    let supported = [oid_registry::OID_EC_P256, oid_registry::OID_NIST_EC_P384];
    (!supported.contains(curve)).then(|| {
        format!(
            "the elliptic curve {}",
            oid_registry::format_oid(curve, &registry())
        )
    })
}

/// The OIDs named in errors: the crypto and X.509 ones.
fn registry() -> OidRegistry<'static> {
    OidRegistry::default().with_crypto().with_x509()
}

/// The DER items one after the other in `content` (a SEQUENCE's), up to the first that does not
/// parse.
fn items(mut content: &[u8]) -> Vec<Any<'_>> {
    let mut out = Vec::new();
    while let Ok((rest, item)) = Any::from_der(content) {
        out.push(item);
        if rest.is_empty() {
            break;
        }
        content = rest;
    }
    out
}
