//! Kubeconfig files for the test bed's users, read by kubectl, helm, kube-rs
//! and our server alike.

use std::path::Path;

use anyhow::{Context as _, Result};
use serde_json::json;

/// How a kubeconfig user proves who it is.
#[derive(Clone, Copy, Debug)]
pub enum Credentials<'a> {
    /// A client certificate and its key, as files.
    ClientCertificate {
        /// The certificate (PEM) file.
        cert: &'a Path,
        /// The private key (PEM) file.
        key: &'a Path,
    },
    /// A bearer token.
    Token(&'a str),
}

/// Writes a kubeconfig with one cluster (`server`, trusting the CA in
/// `ca_file`), one user and one current context, to `path`.
pub fn write(
    path: &Path,
    server: &str,
    ca_file: &Path,
    credentials: Credentials<'_>,
) -> Result<()> {
    let user = match credentials {
        Credentials::ClientCertificate { cert, key } => json!({
            "client-certificate": cert,
            "client-key": key,
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "testbed",
            "cluster": { "server": server, "certificate-authority": ca_file },
        }],
        "users": [{ "name": "testbed", "user": user }],
        "contexts": [{
            "name": "testbed",
            "context": { "cluster": "testbed", "user": "testbed", "namespace": "default" },
        }],
        "current-context": "testbed",
    });
    let yaml = serde_yaml::to_string(&config).context("serializing a kubeconfig")?;
    std::fs::write(path, yaml).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_rs_reads_what_is_written() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("kubeconfig");
        let ca = dir.path().join("ca.crt");
        write(
            &path,
            "https://127.0.0.1:6443",
            &ca,
            Credentials::Token("secret"),
        )?;
        let config = kube::config::Kubeconfig::read_from(&path)?;
        assert_eq!(config.current_context.as_deref(), Some("testbed"));
        let cluster = config.clusters[0].cluster.as_ref().context("cluster")?;
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        let user = config.auth_infos[0].auth_info.as_ref().context("user")?;
        assert!(user.token.is_some());
        Ok(())
    }
}
