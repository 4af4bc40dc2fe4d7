//! The self-signed fallback: a throw-away CA and a serving certificate signed by it, kept in
//! `--cert-dir` and reused across restarts while still fit.

use std::{
    error::Error as StdError,
    fs,
    io::{self, Write as _},
    net::IpAddr,
    path::Path,
    time::{Duration, SystemTime},
};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;
use tracing::{debug, info, warn};
use x509_parser::extensions::GeneralName;

use super::{CertKeyFiles, Error, Loaded, Result, SELF_SIGNED_CERT_FILE, SELF_SIGNED_KEY_FILE};

/// How long generated certificates are valid, as in k8s.io/client-go's `GenerateSelfSignedCertKey`.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// How far before generation they become valid, to tolerate clock skew.
const BACKDATE: Duration = Duration::from_secs(60 * 60);

/// Returns the pair in `dir`, generating it first unless an existing one is fit for `hosts` at `now`.
pub(super) fn ensure(dir: &Path, hosts: &[String], now: SystemTime) -> Result<CertKeyFiles> {
    let files = CertKeyFiles {
        cert: dir.join(SELF_SIGNED_CERT_FILE),
        key: dir.join(SELF_SIGNED_KEY_FILE),
    };
    match super::load(&files) {
        Ok(existing) if is_fit(&existing, hosts, now) => {
            info!(cert = %files.cert.display(), "reusing the self-signed serving certificate");
            return Ok(files);
        }
        Ok(_) => info!(
            cert = %files.cert.display(),
            ?hosts,
            "the self-signed serving certificate has expired or does not cover every host; replacing it"
        ),
        Err(Error::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            debug!(dir = %dir.display(), "no self-signed serving certificate yet");
        }
        Err(err) => warn!(
            error = &err as &dyn StdError,
            "the self-signed serving certificate cannot be reused; replacing it"
        ),
    }

    let generated = generate(hosts, now).map_err(|source| Error::Generate { source })?;
    fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_owned(),
        source,
    })?;
    write_replacing(&files.cert, generated.cert_pem.as_bytes(), 0o644)?;
    write_replacing(&files.key, generated.key_pem.as_bytes(), 0o600)?;
    info!(cert = %files.cert.display(), ?hosts, "generated a self-signed serving certificate");
    Ok(files)
}

/// Whether `existing` is valid at `now` and names every host.
fn is_fit(existing: &Loaded, hosts: &[String], now: SystemTime) -> bool {
    if now < existing.not_before || now > existing.not_after {
        return false;
    }
    let Some(leaf) = existing.key.cert.first() else {
        return false;
    };
    let Ok(cert) = crate::parse_x509(leaf) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    let names = &san.value.general_names;
    hosts.iter().all(|host| match host.parse::<IpAddr>() {
        Ok(ip) => names.iter().any(|name| match name {
            GeneralName::IPAddress(bytes) => ip_from_san(bytes) == Some(ip),
            _ => false,
        }),
        Err(_) => names.iter().any(|name| match name {
            GeneralName::DNSName(dns) => dns.eq_ignore_ascii_case(host),
            _ => false,
        }),
    })
}

