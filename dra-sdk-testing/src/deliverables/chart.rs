//! Helm chart checks shared by the chart tests of every driver in this repository (the mock
//! GPU driver's and the NVIDIA driver's): rendering a chart with the `helm` binary named by
//! `HELM`, checking each object against the OpenAPI documents of a v1.36.2 API server the way
//! strict field validation would (unknown fields are errors), and decoding it into its
//! `k8s-openapi` type without losing a field.
//!
//! It panics with a message on a missing tool or document: a test setup error, not data.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The workspace root: the nearest ancestor of the current directory (the package's directory
/// under `cargo test`) with a `Cargo.lock`.
pub fn workspace_root() -> PathBuf {
    let crate_dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    crate_dir
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .map(Path::to_path_buf)
        .unwrap_or(crate_dir)
}

/// The `helm` binary from `HELM`, or `None` after printing why the test is skipped. With
/// `HELM_REQUIRED=1` (CI sets it) a missing binary fails instead.
pub fn helm_or_skip() -> Option<PathBuf> {
    match std::env::var_os("HELM") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ if std::env::var_os("HELM_REQUIRED").is_some_and(|v| v == "1") => {
            panic!("HELM_REQUIRED=1 but HELM is not set (see .ci/tools)")
        }
        _ => {
            eprintln!(
                "chart: skipped: HELM is not set (a helm 3.8+/4 binary; .ci/tools installs one)"
            );
            None
        }
    }
}

