//! Certificates and kubeconfigs of a test cluster: one CA, serving certificates for the API
//! server and each kubelet, client certificates for every component, the service-account key
//! pair. ECDSA P-256 keys made in process (no `openssl`), valid for the life of the cluster.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Why the certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A key or certificate could not be generated.
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be written.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub(crate) struct CertFiles {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// The cluster's certificate authority, which signs everything else.
pub(crate) struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    dir: PathBuf,
}

/// What a certificate is for.
pub(crate) enum Usage<'a> {
    /// A TLS server (and client) certificate for these names and addresses.
    Serving(&'a [&'a str]),
    /// A client certificate.
    Client,
}

impl Authority {
    /// Makes a new CA and writes `ca.crt` and `ca.key` into `dir`.
    pub(crate) fn create(dir: &Path) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "dra-sdk-e2e-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let authority = Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            dir: dir.to_owned(),
        };
        write(&authority.ca_cert(), authority.cert_pem.as_bytes())?;
        write(
            &dir.join("ca.key"),
            authority.issuer.key().serialize_pem().as_bytes(),
        )?;
        Ok(authority)
    }

    /// Path of the CA certificate.
    pub(crate) fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Path of the CA key (the controller manager signs CSRs with it).
    pub(crate) fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// Issues a certificate for `common_name` in `organization` and writes `<file>.crt` and
    /// `<file>.key`.
    pub(crate) fn issue(
        &self,
        file: &str,
        common_name: &str,
        organization: Option<&str>,
        usage: Usage<'_>,
    ) -> Result<CertFiles, PkiError> {
        let key = KeyPair::generate()?;
        let (names, usages) = match usage {
            Usage::Serving(names) => (
                names.iter().map(|name| (*name).to_owned()).collect(),
                vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            ),
            Usage::Client => (Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth]),
        };
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(organization) = organization {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        write(&files.cert, cert.pem().as_bytes())?;
        write(&files.key, key.serialize_pem().as_bytes())?;
        Ok(files)
    }

    /// Makes the service-account signing key pair: `sa.key` (private) and `sa.pub` (public).
    pub(crate) fn service_account_keys(&self) -> Result<CertFiles, PkiError> {
        let key = KeyPair::generate()?;
        let files = CertFiles {
            cert: self.dir.join("sa.pub"),
            key: self.dir.join("sa.key"),
        };
        write(&files.cert, key.public_key_pem().as_bytes())?;
        write(&files.key, key.serialize_pem().as_bytes())?;
        Ok(files)
    }

    /// Writes a kubeconfig for `server` that authenticates with `client`'s certificate.
    pub(crate) fn kubeconfig(
        &self,
        path: &Path,
        server: &str,
        user: &str,
        client: &CertFiles,
    ) -> Result<(), PkiError> {
        let b64 = |path: &Path| -> Result<String, PkiError> {
            let bytes = std::fs::read(path).map_err(|source| PkiError::Write {
                path: path.to_owned(),
                source,
            })?;
            Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
        };
        let ca = base64::engine::general_purpose::STANDARD.encode(self.cert_pem.as_bytes());
        let (cert, key) = (b64(&client.cert)?, b64(&client.key)?);
        let text = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: e2e
  context: {{cluster: e2e, user: {user}, namespace: default}}
current-context: e2e
"
        );
        write(path, text.as_bytes())
    }
}

/// Writes a file only its owner can read: keys and kubeconfigs hold credentials.
fn write(path: &Path, contents: &[u8]) -> Result<(), PkiError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(contents));
    result.map_err(|source| PkiError::Write {
        path: path.to_owned(),
        source,
    })
}
