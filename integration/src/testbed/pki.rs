//! Certificate authorities and certificates of one test bed, made with rcgen.
//!
//! Every run gets its own CAs, so nothing a test trusts outlives the run and
//! tests can mint extra certificates (a front-proxy certificate with a CN that
//! is not allowed, a client of a rogue CA) with the same code.

use std::net::IpAddr;

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its private key, both PEM-encoded.
#[derive(Clone, Debug)]
pub struct CertPair {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// The PKCS#8 private key (PEM).
    pub key_pem: String,
}

impl CertPair {
    /// The certificate followed by the key: the bundle `reqwest::Identity::from_pem` reads.
    pub fn identity_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }
}

/// A self-signed certificate authority that issues leaf certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// Creates a new CA whose subject CN is `common_name`.
    pub fn new(common_name: &str) -> Result<Self> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().context("generating a CA key")?;
        let issuer = CertifiedIssuer::self_signed(params, key)
            .with_context(|| format!("self-signing CA {common_name}"))?;
        Ok(Self { issuer })
    }

    /// The CA certificate (PEM), for trust bundles and `caBundle`.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// Issues a serving certificate (serverAuth) for DNS names and IP addresses in `sans`.
    pub fn issue_server(&self, common_name: &str, sans: &[&str]) -> Result<CertPair> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, &[]);
        params.subject_alt_names = sans.iter().map(|san| san_of(san)).collect::<Result<_>>()?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// Issues a client certificate (clientAuth) for user `common_name` in `groups`
    /// (the subject's O attributes, as Kubernetes reads them).
    pub fn issue_client(&self, common_name: &str, groups: &[&str]) -> Result<CertPair> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, mut params: CertificateParams) -> Result<CertPair> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().context("generating a leaf key")?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("signing a leaf certificate")?;
        Ok(CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A key pair that signs and verifies ServiceAccount tokens.
#[derive(Debug)]
pub struct SigningKey {
    /// The private key (PKCS#8 PEM) for `--service-account-signing-key-file`.
    pub private_pem: String,
    /// The public key (PEM) for `--service-account-key-file`.
    pub public_pem: String,
}

impl SigningKey {
    /// Generates an ECDSA P-256 key pair (ES256 tokens).
    pub fn generate() -> Result<Self> {
        let key = KeyPair::generate().context("generating the ServiceAccount signing key")?;
        Ok(Self {
            private_pem: key.serialize_pem(),
            public_pem: key.public_key_pem(),
        })
    }
}

fn name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    for org in organizations {
        dn.push(DnType::OrganizationName, *org);
    }
    dn
}

fn san_of(san: &str) -> Result<SanType> {
    Ok(match san.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(
            san.try_into()
                .with_context(|| format!("{san:?} is not a DNS name"))?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_leaf_certificates_that_parse() -> Result<()> {
        let ca = Ca::new("test-ca")?;
        let server = ca.issue_server("server", &["localhost", "127.0.0.1", "a.b.svc"])?;
        let client = ca.issue_client("admin", &["system:masters"])?;
        assert!(server.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(client.key_pem.contains("PRIVATE KEY"));
        assert!(client.identity_pem().contains("CERTIFICATE"));
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        Ok(())
    }

    #[test]
    fn rejects_an_invalid_dns_name() {
        assert!(san_of("caf\u{e9}.example").is_err());
        assert!(matches!(san_of("::1"), Ok(SanType::IpAddress(_))));
    }
}
