//! Mutual TLS for the agent's gRPC port (rustls through tonic), with a CA the operator provides.
//!
//! With `--tls-cert/--tls-key/--tls-ca`, the agent presents its certificate and requires every
//! client to present one signed by the CA: a coordinator without such a certificate cannot
//! complete the handshake, so it never reaches a handler (the token check comes on top, for
//! deployments that want both). Certificates made by `lockstep certs` carry extended key
//! usages, so an agent's certificate (serverAuth) cannot be used as a coordinator's (clientAuth).

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// The three PEM files of one side of a mutual-TLS connection.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    /// This side's certificate (chain), PEM.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA that signs the other side's certificates, PEM.
    pub ca: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {path}: {source}")]
    Read {
        flag: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{flag} {path}: no PEM block \"{want}\" in it (expected a PEM file, e.g. from `lockstep certs`)"
    )]
    NotPem {
        flag: &'static str,
        path: String,
        want: &'static str,
    },
    #[error("--tls-cert, --tls-key and --tls-ca go together: {0} missing")]
    Incomplete(&'static str),
}

impl TlsFiles {
    /// All three or none: half a TLS configuration is refused rather than guessed at.
    pub fn from_flags(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, TlsError> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { cert, key, ca })),
            (c, k, _) => Err(TlsError::Incomplete(if c.is_none() {
                "--tls-cert"
            } else if k.is_none() {
                "--tls-key"
            } else {
                "--tls-ca"
            })),
        }
    }

    /// Reads and checks the three files: (certificate, key, CA) PEM bytes.
    pub fn read(&self) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>), TlsError> {
        let cert = read_pem(&self.cert, "--tls-cert", "CERTIFICATE")?;
        let key = read_pem(&self.key, "--tls-key", "PRIVATE KEY")?;
        let ca = read_pem(&self.ca, "--tls-ca", "CERTIFICATE")?;
        Ok((cert, key, ca))
    }

    /// The agent's server side: its identity, and client certificates required from the CA.
    pub fn server_config(&self) -> Result<ServerTlsConfig, TlsError> {
        let (cert, key, ca) = self.read()?;
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(false))
    }
}

fn read_pem(path: &Path, flag: &'static str, want: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.display().to_string(),
        source,
    })?;
    // "PRIVATE KEY" also matches "RSA PRIVATE KEY" and "EC PRIVATE KEY".
    if !String::from_utf8_lossy(&bytes).contains(&format!("{want}-----")) {
        return Err(TlsError::NotPem {
            flag,
            path: path.display().to_string(),
            want,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_three_files_or_none() {
        assert_eq!(TlsFiles::from_flags(None, None, None).unwrap(), None);
        let p = |s: &str| Some(PathBuf::from(s));
        assert!(
            TlsFiles::from_flags(p("c"), p("k"), p("a"))
                .unwrap()
                .is_some()
        );
        let e = TlsFiles::from_flags(p("c"), None, p("a"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tls-key missing"), "{e}");
    }

    #[test]
    fn a_file_that_is_not_pem_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.pem");
        std::fs::write(&f, "hello").unwrap();
        let e = read_pem(&f, "--tls-ca", "CERTIFICATE")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--tls-ca ") && e.contains("no PEM block"),
            "{e}"
        );
    }
}