/// `helm template` of the chart in `chart` as release `release` in `namespace`, with `args`
/// (values files, `--set`); every non-empty document as JSON, or helm's error output.
pub fn render_chart(
    helm: &Path,
    chart: &Path,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> Result<Vec<Value>, String> {
    let output = Command::new(helm)
        .args(["template", release])
        .arg(chart)
        .args(["--namespace", namespace])
        .args(args)
        .output()
        .map_err(|error| format!("running {}: {error}", helm.display()))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|error| error.to_string())?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// The install notes (`templates/NOTES.txt`) of `chart` with `args`, as `helm install` prints
/// them: `helm install --dry-run=client`, which renders the notes (`helm template` does not)
/// without a cluster. `Err` holds helm's error output.
pub fn render_notes(
    helm: &Path,
    chart: &Path,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> Result<String, String> {
    let output = Command::new(helm)
        .args(["install", release])
        .arg(chart)
        .args(["--dry-run=client", "--namespace", namespace])
        .args(args)
        .output()
        .map_err(|error| format!("running {}: {error}", helm.display()))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .split_once("\nNOTES:\n")
        .map(|(_, notes)| notes.to_owned())
        .unwrap_or_default())
}

/// The values sets CI renders a chart with: the defaults, then each file of its `ci/`
/// directory (sorted), as `(name, helm arguments)`.
pub fn values_sets(chart: &Path) -> Vec<(String, Vec<String>)> {
    let mut sets = vec![("defaults".to_owned(), Vec::new())];
    let ci = chart.join("ci");
    let mut files: Vec<_> = std::fs::read_dir(&ci)
        .unwrap_or_else(|error| panic!("{}: {error}", ci.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        sets.push((name, vec!["-f".to_owned(), file.display().to_string()]));
    }
    sets
}

/// Leaf paths of a values tree (maps are walked; lists and empty maps are leaves).
pub fn leaves(value: &Value, path: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(fields) if !fields.is_empty() => {
            for (key, child) in fields {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                leaves(child, &child_path, out);
            }
        }
        _ => {
            out.insert(path.to_owned());
        }
    }
}

/// A YAML file as JSON.
pub fn yaml(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Every YAML document of a file (a manifest of several objects), each as JSON.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Panics unless the chart in `chart` documents and exercises every value: each leaf of its
/// `values.yaml` is a row of its `README.md`'s table (`| `name` |`; a map value such as
/// probes or affinity may be documented as a whole), `ci/all-options-values.yaml` sets it (or
/// a map above it), and `values.schema.json` refuses unknown top-level values
/// (`additionalProperties: false`).
pub fn assert_all_options_documented(chart: &Path) {
    let defaults = yaml(&chart.join("values.yaml"));
    let all = yaml(&chart.join("ci/all-options-values.yaml"));
    let readme = std::fs::read_to_string(chart.join("README.md")).unwrap();
    let mut default_leaves = BTreeSet::new();
    leaves(&defaults, "", &mut default_leaves);
    let mut set = BTreeSet::new();
    leaves(&all, "", &mut set);
    for leaf in &default_leaves {
        let documented = leaf
            .match_indices('.')
            .map(|(at, _)| &leaf[..at])
            .chain([leaf.as_str()])
            .any(|prefix| readme.contains(&format!("| `{prefix}` |")));
        assert!(
            documented,
            "values.yaml's {leaf} is not in the README's table"
        );
        let covered = set
            .iter()
            .any(|s| s == leaf || s.starts_with(&format!("{leaf}.")))
            || leaf
                .match_indices('.')
                .any(|(at, _)| set.contains(&leaf[..at]));
        assert!(covered, "ci/all-options-values.yaml does not set {leaf}");
    }
    let schema: Value =
        serde_json::from_slice(&std::fs::read(chart.join("values.schema.json")).unwrap()).unwrap();
    assert_eq!(schema["additionalProperties"], false);
}

/// API groups the reference OpenAPI documents (`../shared/reference/openapi`) do not include:
/// objects of these are checked by the decoding round trip only (which also reports unknown
/// fields and wrong types, through the `k8s-openapi` type).
const DECODE_ONLY: [&str; 2] = ["policy/v1", "networking.k8s.io/v1"];

/// Every object of every values set: OpenAPI problems and decode problems, as messages
/// prefixed with the values set and the object. Objects of the groups the reference documents
/// lack (`policy/v1` PodDisruptionBudgets, `networking.k8s.io/v1` NetworkPolicies) are decoded
/// only.
pub fn validate_all(openapi: &OpenApi, set: &str, documents: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    for document in documents {
        let what = format!("{set}: {}", describe(document));
        let decode_only = document["apiVersion"]
            .as_str()
            .is_some_and(|version| DECODE_ONLY.contains(&version));
        if !decode_only {
            problems.extend(
                openapi
                    .check(document)
                    .into_iter()
                    .map(|p| format!("{what}: OpenAPI: {p}")),
            );
        }
        problems.extend(
            decode(document)
                .into_iter()
                .map(|p| format!("{what}: decode: {p}")),
        );
    }
    problems
}

/// The OpenAPI v3 documents of a v1.36.2 API server, from `OPENAPI_DIR` or
/// `../shared/reference/openapi` next to the repository.
pub struct OpenApi {
    schemas: BTreeMap<String, Value>,
    by_kind: BTreeMap<(String, String, String), String>,
}

impl OpenApi {
    /// Loads the documents from `OPENAPI_DIR`, or the workspace's
    /// `../shared/reference/openapi`.
    pub fn load() -> OpenApi {
        let dir = std::env::var_os("OPENAPI_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("../shared/reference/openapi"));
        let mut schemas = BTreeMap::new();
        let mut by_kind = BTreeMap::new();
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|error| panic!("{}: {error} (set OPENAPI_DIR)", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "json") {
                continue;
            }
            let document: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let Some(Value::Object(found)) = document.pointer("/components/schemas") else {
                continue;
            };
            for (name, schema) in found {
                for gvk in schema["ArbitraryKeys"]["x-kubernetes-group-version-kind"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    let key = |k: &str| gvk[k].as_str().unwrap_or_default().to_owned();
                    by_kind.insert((key("group"), key("version"), key("kind")), name.clone());
                }
                schemas.insert(name.clone(), schema.clone());
            }
        }
        assert!(
            !schemas.is_empty(),
            "no OpenAPI schemas in {}",
            dir.display()
        );
        OpenApi { schemas, by_kind }
    }

    /// What the API server's strict field validation would object to in `object`, as paths.
    pub fn check(&self, object: &Value) -> Vec<String> {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let kind = object["kind"].as_str().unwrap_or_default();
        let key = (group.to_owned(), version.to_owned(), kind.to_owned());
        let Some(name) = self.by_kind.get(&key) else {
            return vec![format!("no OpenAPI schema for {api_version} {kind}")];
        };
        let mut problems = Vec::new();
        self.walk(&self.schemas[name], object, "", &mut problems);
        problems
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema["$ref"].as_str() {
            Some(reference) => {
                let name = reference.trim_start_matches("#/components/schemas/");
                self.schemas.get(name).map_or(schema, |s| self.resolve(s))
            }
            None => schema,
        }
    }

    fn walk(&self, schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
        let schema = self.resolve(schema);
        let props = &schema["SchemaProps"];
        for part in props["allOf"].as_array().into_iter().flatten() {
            self.walk(part, value, path, out);
        }
        if let Some(alternatives) = props["oneOf"].as_array() {
            // int-or-string and quantities: any alternative's type will do.
            let fits = alternatives.iter().any(|alt| {
                let mut problems = Vec::new();
                self.walk(alt, value, path, &mut problems);
                problems.is_empty()
            });
            if !fits {
                out.push(format!("{path}: {value} fits none of the allowed types"));
            }
            return;
        }
        if let Some(allowed) = props["enum"].as_array()
            && !allowed.contains(value)
        {
            out.push(format!("{path}: {value} is not one of {allowed:?}"));
        }
        let type_ok = match props["type"].as_str() {
            None => true,
            Some("object") => value.is_object(),
            Some("array") => value.is_array(),
            Some("string") => value.is_string(),
            Some("integer") => value.is_i64() || value.is_u64(),
            Some("number") => value.is_number(),
            Some("boolean") => value.is_boolean(),
            Some(_) => true,
        };
        if !type_ok {
            out.push(format!("{path}: {value} is not of type {}", props["type"]));
            return;
        }
        match value {
            Value::Object(fields) => {
                for required in props["required"].as_array().into_iter().flatten() {
                    if let Some(field) = required.as_str()
                        && !fields.contains_key(field)
                    {
                        out.push(format!("{path}.{field}: required"));
                    }
                }
                let properties = props["properties"].as_object();
                let additional = &props["additionalProperties"];
                for (key, child) in fields {
                    let child_path = format!("{path}.{key}");
                    if let Some(child_schema) = properties.and_then(|p| p.get(key)) {
                        self.walk(child_schema, child, &child_path, out);
                    } else if additional.is_object() {
                        self.walk(additional, child, &child_path, out);
                    } else if properties.is_some() {
                        out.push(format!("{child_path}: unknown field"));
                    }
                }
            }
            Value::Array(items) if props["items"].is_object() => {
                for (index, item) in items.iter().enumerate() {
                    self.walk(&props["items"], item, &format!("{path}[{index}]"), out);
                }
            }
            _ => {}
        }
    }
}

/// Paths in `original` that `typed` lacks or holds differently.
fn differences(original: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                match b.get(key) {
                    Some(other) => differences(value, other, &format!("{path}.{key}"), out),
                    None => out.push(format!("{path}.{key}: not a field of the type")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{path}[{index}]"), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} became {b}")),
    }
}

/// Decodes `document` as `K` and reports what did not survive the round trip.
pub fn round_trip<K: DeserializeOwned + Serialize>(document: &Value) -> Vec<String> {
    let typed: K = match serde_json::from_value(document.clone()) {
        Ok(typed) => typed,
        Err(error) => return vec![error.to_string()],
    };
    let mut out = Vec::new();
    differences(
        document,
        &serde_json::to_value(typed).unwrap(),
        "",
        &mut out,
    );
    out
}

/// Decodes `document` into the `k8s-openapi` type of its kind.
pub fn decode(document: &Value) -> Vec<String> {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
    };
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service, ServiceAccount};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
    let api_version = document["apiVersion"].as_str().unwrap_or_default();
    let kind = document["kind"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Namespace") => round_trip::<Namespace>(document),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(document),
        ("v1", "Pod") => round_trip::<Pod>(document),
        ("v1", "Service") => round_trip::<Service>(document),
        ("v1", "Secret") => round_trip::<Secret>(document),
        ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(document),
        ("apps/v1", "Deployment") => round_trip::<Deployment>(document),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<PodDisruptionBudget>(document),
        ("networking.k8s.io/v1", "NetworkPolicy") => round_trip::<NetworkPolicy>(document),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(document),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<ClusterRoleBinding>(document)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(document),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(document),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            round_trip::<ValidatingAdmissionPolicy>(document)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            round_trip::<ValidatingAdmissionPolicyBinding>(document)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            round_trip::<ValidatingWebhookConfiguration>(document)
        }
        ("resource.k8s.io/v1", "DeviceClass") => round_trip::<DeviceClass>(document),
        ("resource.k8s.io/v1", "ResourceClaim") => round_trip::<ResourceClaim>(document),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            round_trip::<ResourceClaimTemplate>(document)
        }
        other => vec![format!("no k8s-openapi type for {other:?}; add one")],
    }
}

