//! Client certificate verification, for the authenticator.
//!
//! The TLS layer ([`crate::tls`]) accepts any client certificate whose key the client proves to
//! hold; whether it identifies anyone is decided here, after the handshake, against CA bundles
//! that can change at run time (`client-ca-file` and `requestheader-client-ca-file` from
//! `kube-system/extension-apiserver-authentication`). This mirrors kube-apiserver's x509
//! authenticator: the first certificate is the leaf, the others are untrusted intermediates, the
//! leaf must allow client authentication, and the user is the subject's common name with its
//! organizations as groups.

use std::fmt;

use rustls_pki_types::{
    CertificateDer, TrustAnchor, UnixTime,
    pem::{self, PemObject},
};
use x509_parser::{asn1_rs::Tag, error::X509Error, x509::AttributeTypeAndValue};

/// Why a CA bundle cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bundle is not valid PEM.
    #[error("invalid PEM in the CA bundle")]
    Pem {
        /// What is wrong with the PEM.
        #[source]
        source: pem::Error,
    },
    /// The bundle holds no `CERTIFICATE` block.
    #[error("no certificate in the CA bundle")]
    NoCertificate,
    /// A certificate of the bundle cannot be parsed.
    #[error("certificate #{index} of the CA bundle is invalid")]
    Authority {
        /// Its position in the bundle, from 0.
        index: usize,
        /// Why webpki refused it.
        #[source]
        source: webpki::Error,
    },
}

/// Why a client certificate chain does not authenticate anyone. Each variant is a distinct reason
/// worth logging as such.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The client presented no certificate.
    #[error("no client certificate presented")]
    NoCertificate,
    /// The leaf certificate cannot be parsed.
    #[error("the client certificate cannot be parsed")]
    Parse {
        /// Why webpki refused it.
        #[source]
        source: webpki::Error,
    },
    /// The chain does not lead to a certificate of the bundle (no issuer of that name, or one whose
    /// key did not make the signature).
    #[error("the client certificate is not signed by a trusted authority")]
    UnknownAuthority,
    /// A certificate of the chain has expired.
    #[error(
        "a certificate of the client chain expired {} seconds ago",
        now.as_secs().saturating_sub(not_after.as_secs())
    )]
    Expired {
        /// When it expired.
        not_after: UnixTime,
        /// The verification time.
        now: UnixTime,
    },
    /// A certificate of the chain is not valid yet.
    #[error(
        "a certificate of the client chain becomes valid in {} seconds",
        not_before.as_secs().saturating_sub(now.as_secs())
    )]
    NotYetValid {
        /// When it becomes valid.
        not_before: UnixTime,
        /// The verification time.
        now: UnixTime,
    },
    /// The leaf's extended key usage does not include client authentication.
    #[error("the client certificate is not meant for client authentication")]
    WrongUsage {
        /// What webpki found.
        #[source]
        source: webpki::Error,
    },
    /// The chain is invalid for another reason (bad signature, name constraints, ...).
    #[error("the client certificate chain is invalid")]
    Invalid {
        /// Why webpki refused it.
        #[source]
        source: webpki::Error,
    },
    /// The leaf's subject holds a name that cannot be decoded.
    #[error("the client certificate subject cannot be decoded")]
    Subject {
        /// What is wrong with it.
        #[source]
        source: X509Error,
    },
}

impl From<webpki::Error> for VerifyError {
    fn from(source: webpki::Error) -> Self {
        #[expect(
            deprecated,
            reason = "older webpki paths still produce RequiredEkuNotFound"
        )]
        match source {
            // A bad signature means the issuer found by name is not the one that signed: Go
            // reports it as an unknown authority too.
            webpki::Error::UnknownIssuer | webpki::Error::InvalidSignatureForPublicKey => {
                Self::UnknownAuthority
            }
            webpki::Error::CertExpired { time, not_after } => Self::Expired {
                not_after,
                now: time,
            },
            webpki::Error::CertNotValidYet { time, not_before } => Self::NotYetValid {
                not_before,
                now: time,
            },
            webpki::Error::RequiredEkuNotFound | webpki::Error::RequiredEkuNotFoundContext(_) => {
                Self::WrongUsage { source }
            }
            source => Self::Invalid { source },
        }
    }
}

