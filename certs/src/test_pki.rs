//! A throw-away PKI for tests: authorities and certificates issued with rcgen.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority that can issue certificates.
pub(crate) struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Authority {
    /// A self-signed root.
    pub(crate) fn root(common_name: &str) -> anyhow::Result<Self> {
        Ok(Self {
            issuer: CertifiedIssuer::self_signed(ca_params(common_name), KeyPair::generate()?)?,
        })
    }

    /// An intermediate authority signed by this one.
    pub(crate) fn intermediate(&self, common_name: &str) -> anyhow::Result<Self> {
        Ok(Self {
            issuer: CertifiedIssuer::signed_by(
                ca_params(common_name),
                KeyPair::generate()?,
                &self.issuer,
            )?,
        })
    }

    /// The authority's certificate, PEM.
    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The authority's certificate, DER.
    pub(crate) fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// Issues a certificate with `params` and a fresh key.
    pub(crate) fn issue(&self, params: &CertificateParams) -> anyhow::Result<Issued> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert, key })
    }
}

fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// Parameters of a serving certificate for `hosts`.
pub(crate) fn server(hosts: &[&str]) -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(
        hosts
            .iter()
            .map(|host| (*host).to_owned())
            .collect::<Vec<_>>(),
    )?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().copied().unwrap_or("server"),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// Parameters of a client certificate for user `common_name` in groups `organizations` (at most
/// two: rcgen keeps one value per attribute type, so the second is written under a custom type
/// with the organizationName OID).
pub(crate) fn client(common_name: &str, organizations: &[&str]) -> CertificateParams {
    assert!(organizations.len() <= 2, "at most two organizations");
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let types = [
        DnType::OrganizationName,
        DnType::CustomDnType(vec![2, 5, 4, 10]),
    ];
    for (ty, organization) in types.into_iter().zip(organizations) {
        params.distinguished_name.push(ty, *organization);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// An issued certificate and its key.
pub(crate) struct Issued {
    cert: Certificate,
    key: KeyPair,
}

impl Issued {
    /// The certificate, PEM.
    pub(crate) fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The key, PEM (PKCS#8).
    pub(crate) fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// The certificate, DER.
    pub(crate) fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// The key, DER.
    pub(crate) fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivatePkcs8KeyDer::from(self.key.serialize_der()).into()
    }
}