/// The first object of `kind` among rendered `documents`; panics when there is none.
pub fn find_kind<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    documents
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

/// The `env` entries of a rendered container by variable name (empty without `env`).
pub fn env_map(container: &Value) -> BTreeMap<String, Value> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| (v["name"].as_str().unwrap_or_default().to_owned(), v.clone()))
        .collect()
}

/// Panics unless the rules of the plugin's ClusterRole `role` are least privilege: exactly the
/// verbs the SDK's plugin uses (get claims; list, watch, create, update and delete slices; get
/// nodes; create and patch `events.k8s.io` Events), no other patch, no deletecollection.
pub fn assert_plugin_rules(role: &Value) {
    let rules: Vec<(String, Vec<String>)> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            (
                rule["resources"][0].as_str().unwrap().to_owned(),
                serde_json::from_value(rule["verbs"].clone()).unwrap(),
            )
        })
        .collect();
    let owned = |r: &str, v: &[&str]| (r.to_owned(), v.iter().map(|s| (*s).to_owned()).collect());
    assert_eq!(
        rules,
        vec![
            owned("resourceclaims", &["get"]),
            owned(
                "resourceslices",
                &["list", "watch", "create", "update", "delete"]
            ),
            owned("nodes", &["get"]),
            // Failure Events on claims: created once, then their series count patched.
            owned("events", &["create", "patch"]),
        ]
    );
    let events = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|rule| rule["resources"][0] == "events")
        .unwrap();
    assert_eq!(events["apiGroups"], serde_json::json!(["events.k8s.io"]));
}