/// The identity a verified client certificate carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedClient {
    /// The leaf subject's common name (the last one when there are several, as Go reads it);
    /// empty when there is none, which kube-apiserver treats as "not authenticated".
    pub common_name: String,
    /// The leaf subject's organizations, in order.
    pub organizations: Vec<String>,
}

/// Trusted certificate authorities for client certificates, parsed from a PEM bundle.
#[derive(Clone)]
pub struct CaBundle {
    anchors: Vec<TrustAnchor<'static>>,
}

impl fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaBundle")
            .field("authorities", &self.anchors.len())
            .finish()
    }
}

impl CaBundle {
    /// Parses every `CERTIFICATE` block of `pem` (other blocks are ignored). Fails when there is
    /// none or one cannot be parsed.
    pub fn from_pem(pem: &[u8]) -> Result<Self, Error> {
        let anchors = CertificateDer::pem_slice_iter(pem)
            .enumerate()
            .map(|(index, cert)| {
                let cert = cert.map_err(|source| Error::Pem { source })?;
                webpki::anchor_from_trusted_cert(&cert)
                    .map(|anchor| anchor.to_owned())
                    .map_err(|source| Error::Authority { index, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if anchors.is_empty() {
            return Err(Error::NoCertificate);
        }
        Ok(Self { anchors })
    }

    /// Verifies `chain` (leaf first, then intermediates in any order, as presented in the TLS
    /// handshake) at `now`: it must lead to an authority of this bundle through valid signatures,
    /// every certificate must be valid at `now`, and the leaf's extended key usage, when present,
    /// must include clientAuth. Revocation is not checked (kube-apiserver does not either).
    pub fn verify_client_chain(
        &self,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<VerifiedClient, VerifyError> {
        let (leaf, intermediates) = chain.split_first().ok_or(VerifyError::NoCertificate)?;
        let end_entity = webpki::EndEntityCert::try_from(leaf)
            .map_err(|source| VerifyError::Parse { source })?;
        end_entity.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &self.anchors,
            intermediates,
            now,
            webpki::KeyUsage::client_auth(),
            None,
            None,
        )?;
        identity(leaf).map_err(|source| VerifyError::Subject { source })
    }
}

/// Reads the identity from the leaf's subject.
fn identity(leaf: &CertificateDer<'_>) -> Result<VerifiedClient, X509Error> {
    let cert = crate::parse_x509(leaf)?;
    let subject = cert.subject();
    let mut common_name = None;
    for attribute in subject.iter_common_name() {
        if let Some(name) = attribute_string(attribute)? {
            common_name = Some(name);
        }
    }
    let mut organizations = Vec::new();
    for attribute in subject.iter_organization() {
        organizations.extend(attribute_string(attribute)?);
    }
    Ok(VerifiedClient {
        common_name: common_name.unwrap_or_default(),
        organizations,
    })
}

/// Decodes a name attribute as Go's `crypto/x509` does: the string types it knows are decoded
/// (an invalid encoding is an error), any other type is skipped.
fn attribute_string(attribute: &AttributeTypeAndValue<'_>) -> Result<Option<String>, X509Error> {
    let value = attribute.attr_value();
    match value.tag() {
        Tag::PrintableString
        | Tag::Utf8String
        | Tag::Ia5String
        | Tag::NumericString
        | Tag::TeletexString => std::str::from_utf8(value.data)
            .map(|text| Some(text.to_owned()))
            .map_err(|_| X509Error::InvalidAttributes),
        Tag::BmpString => {
            let (units, rest) = value.data.as_chunks::<2>();
            if !rest.is_empty() {
                return Err(X509Error::InvalidAttributes);
            }
            char::decode_utf16(units.iter().map(|unit| u16::from_be_bytes(*unit)))
                .collect::<Result<String, _>>()
                .map(Some)
                .map_err(|_| X509Error::InvalidAttributes)
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;
    use rcgen::{DnType, DnValue, ExtendedKeyUsagePurpose, date_time_ymd};

    use super::*;
    use crate::test_pki::{self, Authority};

    fn now() -> UnixTime {
        UnixTime::now()
    }

    fn bundle(authorities: &[&Authority]) -> anyhow::Result<CaBundle> {
        let pem: String = authorities
            .iter()
            .map(|authority| authority.pem())
            .collect();
        Ok(CaBundle::from_pem(pem.as_bytes())?)
    }

    #[test]
    fn accepts_a_client_certificate_signed_by_a_bundled_authority() -> anyhow::Result<()> {
        let other = Authority::root("other")?;
        let ca = Authority::root("client-ca")?;
        let alice = ca.issue(&test_pki::client("alice", &["system:masters", "dev"]))?;
        let verified = bundle(&[&other, &ca])?.verify_client_chain(&[alice.der()], now())?;
        assert_eq!(
            verified,
            VerifiedClient {
                common_name: "alice".to_owned(),
                organizations: vec!["system:masters".to_owned(), "dev".to_owned()],
            }
        );
        Ok(())
    }

    #[test]
    fn accepts_a_chain_through_an_intermediate() -> anyhow::Result<()> {
        let root = Authority::root("root")?;
        let intermediate = root.intermediate("intermediate")?;
        let bob = intermediate.issue(&test_pki::client("bob", &[]))?;
        let bundle = bundle(&[&root])?;

        let verified = bundle.verify_client_chain(&[bob.der(), intermediate.der()], now())?;
        assert_eq!(verified.common_name, "bob");
        assert!(verified.organizations.is_empty());

        let err = bundle.verify_client_chain(&[bob.der()], now()).err();
        assert!(
            matches!(err, Some(VerifyError::UnknownAuthority)),
            "{err:?}"
        );
        Ok(())
    }

    #[test]
    fn a_certificate_without_extended_key_usage_is_accepted() -> anyhow::Result<()> {
        let ca = Authority::root("client-ca")?;
        let mut params = test_pki::client("carol", &[]);
        params.extended_key_usages.clear();
        let carol = ca.issue(&params)?;
        assert_eq!(
            bundle(&[&ca])?
                .verify_client_chain(&[carol.der()], now())?
                .common_name,
            "carol"
        );
        Ok(())
    }

    #[test]
    fn rejects_another_authority() -> anyhow::Result<()> {
        let ca = Authority::root("client-ca")?;
        for other in [Authority::root("other-ca")?, Authority::root("client-ca")?] {
            let mallory = other.issue(&test_pki::client("mallory", &["system:masters"]))?;
            let err = bundle(&[&ca])?
                .verify_client_chain(&[mallory.der()], now())
                .err();
            assert!(
                matches!(err, Some(VerifyError::UnknownAuthority)),
                "{err:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn rejects_a_server_only_certificate() -> anyhow::Result<()> {
        let ca = Authority::root("ca")?;
        let server = ca.issue(&test_pki::server(&["localhost"])?)?;
        let err = bundle(&[&ca])?
            .verify_client_chain(&[server.der()], now())
            .err();
        assert!(
            matches!(err, Some(VerifyError::WrongUsage { .. })),
            "{err:?}"
        );

        let mut params = test_pki::client("dave", &[]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        let dave = ca.issue(&params)?;
        let err = bundle(&[&ca])?
            .verify_client_chain(&[dave.der()], now())
            .err();
        assert!(
            matches!(err, Some(VerifyError::WrongUsage { .. })),
            "{err:?}"
        );
        Ok(())
    }

    #[test]
    fn rejects_expired_and_not_yet_valid_certificates() -> anyhow::Result<()> {
        let ca = Authority::root("ca")?;
        let bundle = bundle(&[&ca])?;
        let mut params = test_pki::client("erin", &[]);
        params.not_before = date_time_ymd(2000, 1, 1);
        params.not_after = date_time_ymd(2001, 1, 1);
        let expired = ca.issue(&params)?;
        let err = bundle.verify_client_chain(&[expired.der()], now()).err();
        assert!(matches!(err, Some(VerifyError::Expired { .. })), "{err:?}");
        if let Some(err) = err {
            assert!(
                err.to_string()
                    .starts_with("a certificate of the client chain expired ")
            );
        }

        let err = bundle
            .verify_client_chain(
                &[expired.der()],
                UnixTime::since_unix_epoch(Duration::from_secs(900_000_000)),
            )
            .err();
        assert!(
            matches!(err, Some(VerifyError::NotYetValid { .. })),
            "{err:?}"
        );

        let valid = ca.issue(&test_pki::client("frank", &[]))?;
        let far_future = UnixTime::since_unix_epoch(Duration::from_secs(200_000_000_000));
        let err = bundle.verify_client_chain(&[valid.der()], far_future).err();
        assert!(matches!(err, Some(VerifyError::Expired { .. })), "{err:?}");
        Ok(())
    }

    #[test]
    fn rejects_no_certificate_and_garbage() -> anyhow::Result<()> {
        let ca = Authority::root("ca")?;
        let bundle = bundle(&[&ca])?;
        let err = bundle.verify_client_chain(&[], now()).err();
        assert!(matches!(err, Some(VerifyError::NoCertificate)), "{err:?}");
        let garbage = CertificateDer::from(vec![0x30, 0x03, 0x01, 0x01, 0xff]);
        let err = bundle.verify_client_chain(&[garbage], now()).err();
        assert!(matches!(err, Some(VerifyError::Parse { .. })), "{err:?}");
        Ok(())
    }

    #[test]
    fn reads_names_as_go_does() -> anyhow::Result<()> {
        let ca = Authority::root("ca")?;
        let mut params = test_pki::client("ignored", &[]);
        params.distinguished_name.push(
            DnType::CommonName,
            DnValue::BmpString("ünïcode".try_into()?),
        );
        let unicode = ca.issue(&params)?;
        let verified = bundle(&[&ca])?.verify_client_chain(&[unicode.der()], now())?;
        assert_eq!(verified.common_name, "ünïcode");

        params.distinguished_name.remove(DnType::CommonName);
        let nameless = ca.issue(&params)?;
        let verified = bundle(&[&ca])?.verify_client_chain(&[nameless.der()], now())?;
        assert_eq!(verified.common_name, "");
        Ok(())
    }

    #[test]
    fn bundle_errors() -> anyhow::Result<()> {
        let ca = Authority::root("ca")?;
        assert!(matches!(CaBundle::from_pem(b""), Err(Error::NoCertificate)));
        let key_only = test_pki::server(&["x"])
            .map(|params| ca.issue(&params))??
            .key_pem();
        assert!(matches!(
            CaBundle::from_pem(key_only.as_bytes()),
            Err(Error::NoCertificate)
        ));
        let truncated = &ca.pem()[..40];
        assert!(matches!(
            CaBundle::from_pem(truncated.as_bytes()),
            Err(Error::Pem { .. })
        ));
        let bad_der = "-----BEGIN CERTIFICATE-----\nMAMBAf8=\n-----END CERTIFICATE-----\n";
        let pem = format!("{}{bad_der}", ca.pem());
        assert!(matches!(
            CaBundle::from_pem(pem.as_bytes()),
            Err(Error::Authority { index: 1, .. })
        ));
        let two = bundle(&[&ca, &Authority::root("ca2")?])?;
        assert_eq!(format!("{two:?}"), "CaBundle { authorities: 2 }");
        Ok(())
    }

    proptest! {
        #[test]
        fn bundle_parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = CaBundle::from_pem(&bytes);
            let mut pem = b"-----BEGIN CERTIFICATE-----\n".to_vec();
            pem.extend_from_slice(&bytes);
            pem.extend_from_slice(b"\n-----END CERTIFICATE-----\n");
            let _ = CaBundle::from_pem(&pem);
        }

        #[test]
        fn chain_verification_never_panics(
            leaf in proptest::collection::vec(any::<u8>(), 0..512),
            intermediate in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let bundle = CaBundle { anchors: Vec::new() };
            let chain = [CertificateDer::from(leaf), CertificateDer::from(intermediate)];
            prop_assert!(bundle.verify_client_chain(&chain, UnixTime::now()).is_err());
        }
    }
}
