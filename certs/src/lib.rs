//! TLS material for elemental-changelog.
//!
//! - [`serving`]: the serving certificate, from files (hot-reloaded: directory watch plus a periodic
//!   poll) or generated self-signed into a directory, published through a
//!   [`rustls::server::ResolvesServerCert`].
//! - [`tls`]: the [`rustls::ServerConfig`]: TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`, client
//!   certificates requested but not required.
//! - [`client`]: verification of a presented client certificate chain against a CA bundle that
//!   may change at run time, as the authenticator needs it.
//!
//! All cryptography uses the `ring` provider.

pub mod client;
pub mod serving;
pub mod tls;

#[cfg(test)]
mod test_pki;

use x509_parser::{certificate::X509Certificate, error::X509Error, nom, prelude::FromDer};

/// Parses a DER certificate with x509-parser, ignoring trailing bytes.
fn parse_x509(der: &[u8]) -> Result<X509Certificate<'_>, X509Error> {
    match X509Certificate::from_der(der) {
        Ok((_, cert)) => Ok(cert),
        Err(nom::Err::Error(err) | nom::Err::Failure(err)) => Err(err),
        Err(nom::Err::Incomplete(_)) => Err(X509Error::InvalidCertificate),
    }
}
