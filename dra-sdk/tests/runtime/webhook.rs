//! The admission webhook (feature `webhook`) over real HTTPS: AdmissionReview v1 requests in
//! the shape the API server sends, for ResourceClaims, ResourceClaimTemplates and DeviceClasses
//! of each `resource.k8s.io` version, whose objects are first checked against the OpenAPI
//! schemas of a real API server (so the objects are ones the API server would admit as far as
//! its own validation goes). Also: malformed bodies, the body limit, `/readyz`, a certificate
//! replaced on disk, and shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use dra_sdk::config::ConfigRegistry;
use dra_sdk::webhook::AdmissionServer;
use dra_sdk_testing::admission::{WebhookClient, WebhookPki, review};
use dra_sdk_testing::deliverables::chart::OpenApi;
use dra_sdk_testing::sample_driver::{DRIVER, GpuConfig};
use serde_json::{Value, json};
use tokio::sync::oneshot;

struct Running {
    client: WebhookClient,
    pki: WebhookPki,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<Result<(), dra_sdk::webhook::WebhookError>>,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let pki = WebhookPki::create(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = AdmissionServer::new(
        DRIVER,
        ConfigRegistry::<GpuConfig>::new().register::<GpuConfig>(),
    )
    .tls_files(&pki.cert_file, &pki.key_file)
    .reload_interval(Duration::from_millis(50));
    let server = tokio::spawn(server.serve(listener, async move {
        let _ = stopped.await;
    }));
    Running {
        client: WebhookClient::new(addr, pki.ca_pem()),
        pki,
        stop: Some(stop),
        server,
        _dir: dir,
    }
}

fn gpu_config(extra: Value) -> Value {
    let mut parameters = json!({ "apiVersion": "gpu.example.com/v1", "kind": "GpuConfig" });
    if let (Value::Object(parameters), Value::Object(extra)) = (&mut parameters, extra) {
        parameters.extend(extra);
    }
    parameters
}

fn opaque(driver: &str, parameters: Value, requests: Option<&[&str]>) -> Value {
    let mut config = json!({ "opaque": { "driver": driver, "parameters": parameters } });
    if let Some(requests) = requests {
        config["requests"] = json!(requests);
    }
    config
}

/// A good config of ours, a typo of ours, another driver's config (with fields we do not
/// know), and a kind of ours that does not exist.
/// Claims and templates may scope a config to requests; classes cannot.
fn mixed_configs(scoped: bool) -> Vec<Value> {
    let requests: Option<&[&str]> = scoped.then_some(&["gpu"]);
    vec![
        opaque(
            DRIVER,
            gpu_config(json!({ "sharing": "TimeSlicing" })),
            None,
        ),
        opaque(
            DRIVER,
            gpu_config(json!({ "sharng": "TimeSlicing" })),
            requests,
        ),
        opaque(
            "nic.example.com",
            json!({ "apiVersion": "nic/v1", "kind": "X", "mtu": 9000 }),
            None,
        ),
        opaque(
            DRIVER,
            json!({ "apiVersion": "gpu.example.com/v2", "kind": "GpuConfig" }),
            None,
        ),
    ]
}

/// The four configs' denial, in a claim (`spec.devices.config`) or a template.
fn expected_denial(prefix: &str) -> String {
    format!(
        "{prefix}[1].opaque.parameters: invalid GpuConfig (gpu.example.com/v1): unknown field \
         `sharng` (did you mean `sharing`?); {prefix}[3].opaque.parameters: unsupported opaque \
         config kind \"GpuConfig\" in apiVersion \"gpu.example.com/v2\"; this driver accepts \
         GpuConfig (gpu.example.com/v1)"
    )
}

fn claim(version: &str, configs: Vec<Value>) -> Value {
    // v1beta1 has the request fields inline; v1 and v1beta2 put them under `exactly`.
    let request = match version {
        "v1beta1" => json!({ "name": "gpu", "deviceClassName": "gpu.example.com" }),
        _ => json!({ "name": "gpu", "exactly": { "deviceClassName": "gpu.example.com" } }),
    };
    json!({
        "apiVersion": format!("resource.k8s.io/{version}"),
        "kind": "ResourceClaim",
        "metadata": {
            "name": "training",
            "namespace": "default",
            "uid": "3f2b0f55-9d5e-4c53-bb3c-0f6f63a0f1d1",
            "creationTimestamp": "2026-12-01T10:00:00Z",
        },
        "spec": { "devices": { "requests": [request], "config": configs } },
    })
}

fn template(version: &str, configs: Vec<Value>) -> Value {
    let claim = claim(version, configs);
    json!({
        "apiVersion": claim["apiVersion"],
        "kind": "ResourceClaimTemplate",
        "metadata": { "name": "training", "namespace": "default" },
        "spec": { "spec": claim["spec"] },
    })
}

fn class(version: &str, configs: Vec<Value>) -> Value {
    json!({
        "apiVersion": format!("resource.k8s.io/{version}"),
        "kind": "DeviceClass",
        "metadata": { "name": "gpu.example.com" },
        "spec": {
            "selectors": [{ "cel": { "expression": "device.driver == 'gpu.example.com'" } }],
            "config": configs,
        },
    })
}

fn schema_checked(openapi: &OpenApi, object: Value) -> Value {
    let problems = openapi.check(&object);
    assert!(problems.is_empty(), "{object}: {problems:?}");
    object
}

fn denial(answer: &Value) -> (bool, String) {
    let response = &answer["response"];
    let allowed = response["allowed"].as_bool().expect("allowed");
    if !allowed {
        assert_eq!(response["status"]["code"], 422, "{answer}");
        assert_eq!(response["status"]["reason"], "Invalid", "{answer}");
    }
    let message = response["status"]["message"].as_str().unwrap_or_default();
    (allowed, message.to_owned())
}

#[tokio::test]
async fn webhook_denies_bad_configs_of_claims_templates_and_classes_in_every_version() {
    let openapi = OpenApi::load();
    let webhook = start().await;
    for version in ["v1", "v1beta2", "v1beta1"] {
        let cases = [
            (claim(version, mixed_configs(true)), "spec.devices.config"),
            (
                template(version, mixed_configs(true)),
                "spec.spec.devices.config",
            ),
            (class(version, mixed_configs(false)), "spec.config"),
        ];
        for (object, prefix) in cases {
            let object = schema_checked(&openapi, object);
            let kind = object["kind"].as_str().unwrap().to_owned();
            let answer = webhook
                .client
                .review(&review("CREATE", &object, None))
                .await;
            assert_eq!(
                denial(&answer),
                (false, expected_denial(prefix)),
                "{version} {kind}"
            );

            // The same object with only the good config and the other driver's is admitted.
            let mut good = object.clone();
            let configs = good
                .pointer_mut(&format!("/{}", prefix.replace('.', "/")))
                .unwrap();
            let kept = configs
                .as_array()
                .unwrap()
                .iter()
                .step_by(2)
                .cloned()
                .collect();
            *configs = Value::Array(kept);
            let good = schema_checked(&openapi, good);
            let answer = webhook.client.review(&review("CREATE", &good, None)).await;
            assert_eq!(denial(&answer), (true, String::new()), "{version} {kind}");
        }
    }
}

#[tokio::test]
async fn webhook_judges_updates_by_their_new_configs_and_allows_deletes() {
    let openapi = OpenApi::load();
    let webhook = start().await;
    let typo = opaque(DRIVER, gpu_config(json!({ "sharng": "x" })), None);
    // A class stored before the webhook existed, with a typo in it.
    let stored = schema_checked(&openapi, class("v1", vec![typo.clone()]));
    let mut relabelled = stored.clone();
    relabelled["metadata"]["labels"] = json!({ "team": "ml" });
    let answer = webhook
        .client
        .review(&review("UPDATE", &relabelled, Some(&stored)))
        .await;
    assert_eq!(denial(&answer), (true, String::new()));

    // Adding a second bad config is refused, and only the new one is named.
    let added = class(
        "v1",
        vec![
            typo,
            opaque(DRIVER, gpu_config(json!({ "sharing": 3 })), None),
        ],
    );
    let answer = webhook
        .client
        .review(&review(
            "UPDATE",
            &schema_checked(&openapi, added),
            Some(&stored),
        ))
        .await;
    let (allowed, message) = denial(&answer);
    assert!(!allowed);
    assert!(
        message.starts_with(
            "spec.config[1].opaque.parameters: invalid GpuConfig (gpu.example.com/v1): sharing: "
        ),
        "{message}"
    );
    assert!(!message.contains("config[0]"), "{message}");

    let answer = webhook
        .client
        .review(&review("DELETE", &stored, None))
        .await;
    assert_eq!(denial(&answer), (true, String::new()));
}

#[tokio::test]
async fn webhook_answers_malformed_requests_with_400_and_serves_readyz() {
    let webhook = start().await;
    let client = &webhook.client;
    let ready = client.request("GET", "/readyz", None).await.unwrap();
    assert_eq!(
        (ready.status, ready.body.as_slice()),
        (200, b"ok".as_slice())
    );

    let cases: [(&[u8], &str); 3] = [
        (b"{\"apiVersion\": ", "malformed AdmissionReview: "),
        (
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#,
            "this webhook answers admission.k8s.io/v1 only",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"}}}"#,
            "request: missing field `operation`",
        ),
    ];
    for (body, expected) in cases {
        let response = client
            .request("POST", "/validate", Some(body.to_vec()))
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&response.body);
        assert_eq!(response.status, 400, "{text}");
        assert!(text.contains(expected), "{text} lacks {expected}");
    }

