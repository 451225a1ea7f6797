//! What monitoring and the DaemonSet's probes see of a running plugin: the whole `/metrics`
//! output read by an independent OpenMetrics parser, `/healthz`, and the gRPC health service
//! that `--healthcheck-port` serves for the liveness probe. Unhealthy plugins are made for
//! real: a socket file of the running plugin is deleted, as a wiped kubelet directory does.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use dra_sdk::claim::ClaimRef;
use dra_sdk::cli::PluginArgs;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::{NODE_NAME, NewClaim, TestCluster};
use dra_sdk_testing::kubelet::{KubeletVersion, RegisteredPlugin};
use hyper_util::rt::TokioIo;
use openmetrics_parser::{OpenMetricsType, OpenMetricsValue};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use dra_sdk_testing::sample_driver::{DRIVER, GpuDriver, gpus};

/// The gRPC service names of the DRA API the plugin serves, as a probe would name them.
const DRA_SERVICES: [&str; 2] = [
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
];

/// Every metric family a plugin that publishes slices must serve, with its OpenMetrics type.
const EXPECTED_FAMILIES: [(&str, OpenMetricsType); 11] = [
    ("dra_prepare_claims", OpenMetricsType::Counter),
    ("dra_unprepare_claims", OpenMetricsType::Counter),
    ("dra_claim_errors", OpenMetricsType::Counter),
    (
        "dra_prepare_claim_duration_seconds",
        OpenMetricsType::Histogram,
    ),
    (
        "dra_unprepare_claim_duration_seconds",
        OpenMetricsType::Histogram,
    ),
    ("dra_requests_in_flight", OpenMetricsType::Gauge),
    ("dra_prepared_claims", OpenMetricsType::Gauge),
    ("dra_resourceslice_creates", OpenMetricsType::Counter),
    ("dra_resourceslice_updates", OpenMetricsType::Counter),
    ("dra_resourceslice_deletes", OpenMetricsType::Counter),
    ("dra_resourceslice_errors", OpenMetricsType::Counter),
];

/// A plugin started from the command-line flags a DaemonSet passes, on the test cluster's
/// directories, publishing four GPUs and registered with a 1.36 kubelet.
struct Running {
    cluster: TestCluster,
    plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    plugin: PluginArgs,
}

async fn start(extra_flags: &[&str]) -> Running {
    let cluster = TestCluster::start().await.unwrap();
    let dir = |path: PathBuf| path.display().to_string();
    let mut flags = vec![
        "plugin".to_string(),
        "--node-name".into(),
        NODE_NAME.into(),
        "--kubelet-registrar-directory-path".into(),
        dir(cluster.registrar_dir()),
        "--kubelet-plugins-directory-path".into(),
        dir(cluster.plugins_dir()),
        "--cdi-root".into(),
        dir(cluster.cdi_root()),
    ];
    flags.extend(extra_flags.iter().map(|flag| flag.to_string()));
    let cli = Cli::try_parse_from(flags).unwrap();
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .args(&cli.plugin)
        .unwrap()
        .resources(gpus(4))
        .start()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), plugin.published())
        .await
        .expect("slices published");
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    Running {
        cluster,
        plugin,
        kubelet,
    }
}