/// `kind/name` of a document, for messages.
pub fn describe(document: &Value) -> String {
    format!(
        "{}/{}",
        document["kind"].as_str().unwrap_or("?"),
        document["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// A TLS handshake, in memory, between a server presenting `cert_pem` with `key_pem` and a
/// client that trusts only `ca_pem` and connects to `server_name`: what the API server does
/// when it calls a webhook with the `caBundle` of its configuration. `Err` says what failed
/// (a bad PEM, an untrusted chain, a name the certificate does not cover).
pub fn tls_handshake(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
    server_name: &str,
) -> Result<(), String> {
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("certificate: {error}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| format!("key: {error}"))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem) {
        let ca = ca.map_err(|error| format!("CA bundle: {error}"))?;
        roots
            .add(ca)
            .map_err(|error| format!("CA bundle: {error}"))?;
    }
    let server_config = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| format!("server: {error}"))?;
    let client_config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(server_name.to_owned()).map_err(|error| error.to_string())?;
    let mut client = ClientConnection::new(Arc::new(client_config), name)
        .map_err(|error| format!("client: {error}"))?;
    let mut server = ServerConnection::new(Arc::new(server_config))
        .map_err(|error| format!("server: {error}"))?;
    // Each round moves what one side wrote to the other; a TLS 1.3 handshake needs two.
    for _ in 0..8 {
        let mut wire = Vec::new();
        client
            .write_tls(&mut wire)
            .map_err(|error| error.to_string())?;
        server
            .read_tls(&mut wire.as_slice())
            .map_err(|error| error.to_string())?;
        server
            .process_new_packets()
            .map_err(|error| format!("server: {error}"))?;
        wire.clear();
        server
            .write_tls(&mut wire)
            .map_err(|error| error.to_string())?;
        client
            .read_tls(&mut wire.as_slice())
            .map_err(|error| error.to_string())?;
        client
            .process_new_packets()
            .map_err(|error| format!("client: {error}"))?;
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
    }
    Err("the handshake did not complete".to_owned())
}

/// The rendered RBAC objects (Roles, ClusterRoles and their bindings), for comparing the
/// permissions two renderings grant.
pub fn rbac_objects(documents: &[Value]) -> Vec<Value> {
    documents
        .iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| k.ends_with("Role") || k.ends_with("RoleBinding"))
        })
        .cloned()
        .collect()
}

