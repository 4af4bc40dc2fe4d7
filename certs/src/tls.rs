//! The rustls server configuration.
//!
//! TLS 1.2 and 1.3 only (rustls implements nothing older), ALPN `h2` then `http/1.1`, the `ring`
//! provider, and client certificates **requested but not required**, like kube-apiserver's
//! `tls.RequestClientCert`:
//!
//! - the server asks every client for a certificate, without naming acceptable authorities
//!   (an empty `certificate_authorities` list lets a client send whatever certificate it has);
//! - a client without a certificate completes the handshake (it may still authenticate with a
//!   bearer token);
//! - a presented chain is **not** verified against any CA during the handshake: the client CA
//!   bundles can rotate at run time, so the authenticator verifies the chain per request with
//!   [`crate::client::CaBundle::verify_client_chain`] (read it from
//!   `ServerConnection::peer_certificates`);
//! - the handshake signature (`CertificateVerify`) **is** verified with the leaf's public key, so
//!   a client cannot present a certificate whose private key it does not hold.

use std::sync::Arc;

use rustls::{
    DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    crypto::{WebPkiSupportedAlgorithms, ring},
    server::{
        ResolvesServerCert,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
    version,
};
use rustls_pki_types::{CertificateDer, UnixTime};

/// Why the TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rustls refused the configuration.
    #[error("cannot build the TLS server configuration")]
    Config {
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
}

/// The result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds the server configuration serving the certificate `resolver` chooses (usually a
/// [`crate::serving::ReloadingResolver`]). See the [module documentation](self) for the policy.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig> {
    let provider = Arc::new(ring::default_provider());
    let verifier = Arc::new(RequestClientCert {
        algorithms: provider.signature_verification_algorithms,
    });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&version::TLS13, &version::TLS12])
        .map_err(|source| Error::Config { source })?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Requests a client certificate, does not require one, accepts any chain, and verifies the
