//! The serving certificate, from PEM files, swapped in place when the files change.
//!
//! A kubernetes.io/tls Secret mounted as a volume is updated by the kubelet with an atomic
//! symlink swap, some time after cert-manager (or `helm upgrade`) changes the Secret. The
//! files are read again every few seconds and compared with what was loaded; a new pair that
//! parses and matches is used for every handshake from then on. New connections see the new
//! certificate, open ones keep theirs, and nothing restarts.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::WebhookError;

/// The certificate and key files, and what was last loaded from them.
pub(super) struct CertFiles {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
    provider: Arc<CryptoProvider>,
    /// The bytes behind the certificate in use, to notice a change without parsing.
    loaded: (Vec<u8>, Vec<u8>),
    /// The bytes of the last pair that failed to load, to warn once per bad pair.
    rejected: Option<(Vec<u8>, Vec<u8>)>,
}

/// Hands every handshake the current certificate.
pub(super) struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolver").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A poisoned lock still holds a complete Arc: the writer only replaces it.
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(PoisonError::into_inner),
        ))
    }
}

impl Resolver {
    fn set(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
    }
}

impl CertFiles {
    /// Loads the pair; a failure here fails the start.
    pub(super) async fn load(
        cert: PathBuf,
        key: PathBuf,
        provider: Arc<CryptoProvider>,
    ) -> Result<(Self, Arc<Resolver>), WebhookError> {
        let bytes = read_pair(&cert, &key).await?;
        let certified = parse(&cert, &key, &bytes, &provider)?;
        let resolver = Arc::new(Resolver {
            current: RwLock::new(Arc::new(certified)),
        });
        let files = Self {
            cert,
            key,
            provider,
            loaded: bytes,
            rejected: None,
        };
        Ok((files, resolver))
    }

    /// Reads the files again and swaps the certificate if they changed and load. Returns
    /// whether it swapped. A pair that fails keeps the old certificate in use.
    pub(super) async fn reload(&mut self, resolver: &Resolver) -> bool {
        let bytes = match read_pair(&self.cert, &self.key).await {
            Ok(bytes) => bytes,
            Err(error) => {
                // Between the kubelet's swaps the files are always there; a missing file is
                // an operator's doing, worth a warning at every try.
                tracing::warn!(%error, "keeping the current TLS certificate");
                return false;
            }
        };
        if bytes == self.loaded || self.rejected.as_ref() == Some(&bytes) {
            return false;
        }
        match parse(&self.cert, &self.key, &bytes, &self.provider) {
            Ok(certified) => {
                resolver.set(certified);
                self.loaded = bytes;
                self.rejected = None;
                tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
                true
            }
            Err(error) => {
                // A certificate and key written one after the other (not through a Secret
                // volume) may mismatch for a moment: the next round picks up the pair.
                tracing::warn!(%error, "keeping the current TLS certificate");
                self.rejected = Some(bytes);
                false
            }
        }
    }
}

async fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), WebhookError> {
    let read = |path: &Path| {
        let path = path.to_owned();
        async move {
            tokio::fs::read(&path)
                .await
                .map_err(|error| WebhookError::Certificate {
                    path,
                    message: error.to_string(),
                })
        }
    };
    Ok((read(cert).await?, read(key).await?))
}

fn parse(
    cert: &Path,
    key: &Path,
    (cert_pem, key_pem): &(Vec<u8>, Vec<u8>),
    provider: &CryptoProvider,
) -> Result<CertifiedKey, WebhookError> {
    let error = |path: &Path, message: String| WebhookError::Certificate {
        path: path.to_owned(),
        message,
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(cert, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(error(cert, "holds no CERTIFICATE block".to_owned()));
    }
    let private_key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| error(key, format!("not a PEM private key: {e}")))?;
    CertifiedKey::from_der(chain, private_key, provider)
        .map_err(|e| error(key, format!("does not go with {}: {e}", cert.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[tokio::test]
    async fn bad_files_fail_the_start_and_never_replace_a_good_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let missing = CertFiles::load(cert.clone(), key.clone(), provider()).await;
        assert!(matches!(missing, Err(WebhookError::Certificate { .. })));

        let (a_cert, a_key) = pair("a.example");
        let (b_cert, b_key) = pair("b.example");
        std::fs::write(&cert, &a_cert).unwrap();
        std::fs::write(&key, &b_key).unwrap();
        let mismatched = CertFiles::load(cert.clone(), key.clone(), provider())
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(mismatched.contains("does not go with"), "{mismatched}");

        std::fs::write(&key, &a_key).unwrap();
        let (mut files, resolver) = CertFiles::load(cert.clone(), key.clone(), provider())
            .await
            .unwrap();
        let serving = || resolver.current.read().unwrap().cert[0].clone();
        let first = serving();
        assert!(!files.reload(&resolver).await, "unchanged files");
        std::fs::write(&cert, "garbage").unwrap();
        assert!(!files.reload(&resolver).await);
        assert_eq!(serving(), first);
        std::fs::write(&cert, &b_cert).unwrap();
        assert!(!files.reload(&resolver).await, "the key is still a's");
        std::fs::write(&key, &b_key).unwrap();
        assert!(files.reload(&resolver).await);
        assert_ne!(serving(), first);
    }
}