#[tokio::test]
async fn the_whole_metrics_output_parses_with_one_prefix_and_unique_labels() {
    let r = start(&["--http-endpoint", "127.0.0.1:0"]).await;

    // Give every family samples: a prepared claim (from the published slices), a claim that
    // does not exist (an error), an unprepare.
    r.cluster.create_device_class(DRIVER, DRIVER).await.unwrap();
    r.cluster
        .create_claim(NewClaim::new("default", "gpu").request("gpu", DRIVER))
        .await
        .unwrap();
    let claim = r.cluster.allocate("default", "gpu").await.unwrap();
    let missing = ClaimRef {
        uid: "00000000-0000-0000-0000-00000000dead".into(),
        namespace: "default".into(),
        name: "missing".into(),
    };
    let prepared = r
        .kubelet
        .prepare(&[claim.clone(), missing.clone()])
        .await
        .unwrap();
    assert!(prepared[&claim.uid].is_ok(), "{prepared:?}");
    assert!(prepared[&missing.uid].is_err(), "{prepared:?}");
    let unprepared = r
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(unprepared[&claim.uid].is_ok(), "{unprepared:?}");

    let addr = r.plugin.http_addr().unwrap();
    let (status, headers, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{headers}"
    );

    // The served content type is OpenMetrics: parse the whole body with that grammar. The
    // parser also rejects a label repeated within one sample.
    let exposition = openmetrics_parser::openmetrics::parse_openmetrics(&body)
        .unwrap_or_else(|error| panic!("/metrics does not parse: {error:?}\n{body}"));

    for (name, family) in &exposition.families {
        assert!(name.starts_with("dra_"), "{name} has no dra_ prefix");
        assert!(
            !name.trim_start_matches("dra_").starts_with("dra_"),
            "{name} has a doubled prefix"
        );
        let labels = family.get_label_names();
        let unique: HashSet<&String> = labels.iter().collect();
        assert_eq!(
            unique.len(),
            labels.len(),
            "{name}: duplicated label in {labels:?}"
        );
        for sample in family.iter_samples() {
            let set = sample.get_labelset().unwrap();
            assert_eq!(
                set.get_label_value("driver"),
                Some(DRIVER),
                "{name}: every sample carries driver=\"{DRIVER}\" once"
            );
        }
    }
    // Independent of the parser: no sample line names a label twice.
    for line in body.lines().filter(|line| !line.starts_with('#')) {
        let Some((_, rest)) = line.split_once('{') else {
            continue;
        };
        let labels = rest.split_once('}').map_or(rest, |(labels, _)| labels);
        let names: Vec<&str> = labels
            .split(',')
            .filter_map(|pair| pair.split_once('=').map(|(name, _)| name))
            .collect();
        let unique: HashSet<&&str> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "duplicated label in {line}");
    }

    for (name, kind) in EXPECTED_FAMILIES {
        let family = exposition
            .families
            .get(name)
            .unwrap_or_else(|| panic!("no family {name} in\n{body}"));
        assert_eq!(family.family_type, kind, "type of {name}");
    }

    // The values say what happened.
    let counter = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let family = &exposition.families[name];
        let sample = family
            .iter_samples()
            .find(|sample| {
                let set = sample.get_labelset().unwrap();
                labels
                    .iter()
                    .all(|(label, value)| set.get_label_value(label) == Some(*value))
            })
            .unwrap_or_else(|| panic!("no sample of {name} with {labels:?}\n{body}"));
        match &sample.value {
            OpenMetricsValue::Counter(counter) => counter.value.as_f64(),
            OpenMetricsValue::Gauge(gauge) => gauge.as_f64(),
            OpenMetricsValue::Histogram(histogram) => histogram.count.unwrap_or_default() as f64,
            other => panic!("{name}: unexpected value {other:?}"),
        }
    };
    assert_eq!(counter("dra_prepare_claims", &[]), 2.0);
    assert_eq!(counter("dra_unprepare_claims", &[]), 1.0);
    assert_eq!(
        counter(
            "dra_claim_errors",
            &[("operation", "Prepare"), ("kind", "claim_not_found")]
        ),
        1.0
    );
    assert_eq!(counter("dra_prepare_claim_duration_seconds", &[]), 1.0);
    assert_eq!(counter("dra_unprepare_claim_duration_seconds", &[]), 1.0);
    assert_eq!(counter("dra_prepared_claims", &[]), 0.0);
    assert_eq!(
        counter("dra_requests_in_flight", &[("operation", "Prepare")]),
        0.0
    );
    assert!(counter("dra_resourceslice_creates", &[]) >= 1.0);
    assert_eq!(counter("dra_resourceslice_errors", &[]), 0.0);

    r.plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_healthcheck_port_reports_serving_for_the_dra_services() {
    let r = start(&["--healthcheck-port", "0", "--http-endpoint", "127.0.0.1:0"]).await;
    let port = r
        .plugin
        .healthcheck_addr()
        .expect("--healthcheck-port 0")
        .port();
    // What a Kubernetes `grpc` probe does: a plain TCP connection, no TLS.
    let tcp = tcp_channel(port).await;
    for service in ["", DRA_SERVICES[0], DRA_SERVICES[1]] {
        assert_eq!(
            check(&tcp, service).await.unwrap().status(),
            ServingStatus::Serving,
            "{service:?} on the healthcheck port"
        );
    }
    // The DRA socket itself serves the standard health service too, per service name.
    let dra = unix_channel(&r.plugin.socket_paths().dra).await;
    for service in DRA_SERVICES {
        assert_eq!(
            check(&dra, service).await.unwrap().status(),
            ServingStatus::Serving,
            "{service} on the DRA socket"
        );
    }
    let unknown = check(&dra, "no.such.Service").await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let (status, _, body) = http_get(r.plugin.http_addr().unwrap(), "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    r.plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lost_dra_socket_makes_healthz_503_and_the_probe_not_serving() {
    let r = start(&["--healthcheck-port", "0", "--http-endpoint", "127.0.0.1:0"]).await;
    let http = r.plugin.http_addr().unwrap();
    let tcp = tcp_channel(r.plugin.healthcheck_addr().unwrap().port()).await;
    assert_eq!(http_get(http, "/healthz").await.0, 200);

    // The socket file goes (a wiped plugins directory): the server still runs, but neither the
    // kubelet nor anyone else can reach it any more.
    std::fs::remove_file(&r.plugin.socket_paths().dra).unwrap();

    let (status, _, body) = http_get(http, "/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert_contains(&body, "DRA socket");
    for service in ["", DRA_SERVICES[0]] {
        assert_eq!(
            check(&tcp, service).await.unwrap().status(),
            ServingStatus::NotServing,
            "{service:?} on the healthcheck port"
        );
    }
    r.plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lost_registration_socket_makes_healthz_503_and_the_probe_not_serving() {
    let r = start(&["--healthcheck-port", "0", "--http-endpoint", "127.0.0.1:0"]).await;
    let http = r.plugin.http_addr().unwrap();
    let tcp = tcp_channel(r.plugin.healthcheck_addr().unwrap().port()).await;
    assert_eq!(http_get(http, "/healthz").await.0, 200);

    // Without its registration socket the kubelet cannot (re-)register the plugin, e.g. after
    // a kubelet restart: the plugin must be restarted.
    std::fs::remove_file(&r.plugin.socket_paths().registration).unwrap();

    let (status, _, body) = http_get(http, "/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert_contains(&body, "registration socket");
    assert_eq!(
        check(&tcp, "").await.unwrap().status(),
        ServingStatus::NotServing
    );
    r.plugin.shutdown().await.unwrap();
}

async fn check(channel: &Channel, service: &str) -> Result<HealthCheckResponse, tonic::Status> {
    let request = HealthCheckRequest {
        service: service.to_string(),
    };
    tokio::time::timeout(
        Duration::from_secs(10),
        HealthClient::new(channel.clone()).check(request),
    )
    .await
    .expect("health check answered in time")
    .map(tonic::Response::into_inner)
}

async fn tcp_channel(port: u16) -> Channel {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn unix_channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .unwrap()
}

/// A minimal HTTP/1.1 GET: status, header block, body.
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, head.to_string(), body)
}

/// Decodes a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}