/// handshake signatures with the signature algorithms of the `ring` provider.
#[derive(Debug)]
struct RequestClientCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    /// Accepts any chain: it is verified after the handshake, against the current CA bundles.
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Arc, Mutex},
    };

    use rustls::{
        ClientConfig, RootCertStore, SupportedProtocolVersion,
        client::ResolvesClientCert,
        pki_types::{PrivateKeyDer, ServerName},
        server::ServerConnection,
        sign::CertifiedKey,
    };
    use rustls_pki_types::pem::PemObject as _;
    use tokio::{
        io::{AsyncReadExt as _, AsyncWriteExt as _},
        net::{TcpListener, TcpStream},
    };
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    use super::*;
    use crate::{
        client::CaBundle,
        serving::{CertSource, ReloadingResolver},
        test_pki::{self, Authority},
    };

    const SERVICE: &str = "changelog.cattle-elemental-system.svc";
    const BOTH: &[&SupportedProtocolVersion] = &[&version::TLS13, &version::TLS12];

    /// A server using the self-signed serving certificate, as the binary does without files.
    struct Server {
        _dir: tempfile::TempDir,
        config: Arc<ServerConfig>,
        /// The CA of the serving certificate (second in the generated file).
        roots: RootCertStore,
    }

    impl Server {
        fn start() -> anyhow::Result<Self> {
            let dir = tempfile::tempdir()?;
            let files = CertSource::SelfSigned {
                dir: dir.path().to_owned(),
                hosts: vec![
                    "localhost".to_owned(),
                    "127.0.0.1".to_owned(),
                    SERVICE.to_owned(),
                ],
            }
            .prepare()?;
            let chain =
                CertificateDer::pem_file_iter(&files.cert)?.collect::<Result<Vec<_>, _>>()?;
            let mut roots = RootCertStore::empty();
            roots.add(chain[1].clone())?;
            let resolver = Arc::new(ReloadingResolver::new(files)?);
            Ok(Self {
                _dir: dir,
                config: Arc::new(server_config(resolver)?),
                roots,
            })
        }

        fn client(
            &self,
            versions: &[&'static SupportedProtocolVersion],
            certificate: Option<Arc<dyn ResolvesClientCert>>,
        ) -> anyhow::Result<Arc<ClientConfig>> {
            let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
                .with_protocol_versions(versions)?
                .with_root_certificates(self.roots.clone());
            let mut config = match certificate {
                Some(resolver) => builder.with_client_cert_resolver(resolver),
                None => builder.with_no_client_auth(),
            };
            config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        }

        /// Runs one handshake; returns the server's view and the client's ALPN (or their errors).
        async fn handshake(
            &self,
            client: Arc<ClientConfig>,
        ) -> anyhow::Result<(io::Result<Handshake>, anyhow::Result<Option<Vec<u8>>>)> {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let address = listener.local_addr()?;
            let acceptor = TlsAcceptor::from(Arc::clone(&self.config));
            let server = async {
                let (tcp, _) = listener.accept().await?;
                let tls = acceptor.accept(tcp).await?;
                Ok::<_, io::Error>(Handshake::of(tls.get_ref().1))
            };
            let client = async {
                let tcp = TcpStream::connect(address).await?;
                let tls = TlsConnector::from(client)
                    .connect(ServerName::try_from(SERVICE)?, tcp)
                    .await?;
                Ok::<_, anyhow::Error>(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
            };
            let (server, client) = tokio::join!(server, client);
            Ok((server, client))
        }
    }

    /// What the server saw of a completed handshake.
    struct Handshake {
        alpn: Option<Vec<u8>>,
        peer_certificates: Option<Vec<CertificateDer<'static>>>,
    }

    impl Handshake {
        fn of(connection: &ServerConnection) -> Self {
            Self {
                alpn: connection.alpn_protocol().map(<[u8]>::to_vec),
                peer_certificates: connection
                    .peer_certificates()
                    .map(|chain| chain.iter().map(|cert| cert.clone().into_owned()).collect()),
            }
        }
    }

    /// Presents `key` whatever the server asks for, and records the authorities it hinted.
    #[derive(Debug)]
    struct Present {
        key: Arc<CertifiedKey>,
        hints: Mutex<Option<usize>>,
    }

    impl Present {
        fn new(
            chain: Vec<CertificateDer<'static>>,
            key: &PrivateKeyDer<'_>,
        ) -> anyhow::Result<Arc<Self>> {
            Ok(Arc::new(Self {
                key: Arc::new(CertifiedKey::new(
                    chain,
                    ring::sign::any_supported_type(key)?,
                )),
                hints: Mutex::new(None),
            }))
        }

        fn hinted(&self) -> Option<usize> {
            self.hints.lock().map_or(None, |hints| *hints)
        }
    }

    impl ResolvesClientCert for Present {
        fn resolve(
            &self,
            root_hint_subjects: &[&[u8]],
            _sigschemes: &[SignatureScheme],
        ) -> Option<Arc<CertifiedKey>> {
            if let Ok(mut hints) = self.hints.lock() {
                *hints = Some(root_hint_subjects.len());
            }
            Some(Arc::clone(&self.key))
        }

        fn has_certs(&self) -> bool {
            true
        }
    }

    #[tokio::test]
    async fn clients_without_a_certificate_connect_with_h2() -> anyhow::Result<()> {
        let server = Server::start()?;
        for version in BOTH {
            let (handshake, client_alpn) =
                server.handshake(server.client(&[version], None)?).await?;
            let handshake = handshake?;
            assert_eq!(handshake.alpn.as_deref(), Some(&b"h2"[..]));
            assert_eq!(client_alpn?.as_deref(), Some(&b"h2"[..]));
            assert!(handshake.peer_certificates.is_none());
        }
        Ok(())
    }

    #[tokio::test]
    async fn http1_only_clients_get_http1() -> anyhow::Result<()> {
        let server = Server::start()?;
        let mut client = Arc::unwrap_or_clone(server.client(BOTH, None)?);
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        let (handshake, _) = server.handshake(Arc::new(client)).await?;
        assert_eq!(handshake?.alpn.as_deref(), Some(&b"http/1.1"[..]));
        Ok(())
    }

    #[tokio::test]
    async fn client_certificates_are_requested_without_hints_and_passed_on() -> anyhow::Result<()> {
        let server = Server::start()?;
        // An authority the server knows nothing about: the handshake does not judge the chain.
        let root = Authority::root("front-proxy-ca")?;
        let intermediate = root.intermediate("front-proxy-intermediate")?;
        let proxy = intermediate.issue(&test_pki::client("front-proxy-client", &[]))?;
        let chain = vec![proxy.der(), intermediate.der()];
        for version in BOTH {
            let present = Present::new(chain.clone(), &proxy.key_der())?;
            let client = server.client(&[version], Some(Arc::clone(&present) as _))?;
            let (handshake, _) = server.handshake(client).await?;
            let handshake = handshake?;
            assert_eq!(
                present.hinted(),
                Some(0),
                "no certificate_authorities hinted"
            );
            assert_eq!(handshake.alpn.as_deref(), Some(&b"h2"[..]));
            let presented = handshake
                .peer_certificates
                .ok_or_else(|| anyhow::anyhow!("no peer certificates"))?;
            assert_eq!(presented, chain);

            let verified = CaBundle::from_pem(root.pem().as_bytes())?
                .verify_client_chain(&presented, UnixTime::now())?;
            assert_eq!(verified.common_name, "front-proxy-client");
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_client_that_does_not_hold_the_key_is_refused() -> anyhow::Result<()> {
        let server = Server::start()?;
        let ca = Authority::root("client-ca")?;
        let victim = ca.issue(&test_pki::client("system:admin", &["system:masters"]))?;
        let attacker = ca.issue(&test_pki::client("nobody", &[]))?;
        for version in BOTH {
            let present = Present::new(vec![victim.der()], &attacker.key_der())?;
            let client = server.client(&[version], Some(present as _))?;
            let (handshake, _) = server.handshake(client).await?;
            let err = handshake
                .err()
                .ok_or_else(|| anyhow::anyhow!("handshake succeeded"))?;
            let rustls_err = err
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>());
            assert!(
                matches!(
                    rustls_err,
                    Some(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::BadSignature
                    ))
                ),
                "{version:?}: {err:?}"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn tls_1_1_is_refused() -> anyhow::Result<()> {
        let server = Server::start()?;
        const SIGNATURE_ALGORITHMS: &[u8] =
            &[0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x08, 0x04];
        const VERSIONS_1_1_1_0: &[u8] = &[0x00, 0x2b, 0x00, 0x05, 0x04, 0x03, 0x02, 0x03, 0x01];
        // (extensions, expected alert): a TLS 1.1 client without TLS 1.2 extensions, one with
        // signature_algorithms (so only the version is wrong), one listing supported_versions.
        let cases: [(&[u8], u8); 3] = [
            (&[], 40),
            (SIGNATURE_ALGORITHMS, 70),
            (&[SIGNATURE_ALGORITHMS, VERSIONS_1_1_1_0].concat(), 70),
        ];
        for (extensions, alert) in cases {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let address = listener.local_addr()?;
            let acceptor = TlsAcceptor::from(Arc::clone(&server.config));
            let accepted = async {
                let (tcp, _) = listener.accept().await?;
                acceptor.accept(tcp).await.map(drop)
            };
            let client = async {
                let mut tcp = TcpStream::connect(address).await?;
                tcp.write_all(&tls_1_1_client_hello(extensions)).await?;
                let mut response = Vec::new();
                tcp.read_to_end(&mut response).await?;
                Ok::<_, io::Error>(response)
            };
            let (accepted, response) = tokio::join!(accepted, client);
            assert!(accepted.is_err(), "a TLS 1.1 handshake completed");
            let response = response?;
            // A single fatal (2) alert record: handshake_failure (40) or protocol_version (70).
            assert_eq!(response.first(), Some(&0x15), "{response:02x?}");
            assert_eq!(response.get(5..7), Some(&[2, alert][..]), "{response:02x?}");
        }
        Ok(())
    }

    /// A ClientHello with client_version TLS 1.1 and `extensions` (encoded, without their length).
    fn tls_1_1_client_hello(extensions: &[u8]) -> Vec<u8> {
        fn length(bytes: &[u8]) -> [u8; 2] {
            u16::try_from(bytes.len()).unwrap_or(u16::MAX).to_be_bytes()
        }
        let mut body = vec![0x03, 0x02]; // client_version TLS 1.1
        body.extend_from_slice(&[0x42; 32]); // random
        body.push(0); // empty session id
        body.extend_from_slice(&[0x00, 0x04, 0xc0, 0x13, 0x00, 0x2f]); // two CBC suites
        body.extend_from_slice(&[0x01, 0x00]); // null compression
        if !extensions.is_empty() {
            body.extend_from_slice(&length(extensions));
            body.extend_from_slice(extensions);
        }
        let mut handshake = vec![0x01, 0x00];
        handshake.extend_from_slice(&length(&body));
        handshake.extend_from_slice(&body);
        let mut record = vec![0x16, 0x03, 0x01];
        record.extend_from_slice(&length(&handshake));
        record.extend_from_slice(&handshake);
        record
    }
}