    // Over the limit: refused without being read to the end.
    let huge = vec![b' '; 7 * 1024 * 1024];
    let response = client
        .request("POST", "/validate", Some(huge))
        .await
        .unwrap();
    assert_eq!(response.status, 413);

    // Still serving after all that.
    let claim = claim("v1", vec![]);
    let answer = client.review(&review("CREATE", &claim, None)).await;
    assert_eq!(denial(&answer), (true, String::new()));
}

#[tokio::test]
async fn webhook_serves_a_replaced_certificate_without_restart_and_stops_cleanly() {
    let mut webhook = start().await;
    let first = webhook
        .client
        .request("GET", "/readyz", None)
        .await
        .unwrap();
    let replaced = webhook.pki.rotate();
    assert_ne!(first.server_cert, replaced);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let response = webhook
            .client
            .request("GET", "/readyz", None)
            .await
            .unwrap();
        assert_eq!(response.status, 200);
        if response.server_cert == replaced {
            break;
        }
        assert_eq!(
            response.server_cert, first.server_cert,
            "neither the old nor the new certificate"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A key that does not go with the certificate is not picked up: the pair in use stays.
    std::fs::write(
        &webhook.pki.key_file,
        rcgen::KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let response = webhook
        .client
        .request("GET", "/readyz", None)
        .await
        .unwrap();
    assert_eq!(response.server_cert, replaced);

    webhook.stop.take().unwrap().send(()).unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(5), &mut webhook.server).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
    assert!(
        webhook
            .client
            .request("GET", "/readyz", None)
            .await
            .is_err()
    );
}