/// The objects of a chart's validating admission webhook (`webhook.enabled`) among rendered
/// `documents`: those labelled `app.kubernetes.io/component: webhook`, by kind.
pub fn webhook_objects(documents: &[Value]) -> BTreeMap<String, Vec<&Value>> {
    let mut out: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for document in documents {
        if document["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook" {
            let kind = document["kind"].as_str().unwrap_or_default().to_owned();
            out.entry(kind).or_default().push(document);
        }
    }
    out
}

/// Whether the `matchLabels` selector `selector` selects a pod labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|wanted| wanted.iter().all(|(key, value)| &labels[key] == value))
}

/// Panics unless a chart's webhook objects among `documents`, rendered in `namespace`, have the
/// shape the webhook contract asks for: a Deployment running `command` hardened (non-root,
/// read-only root filesystem, no privilege escalation, every capability dropped, seccomp
/// RuntimeDefault or Localhost, no ServiceAccount token), probed with HTTPS `GET /readyz`,
/// its TLS Secret mounted at `/etc/dra-webhook/tls`; a Service that selects its pods and
/// targets its port; a PodDisruptionBudget (`minAvailable: 1`) over the same pods exactly when
/// there is more than one replica; a ValidatingWebhookConfiguration for CREATE and UPDATE of
/// claims, claim templates and DeviceClasses, calling that Service at `/validate`. The
/// webhook's pods are selected by no other workload, Service or NetworkPolicy of the chart.
/// Returns the webhook configuration's single webhook.
pub fn assert_webhook_shape<'a>(
    documents: &'a [Value],
    namespace: &str,
    command: &str,
) -> &'a Value {
    let objects = webhook_objects(documents);
    let one = |kind: &str| -> &'a Value {
        let found = objects.get(kind).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(found.len(), 1, "one webhook {kind}: {found:?}");
        found[0]
    };
    let deployment = one("Deployment");
    let service = one("Service");
    let configuration = one("ValidatingWebhookConfiguration");
    let spec = &deployment["spec"];
    let pod_labels = &spec["template"]["metadata"]["labels"];
    assert!(selects(&spec["selector"]["matchLabels"], pod_labels));
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    let account = pod["serviceAccountName"].as_str().unwrap();
    if let Some(service_account) = documents
        .iter()
        .find(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == account)
    {
        assert_eq!(service_account["automountServiceAccountToken"], false);
    }
    // No RBAC names the webhook's account: it makes no API calls.
    for binding in documents.iter().filter(|d| {
        d["kind"]
            .as_str()
            .is_some_and(|kind| kind.ends_with("RoleBinding"))
    }) {
        for subject in binding["subjects"].as_array().into_iter().flatten() {
            assert_ne!(subject["name"], account, "{}", describe(binding));
        }
    }
    let container = &pod["containers"][0];
    assert_eq!(pod["containers"].as_array().map(Vec::len), Some(1));
    assert_eq!(container["command"], serde_json::json!([command]));
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_ne!(security["privileged"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_ne!(pod["securityContext"]["runAsUser"], 0);
    let seccomp = if security["seccompProfile"].is_null() {
        &pod["securityContext"]["seccompProfile"]["type"]
    } else {
        &security["seccompProfile"]["type"]
    };
    assert!(
        seccomp == "RuntimeDefault" || seccomp == "Localhost",
        "{seccomp}"
    );
    assert!(!container["resources"]["requests"].is_null(), "resources");
    let port = &container["ports"][0];
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], "/readyz", "{probe}");
        assert_eq!(get["scheme"], "HTTPS", "{probe}");
        assert_eq!(get["port"], port["name"], "{probe}");
    }
    let env = env_map(container);
    assert_eq!(
        env["WEBHOOK_PORT"]["value"],
        port["containerPort"].to_string()
    );
    assert_eq!(
        env["TLS_CERT_FILE"]["value"],
        "/etc/dra-webhook/tls/tls.crt"
    );
    assert_eq!(env["TLS_KEY_FILE"]["value"], "/etc/dra-webhook/tls/tls.key");
    let mount = &container["volumeMounts"][0];
    assert_eq!(mount["mountPath"], "/etc/dra-webhook/tls");
    assert_eq!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the TLS volume");
    assert!(volume["secret"]["secretName"].is_string());

    // The Service selects the webhook's pods and targets its port; nothing else selects them.
    assert!(selects(&service["spec"]["selector"], pod_labels));
    assert_eq!(service["spec"]["ports"][0]["targetPort"], port["name"]);
    for other in documents
        .iter()
        .filter(|d| !objects.values().flatten().any(|w| w == d))
    {
        let selector = match other["kind"].as_str().unwrap_or_default() {
            "Service" => &other["spec"]["selector"],
            "DaemonSet" | "Deployment" => &other["spec"]["selector"]["matchLabels"],
            "NetworkPolicy" => &other["spec"]["podSelector"]["matchLabels"],
            _ => continue,
        };
        assert!(
            !selects(selector, pod_labels),
            "{} selects the webhook's pods",
            describe(other)
        );
    }

    let replicas = spec["replicas"].as_i64().unwrap();
    match objects.get("PodDisruptionBudget").map(Vec::as_slice) {
        Some([budget]) => {
            assert!(
                replicas > 1,
                "a PodDisruptionBudget with {replicas} replica"
            );
            assert_eq!(budget["spec"]["minAvailable"], 1);
            assert_eq!(budget["spec"]["selector"], spec["selector"]);
        }
        None => assert_eq!(
            replicas, 1,
            "no PodDisruptionBudget with {replicas} replicas"
        ),
        Some(many) => panic!("{} PodDisruptionBudgets", many.len()),
    }

    let webhooks = configuration["webhooks"].as_array().unwrap();
    assert_eq!(webhooks.len(), 1);
    let webhook = &webhooks[0];
    assert_eq!(
        webhook["rules"],
        serde_json::json!([{
            "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
            "scope": "*"
        }])
    );
    assert_eq!(webhook["matchPolicy"], "Equivalent");
    assert_eq!(webhook["sideEffects"], "None");
    assert_eq!(
        webhook["admissionReviewVersions"],
        serde_json::json!(["v1"])
    );
    let called = &webhook["clientConfig"]["service"];
    assert_eq!(called["name"], service["metadata"]["name"]);
    assert_eq!(called["namespace"], namespace);
    assert_eq!(called["path"], "/validate");
    assert_eq!(called["port"], service["spec"]["ports"][0]["port"]);
    for object in [deployment, service] {
        assert_eq!(object["metadata"]["namespace"], namespace);
    }
    webhook
}

