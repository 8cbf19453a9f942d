//! TLS settings shared by the network plugins, so every listener and every
//! client reads certificates the same way and says the same thing when a
//! file is wrong. rustls with the `ring` provider: no system OpenSSL, so
//! static builds keep working.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
pub use tokio_rustls;
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

/// `tls:` of a listening stage.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// PEM certificate chain (server certificate first).
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// `tls:` of a connecting stage.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// PEM CA certificates to trust instead of the built-in Mozilla roots
    /// (for a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Name to verify the server's certificate against (default: the host
    /// of the address).
    #[serde(default)]
    pub server_name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{} holds no certificate", .0.display())]
    NoCertificate(PathBuf),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("`{0}` is not a valid server name")]
    ServerName(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

impl ServerTls {
    /// Paths resolved against `base` (the pipeline file's directory).
    pub fn acceptor(&self, base: &Path) -> Result<TlsAcceptor, TlsError> {
        self.acceptor_with_alpn(base, &[])
    }

    /// The same, offering `protocols` by ALPN (most preferred first): a
    /// gRPC server offers `h2`, which gRPC clients require.
    pub fn acceptor_with_alpn(
        &self,
        base: &Path,
        protocols: &[&[u8]],
    ) -> Result<TlsAcceptor, TlsError> {
        let cert_file = base.join(&self.cert_file);
        let key_file = base.join(&self.key_file);
        let chain = certs(&cert_file)?;
        let key = PrivateKeyDer::from_pem_file(&key_file).map_err(|source| TlsError::Read {
            path: key_file.clone(),
            source,
        })?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ClientTls {
    /// The client configuration (paths resolved against `base`).
    pub fn config(&self, base: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        self.config_with_alpn(base, &[])
    }

    /// The same, asking for `protocols` by ALPN (`h2` for gRPC).
    pub fn config_with_alpn(
        &self,
        base: &Path,
        protocols: &[&[u8]],
    ) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_file {
            Some(ca) => {
                for cert in certs(&base.join(ca))? {
                    roots.add(cert)?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    pub fn connector(&self, base: &Path) -> Result<TlsConnector, TlsError> {
        Ok(TlsConnector::from(self.config(base)?))
    }

    /// The name to verify: `server_name`, or the host part of `address`.
    pub fn server_name(&self, address: &str) -> Result<ServerName<'static>, TlsError> {
        let host = match &self.server_name {
            Some(n) => n.clone(),
            None => address
                .rsplit_once(':')
                .map_or(address, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        };
        ServerName::try_from(host.clone()).map_err(|_| TlsError::ServerName(host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_load_from_pem_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.path().join("c.pem"), cert.cert.pem()).unwrap();
        std::fs::write(dir.path().join("k.pem"), cert.key_pair.serialize_pem()).unwrap();
        let server = ServerTls {
            cert_file: "c.pem".into(),
            key_file: "k.pem".into(),
        };
        assert!(server.acceptor(dir.path()).is_ok());
        let client = ClientTls {
            ca_file: Some("c.pem".into()),
            server_name: None,
        };
        assert!(client.connector(dir.path()).is_ok());
        assert!(client.server_name("localhost:6514").is_ok());
        let bad = ServerTls {
            cert_file: "missing.pem".into(),
            key_file: "k.pem".into(),
        };
        let err = bad.acceptor(dir.path()).err().unwrap().to_string();
        assert!(err.contains("missing.pem"), "{err}");
        std::fs::write(dir.path().join("empty.pem"), "").unwrap();
        let err = ClientTls {
            ca_file: Some("empty.pem".into()),
            server_name: None,
        }
        .config(dir.path())
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("no certificate"), "{err}");
    }
}