fn ip_from_san(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

struct Generated {
    /// The serving certificate followed by the CA certificate.
    cert_pem: String,
    key_pem: String,
}

/// A fresh CA (CN `<host>-ca@<unix time>`) and a serving certificate (CN `<host>@<unix time>`,
/// SANs `hosts`, serverAuth) signed by it, like client-go's `GenerateSelfSignedCertKeyWithFixtures`.
fn generate(hosts: &[String], now: SystemTime) -> Result<Generated, rcgen::Error> {
    let first = hosts.first().map_or("localhost", String::as_str);
    let now = OffsetDateTime::from(now);
    let not_before = now - BACKDATE;
    let not_after = now + VALIDITY;
    let stamp = now.unix_timestamp();

    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{first}-ca@{stamp}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;

    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{first}@{stamp}"));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &ca)?;

    Ok(Generated {
        cert_pem: format!("{}{}", cert.pem(), ca.pem()),
        key_pem: key.serialize_pem(),
    })
}

/// Writes `contents` to `path` through a temporary file renamed over it, so a reader never sees a
/// partial file. `mode` applies on Unix.
fn write_replacing(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = Path::new(&temporary);
    let write = || -> io::Result<()> {
        match fs::remove_file(temporary) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
            _ => {}
        }
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        let mut file = options.open(temporary)?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(temporary, path)
    };
    write().map_err(|source| Error::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::{CertSource, load};

    fn hosts() -> Vec<String> {
        [
            "localhost",
            "127.0.0.1",
            "::1",
            "changelog.cattle-elemental-system.svc",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn generates_a_pair_for_every_host_and_reuses_it() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let cert_dir = dir.path().join("certs");
        let source = CertSource::SelfSigned {
            dir: cert_dir.clone(),
            hosts: hosts(),
        };
        let files = source.prepare()?;
        assert_eq!(files.cert, cert_dir.join("apiserver.crt"));
        assert_eq!(files.key, cert_dir.join("apiserver.key"));
        let loaded = load(&files)?;
        assert_eq!(
            loaded.key.cert.len(),
            2,
            "serving certificate followed by its CA"
        );
        assert!(is_fit(&loaded, &hosts(), SystemTime::now()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            assert_eq!(
                fs::metadata(&files.key)?.permissions().mode() & 0o777,
                0o600
            );
        }

        let again = source.prepare()?;
        assert_eq!(again, files);
        assert_eq!(
            load(&again)?.key.cert,
            loaded.key.cert,
            "reused, not regenerated"
        );
        Ok(())
    }

    #[test]
    fn serving_certificate_chains_to_the_generated_ca() -> anyhow::Result<()> {
        let generated = generate(&hosts(), SystemTime::now())?;
        use rustls_pki_types::pem::PemObject as _;
        let chain = rustls_pki_types::CertificateDer::pem_slice_iter(generated.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()?;
        let [leaf, ca] = chain.as_slice() else {
            anyhow::bail!("expected two certificates, got {}", chain.len());
        };
        let anchor = webpki::anchor_from_trusted_cert(ca)?;
        let leaf = webpki::EndEntityCert::try_from(leaf)?;
        leaf.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &[anchor],
            &[],
            rustls_pki_types::UnixTime::now(),
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )?;
        for host in hosts() {
            let name = rustls_pki_types::ServerName::try_from(host.as_str())?;
            leaf.verify_is_valid_for_subject_name(&name)?;
        }
        Ok(())
    }

    #[test]
    fn regenerates_when_hosts_change_or_expired() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let now = SystemTime::now();
        let files = ensure(dir.path(), &hosts(), now)?;
        let first = load(&files)?;

        assert!(!is_fit(&first, &["other.example.svc".to_owned()], now));
        assert!(!is_fit(&first, &["10.0.0.1".to_owned()], now));
        assert!(is_fit(&first, &["LOCALHOST".to_owned()], now));
        assert!(!is_fit(&first, &hosts(), now + VALIDITY + BACKDATE));

        let more = [hosts(), vec!["changelog.other.svc".to_owned()]].concat();
        let files = ensure(dir.path(), &more, now)?;
        let second = load(&files)?;
        assert_ne!(second.key.cert, first.key.cert);
        assert!(is_fit(&second, &more, now));

        let later = now + VALIDITY + BACKDATE;
        let third = load(&ensure(dir.path(), &more, later)?)?;
        assert_ne!(third.key.cert, second.key.cert);
        Ok(())
    }

    #[test]
    fn replaces_an_unusable_pair() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        fs::write(dir.path().join(SELF_SIGNED_CERT_FILE), "garbage")?;
        fs::write(dir.path().join(SELF_SIGNED_KEY_FILE), "garbage")?;
        let files = ensure(dir.path(), &hosts(), SystemTime::now())?;
        assert!(is_fit(&load(&files)?, &hosts(), SystemTime::now()));
        Ok(())
    }

    #[test]
    fn invalid_host_is_a_generate_error() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let err = ensure(
            dir.path(),
            &["bücher.example".to_owned()],
            SystemTime::now(),
        )
        .err()
        .ok_or_else(|| anyhow::anyhow!("expected an error"))?;
        assert!(matches!(err, Error::Generate { .. }), "{err:?}");
        Ok(())
    }
}