/// The bytes of `key` in a rendered Secret's `data` (base64).
pub fn secret_data(secret: &Value, key: &str) -> Vec<u8> {
    use base64::Engine as _;
    let encoded = secret["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no data {key}", describe(secret)));
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_else(|error| panic!("{}: data {key}: {error}", describe(secret)))
}

/// Panics unless the `helm` TLS mode's objects among `documents` agree: the Secret the
/// Deployment mounts holds a CA, which is the webhook configuration's `caBundle`, and a
/// certificate and key that complete a TLS handshake with a client trusting only that
/// bundle, for the names the API server uses for the Service (`<svc>.<ns>.svc`, and the
/// shorter ones), and for no other name.
pub fn assert_helm_mode_certificate(documents: &[Value], namespace: &str) {
    let objects = webhook_objects(documents);
    let secret = objects["Secret"][0];
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let deployment = objects["Deployment"][0];
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    assert_eq!(
        volumes[0]["secret"]["secretName"],
        secret["metadata"]["name"]
    );
    let webhook = &objects["ValidatingWebhookConfiguration"][0]["webhooks"][0];
    assert_eq!(
        webhook["clientConfig"]["caBundle"],
        secret["data"]["ca.crt"]
    );
    let (cert, key, ca) = (
        secret_data(secret, "tls.crt"),
        secret_data(secret, "tls.key"),
        secret_data(secret, "ca.crt"),
    );
    let service = objects["Service"][0]["metadata"]["name"].as_str().unwrap();
    for name in [
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}"),
        service.to_owned(),
    ] {
        tls_handshake(&cert, &key, &ca, &name).unwrap_or_else(|error| panic!("{name}: {error}"));
    }
    let error = tls_handshake(&cert, &key, &ca, "elsewhere.example.com")
        .expect_err("the certificate is for the Service only");
    assert!(error.contains("client"), "{error}");
}

