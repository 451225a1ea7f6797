//! Admission webhooks under test: a CA and serving certificate made in process, an HTTPS
//! client that trusts only that CA, and AdmissionReviews in the shape the API server sends.
//!
//! ```no_run
//! use dra_sdk_testing::admission::{WebhookClient, WebhookPki, review};
//! use serde_json::json;
//!
//! # async fn run() {
//! let dir = tempfile::tempdir().unwrap();
//! let pki = WebhookPki::create(dir.path());
//! // ... start the webhook with pki.cert_file and pki.key_file, listening on `addr` ...
//! # let addr: std::net::SocketAddr = "127.0.0.1:8443".parse().unwrap();
//! let client = WebhookClient::new(addr, pki.ca_pem());
//! let claim = json!({
//!     "apiVersion": "resource.k8s.io/v1",
//!     "kind": "ResourceClaim",
//!     "metadata": { "name": "c", "namespace": "default" },
//!     "spec": { "devices": { "requests": [] } },
//! });
//! let answer = client.review(&review("CREATE", &claim, None)).await;
//! assert_eq!(answer["response"]["allowed"], true);
//! # }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

/// The names the serving certificate is valid for: what a test client dials.
const SERVING_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A CA and a serving certificate for `localhost`, written as `tls.crt` and `tls.key` into a
/// directory, as a kubernetes.io/tls Secret volume holds them.
pub struct WebhookPki {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    /// The serving certificate (PEM, leaf first).
    pub cert_file: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key_file: PathBuf,
}

impl WebhookPki {
    /// Makes the CA and a first serving certificate in `dir`.
    pub fn create(dir: &Path) -> WebhookPki {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, "dra-sdk-webhook-test-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        let pki = WebhookPki {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
        };
        pki.rotate();
        pki
    }

    /// The CA certificate, PEM: a webhook configuration's `caBundle`, decoded.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Issues a new serving certificate with a new key and replaces the files (each by a
    /// rename, so a reader never sees half a file). Returns the new leaf certificate, DER, to
    /// compare with what a server hands out.
    pub fn rotate(&self) -> Vec<u8> {
        let key = KeyPair::generate().expect("serving key");
        let mut params =
            CertificateParams::new(SERVING_NAMES.map(str::to_owned).to_vec()).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "dra-webhook");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("serving certificate");
        replace(&self.key_file, key.serialize_pem().as_bytes());
        replace(&self.cert_file, cert.pem().as_bytes());
        cert.der().to_vec()
    }
}

fn replace(path: &Path, contents: &[u8]) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, contents).unwrap_or_else(|e| panic!("{}: {e}", staged.display()));
    std::fs::rename(&staged, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// What one HTTPS request got.
#[derive(Debug)]
pub struct HttpsResponse {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
    /// The leaf certificate the server presented, DER.
    pub server_cert: Vec<u8>,
}

/// An HTTPS client for a webhook on `addr`, trusting only the test CA and checking the
/// certificate for `localhost`, as the API server checks a webhook's against its `caBundle`.
/// One connection per request, so every request sees the certificate served at that time.
pub struct WebhookClient {
    addr: SocketAddr,
    connector: tokio_rustls::TlsConnector,
}

impl WebhookClient {
    /// A client for the webhook on `addr` whose certificate `ca_pem` signed.
    pub fn new(addr: SocketAddr, ca_pem: &str) -> WebhookClient {
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.expect("CA PEM")).expect("CA certificate");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        // A full handshake every time: a resumed session would report the certificate of the
        // first handshake, not the one served now.
        config.resumption = rustls::client::Resumption::disabled();
        WebhookClient {
            addr,
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        }
    }

    /// Sends one request (`body` as `application/json` when given) on a new connection. Errors
    /// are connection and TLS failures, as text.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<HttpsResponse, String> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.addr))?;
        let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let server_cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|cert| cert.to_vec())
            .unwrap_or_default();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        tokio::spawn(connection);
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "localhost");
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes()
            .to_vec();
        Ok(HttpsResponse {
            status,
            body,
            server_cert,
        })
    }

    /// POSTs an AdmissionReview to `/validate` and returns the answer, after checking that it
    /// is a 200 with an AdmissionReview v1 for the same `uid`.
    pub async fn review(&self, review: &Value) -> Value {
        let body = serde_json::to_vec(review).expect("serializable review");
        let response = self
            .request("POST", "/validate", Some(body))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&response.body);
        assert_eq!(response.status, 200, "{text}");
        let answer: Value =
            serde_json::from_slice(&response.body).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "{answer}");
        assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
        assert_eq!(
            answer["response"]["uid"], review["request"]["uid"],
            "{answer}"
        );
        answer
    }
}

/// An AdmissionReview `admission.k8s.io/v1` for `object`, with every field the API server
/// sets (`kind`, `resource`, `requestKind`, `requestResource`, `userInfo`, `dryRun`,
/// `options`, ...). The group, version and kind come from the object's `apiVersion` and
/// `kind`; the resource is the lower-case plural (`resourceclaims`, `deviceclasses`). For DELETE, pass the
/// stored object as `object`: it becomes `oldObject` and `object` is null, as the API server
/// sends it.
pub fn review(operation: &str, object: &Value, old_object: Option<&Value>) -> Value {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    let lower = kind.to_ascii_lowercase();
    let resource = match lower.ends_with('s') {
        true => format!("{lower}es"),
        false => format!("{lower}s"),
    };
    let gvk = json!({ "group": group, "version": version, "kind": kind });
    let gvr = json!({ "group": group, "version": version, "resource": resource });
    let (object, old_object) = match operation {
        "DELETE" => (Value::Null, object.clone()),
        _ => (object.clone(), old_object.cloned().unwrap_or(Value::Null)),
    };
    let options = match operation {
        "CREATE" => json!({
            "kind": "CreateOptions",
            "apiVersion": "meta.k8s.io/v1",
            "fieldManager": "kubectl-client-side-apply",
            "fieldValidation": "Strict",
        }),
        "UPDATE" => json!({
            "kind": "UpdateOptions",
            "apiVersion": "meta.k8s.io/v1",
            "fieldManager": "kubectl-client-side-apply",
            "fieldValidation": "Strict",
        }),
        _ => json!({
            "kind": "DeleteOptions",
            "apiVersion": "meta.k8s.io/v1",
            "propagationPolicy": "Background",
        }),
    };
    let metadata = if object.is_null() {
        &old_object["metadata"]
    } else {
        &object["metadata"]
    };
    let mut request = json!({
        "uid": uuid(),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": metadata["name"],
        "operation": operation,
        "userInfo": {
            "username": "kubernetes-admin",
            "groups": ["kubeadm:cluster-admins", "system:authenticated"],
            "extra": { "authentication.kubernetes.io/credential-id": ["X509SHA256=0f3c"] },
        },
        "object": object,
        "oldObject": old_object,
        "dryRun": false,
        "options": options,
    });
    // Cluster-scoped objects (DeviceClass) have no namespace; the field is left out.
    if let Some(namespace) = metadata["namespace"].as_str() {
        request["namespace"] = json!(namespace);
    }
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": request,
    })
}

fn uuid() -> String {
    let bytes: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}