/// One RBAC permission: API group (`""` for core), resource (`resource/subresource` for a
/// subresource) and verb, as a rule grants it and as the API server checks a request.
pub type Permission = (String, String, String);

/// The permissions the Roles and ClusterRoles among rendered `documents` grant to the
/// ServiceAccount named `service_account` (through the bindings naming it), each rule expanded
/// to its (group, resource, verb) triples. `resourceNames` narrow a rule; they are not part of
/// the triple.
pub fn granted_permissions(documents: &[Value], service_account: &str) -> BTreeSet<Permission> {
    let bound_roles: BTreeSet<(String, String)> = documents
        .iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|kind| kind.ends_with("RoleBinding"))
        })
        .filter(|binding| {
            binding["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|subject| {
                    subject["kind"] == "ServiceAccount" && subject["name"] == service_account
                })
        })
        .map(|binding| {
            (
                binding["roleRef"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                binding["roleRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let mut granted = BTreeSet::new();
    for role in documents.iter().filter(|d| {
        let key = (
            d["kind"].as_str().unwrap_or_default().to_owned(),
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        bound_roles.contains(&key)
    }) {
        for rule in role["rules"].as_array().into_iter().flatten() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        granted.insert((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    granted
}

/// The API group of each resource a driver in this repository calls, by the plural the fake
/// API server counts requests under; a resource missing here is an error in
/// [`requested_permissions`], so that a new API call cannot go unchecked.
const RESOURCE_GROUPS: &[(&str, &str)] = &[
    ("resourceslices", "resource.k8s.io"),
    ("resourceclaims", "resource.k8s.io"),
    ("resourceclaims/status", "resource.k8s.io"),
    ("deviceclasses", "resource.k8s.io"),
    ("resourceclaimtemplates", "resource.k8s.io"),
    ("nodes", ""),
    ("pods", ""),
    ("secrets", ""),
    ("configmaps", ""),
    // The plugins write `events.k8s.io/v1` Events; the fake API server serves Events only in
    // that group.
    ("events", "events.k8s.io"),
    ("deployments", "apps"),
    ("daemonsets", "apps"),
    ("leases", "coordination.k8s.io"),
];

/// The permissions the requests counted in `stats` needed, as the API server's authorizer
/// checks them: (group, resource, verb) per request kind seen. A status patch of a
/// ResourceClaim also needs `associated-node:patch` on the synthetic `resourceclaims/driver`
/// subresource (Kubernetes 1.36 checks it for the driver named in the status; no request goes
/// to it), so it is added with such a patch. `Err` names a resource missing from the table.
pub fn requested_permissions(
    stats: &crate::apiserver::Stats,
) -> Result<BTreeSet<Permission>, String> {
    use crate::apiserver::Verb;
    const VERBS: [Verb; 8] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
    ];
    let mut requested = BTreeSet::new();
    for (resource, counts) in &stats.by_resource {
        let Some((_, group)) = RESOURCE_GROUPS.iter().find(|(r, _)| r == resource) else {
            return Err(format!(
                "requests to `{resource}`, whose API group the RBAC check does not know: add it \
                 to RESOURCE_GROUPS"
            ));
        };
        for verb in VERBS.into_iter().filter(|verb| counts.count(*verb) > 0) {
            requested.insert((
                (*group).to_owned(),
                resource.clone(),
                verb.as_str().to_owned(),
            ));
            if resource == "resourceclaims/status" && verb == Verb::Patch {
                requested.insert((
                    "resource.k8s.io".to_owned(),
                    "resourceclaims/driver".to_owned(),
                    "associated-node:patch".to_owned(),
                ));
            }
        }
    }
    Ok(requested)
}

/// Panics unless `granted` (from [`granted_permissions`]) and `requested` (from
/// [`requested_permissions`]) are the same set, listing what the code calls without a grant
/// (the plugin would get 403 on a real cluster) and what is granted while nothing calls it
/// (more privilege than needed).
pub fn assert_rbac_matches_calls(
    what: &str,
    granted: &BTreeSet<Permission>,
    requested: &BTreeSet<Permission>,
) {
    let show = |set: Vec<&Permission>| {
        set.iter()
            .map(|(group, resource, verb)| format!("  {verb} {resource} (group {group:?})"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let not_granted: Vec<&Permission> = requested.difference(granted).collect();
    let not_called: Vec<&Permission> = granted.difference(requested).collect();
    assert!(
        not_granted.is_empty() && not_called.is_empty(),
        "{what}: the RBAC rules and the API calls differ\ncalled but not granted:\n{}\ngranted but \
         never called:\n{}",
        show(not_granted),
        show(not_called)
    );
}

/// Drives a registered plugin through the calls a prepare makes for the RBAC comparison of
/// [`assert_rbac_matches_calls`]: `good` is prepared once (a claim read), then `bad`, a claim
/// whose prepare fails, is retried as the kubelet would until the plugin has created its Event
/// and patched the Event's series (20 s at most).
pub async fn prepare_good_and_retry_bad_until_event_series(
    kubelet: &crate::kubelet::RegisteredPlugin,
    api: &crate::apiserver::FakeApiServer,
    good: &dra_sdk::claim::ClaimRef,
    bad: &dra_sdk::claim::ClaimRef,
) {
    use std::time::Duration;
    let prepared = kubelet.prepare(std::slice::from_ref(good)).await.unwrap();
    assert!(prepared[&good.uid].is_ok(), "{prepared:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while api.stats().resource("events").patch == 0 {
        let failed = kubelet.prepare(std::slice::from_ref(bad)).await.unwrap();
        assert!(failed[&bad.uid].is_err(), "{failed:?}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Event series patch"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
