//! The conformance suite over the SDK's own plugin runtime: a correct driver passes every case,
//! in process and as a remote target; broken drivers and plugins fail the case that covers
//! their defect, and the report names it.

use dra_sdk::health::DeviceState;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::conformance::{Case, Conformance, Outcome, Report};

use dra_sdk_testing::sample_driver::{DRIVER, EnvDriver, GpuDriver, gpus};

fn outcome(report: &Report, case: Case) -> &Outcome {
    &report
        .case(case.name())
        .unwrap_or_else(|| panic!("{case} did not run:\n{report}"))
        .outcome
}

#[tokio::test]
async fn a_correct_driver_passes_every_case_in_process() {
    let driver = GpuDriver {
        health: Some(
            (0..4)
                .map(|i| DeviceState::healthy(NODE_NAME, format!("gpu-{i}")))
                .collect(),
        ),
    };
    let report = Conformance::in_process(DRIVER, gpus(4), move || driver.clone())
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_passed();
    assert_eq!(report.cases.len(), Case::ALL.len());
    for case in &report.cases {
        assert_eq!(case.outcome, Outcome::Passed, "{}:\n{report}", case.name);
    }
    assert_eq!(report.driver, DRIVER);
    assert_eq!(report.target, "in-process");
}

#[tokio::test]
async fn a_driver_leaving_cdi_specs_behind_fails_the_cdi_case() {
    let report = Conformance::in_process_with(|cluster| {
        let driver = EnvDriver {
            leak_into: Some(cluster.cdi_root()),
            ..EnvDriver::default()
        };
        cluster.plugin(driver, DRIVER).resources(gpus(4))
    })
    .run()
    .await
    .unwrap();
    let failed: Vec<&str> = report.failures().map(|case| case.name).collect();
    assert_eq!(failed, ["cdi-specs"], "{report}");
    let Outcome::Failed(message) = outcome(&report, Case::CdiSpecs) else {
        unreachable!()
    };
    assert!(
        message.contains("still there after unprepare")
            && message.contains("leaky.example.com-gpu_"),
        "{message}"
    );
    let panic = std::panic::catch_unwind(|| report.assert_passed()).unwrap_err();
    let panic = panic.downcast_ref::<String>().unwrap();
    assert_contains(panic, "cdi-specs: spec files written by prepare");
}

#[tokio::test]
async fn a_running_plugin_passes_as_a_remote_target() {
    let running = TestCluster::start_with(GpuDriver::default(), DRIVER, gpus(4))
        .await
        .unwrap();
    let cluster = running.cluster();
    // No node name: the suite finds it in the driver's slices.
    let report = Conformance::remote(&running.plugin().socket_paths().registration)
        .client(cluster.client())
        .cdi_root(cluster.cdi_root())
        .run()
        .await
        .unwrap();
    report.assert_passed();
    for case in &report.cases {
        let expected = if case.name == Case::RestartKeepsClaims.name() {
            Outcome::Skipped("restarting the plugin needs an in-process target".into())
        } else {
            Outcome::Passed
        };
        assert_eq!(case.outcome, expected, "{}:\n{report}", case.name);
    }
    assert_eq!(
        report.target,
        running
            .plugin()
            .socket_paths()
            .registration
            .display()
            .to_string()
    );
    // The suite cleaned up: no claims, no CDI specs, its DeviceClass gone.
    let api = cluster.api();
    assert!(
        api.list::<k8s_openapi::api::resource::v1::ResourceClaim>()
            .unwrap()
            .is_empty()
    );
    let classes = api
        .list::<k8s_openapi::api::resource::v1::DeviceClass>()
        .unwrap();
    assert_eq!(classes.len(), 1, "only the one start_with created");
    assert_eq!(std::fs::read_dir(cluster.cdi_root()).unwrap().count(), 0);
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_api_access_the_claim_cases_are_skipped_with_the_reason() {
    let running = TestCluster::start_with(GpuDriver::default(), DRIVER, gpus(2))
        .await
        .unwrap();
    let report = Conformance::remote(&running.plugin().socket_paths().registration)
        .run()
        .await
        .unwrap();
    report.assert_passed();
    let passed = [
        Case::Registration,
        Case::ApiVersions,
        Case::UnprepareUnknown,
        Case::EveryClaimAnswered,
        Case::HealthStream,
    ];
    for case in Case::ALL {
        let outcome = outcome(&report, case);
        if passed.contains(&case) {
            assert_eq!(*outcome, Outcome::Passed, "{case}:\n{report}");
        } else {
            assert!(matches!(outcome, Outcome::Skipped(_)), "{case}:\n{report}");
        }
    }
    assert_eq!(
        *outcome(&report, Case::SlicesValid),
        Outcome::Skipped("no access to the API server (give a kubeconfig)".into())
    );
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_missing_socket_is_an_error_not_a_report() {
    let error = Conformance::remote("/nonexistent/dra-reg.sock")
        .run()
        .await
        .unwrap_err();
    assert!(
        error.to_string().starts_with("/nonexistent/dra-reg.sock: "),
        "{error}"
    );
}

#[tokio::test]
async fn invalid_slices_of_the_driver_fail_the_slices_case() {
    use dra_sdk_testing::apiserver::FakeApiServer;
    use k8s_openapi::api::resource::v1::ResourceSlice;

    let api = FakeApiServer::builder()
        .git_version("v1.34.3")
        .start()
        .await
        .unwrap();
    let cluster = TestCluster::start_on(api).unwrap();
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .resources(gpus(2))
        .start()
        .await
        .unwrap();
    plugin.published().await;
    // Another writer adds a pool with five taints on a device (1.34 allows four, the 1.36
    // server stores it) and a list attribute (1.36 only); the allocator never picks tainted
    // devices. (An attribute over 64 characters cannot be stored: the server refuses it.)
    let taints: Vec<_> = (0..5)
        .map(|i| serde_json::json!({ "key": format!("example.com/t{i}"), "effect": "NoSchedule" }))
        .collect();
    let slice: ResourceSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": { "name": "broken" },
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE_NAME,
            "pool": { "name": "broken", "generation": 0, "resourceSliceCount": 1 },
            "devices": [{
                "name": "gpu-9",
                "attributes": { "vlans": { "ints": [10, 20] } },
                "taints": taints,
            }],
        },
    }))
    .unwrap();
    cluster.api().insert(&slice).unwrap();

    let report = Conformance::remote(&plugin.socket_paths().registration)
        .client(cluster.client())
        .node_name(NODE_NAME)
        .cdi_root(cluster.cdi_root())
        .only(["slices-valid", "prepare-idempotent"])
        .unwrap()
        .run()
        .await
        .unwrap();
    assert_eq!(
        *outcome(&report, Case::PrepareIdempotent),
        Outcome::Passed,
        "{report}"
    );
    let Outcome::Failed(message) = outcome(&report, Case::SlicesValid) else {
        panic!("{report}");
    };
    assert!(
        message.contains(r#"pool "broken", device "gpu-9", taints: has 5 taints; at most 4 are allowed on Kubernetes 1.34"#),
        "{message}"
    );
    assert_contains(
        message,
        r#"attributes["vlans"].ints: needs Kubernetes 1.36 or newer"#,
    );
    assert_eq!(report.cases.len(), 2);
    plugin.shutdown().await.unwrap();
}

/// A DRA plugin written straight against the kubelet's gRPC API, without the SDK's runtime,
/// with one deliberate defect: what the suite exists to catch.
mod raw {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use dra_sdk::advanced::proto::{dra_v1, dra_v1beta1, pluginregistration as reg};
    use dra_sdk::tonic::{self, Request, Response, Status};
    use futures::TryStreamExt;
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use kube::Api;
    use serde_json::Value;

    use super::DRIVER;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Flaw {
        /// Every prepare returns a new CDI ID.
        NonIdempotent,
        /// Claims it cannot find get no entry in the answer.
        DropsUnknownClaims,
        /// One bad config fails every claim of the batch.
        FailsWholeBatch,
    }

    pub(super) struct Plugin {
        client: kube::Client,
        flaw: Flaw,
        prepares: AtomicUsize,
    }

    /// (request, pool, device, CDI IDs) per device, or the claim's error.
    type Outcome = Result<Vec<(String, String, String, Vec<String>)>, String>;

    impl Plugin {
        async fn prepare_one(&self, namespace: &str, name: &str, uid: &str) -> Option<Outcome> {
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
            let claim = match api.get_opt(name).await {
                Ok(Some(claim)) if claim.metadata.uid.as_deref() == Some(uid) => claim,
                Ok(_) if self.flaw == Flaw::DropsUnknownClaims => return None,
                Ok(_) => return Some(Err(format!("claim {namespace}/{name} not found"))),
                Err(error) => return Some(Err(error.to_string())),
            };
            let claim = serde_json::to_value(claim).unwrap_or_default();
            let allocation = &claim["status"]["allocation"]["devices"];
            for config in allocation["config"].as_array().into_iter().flatten() {
                if config["opaque"]["driver"] != DRIVER {
                    continue;
                }
                let parameters = &config["opaque"]["parameters"];
                if parameters["apiVersion"] != "gpu.example.com/v1"
                    || parameters["kind"] != "GpuConfig"
                {
                    return Some(Err(format!("unsupported config {parameters}")));
                }
            }
            let serial = self.prepares.fetch_add(1, Ordering::SeqCst);
            let devices = allocation["results"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|result| result["driver"] == DRIVER)
                .map(|result| {
                    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                    let cdi = match self.flaw {
                        Flaw::NonIdempotent => vec![format!("raw.example.com/gpu={uid}-{serial}")],
                        _ => Vec::new(),
                    };
                    (
                        text(&result["request"]),
                        text(&result["pool"]),
                        text(&result["device"]),
                        cdi,
                    )
                })
                .collect();
            Some(Ok(devices))
        }

        async fn prepare(&self, claims: Vec<(String, String, String)>) -> HashMap<String, Outcome> {
            let mut answers = HashMap::new();
            for (namespace, name, uid) in claims {
                if let Some(outcome) = self.prepare_one(&namespace, &name, &uid).await {
                    answers.insert(uid, outcome);
                }
            }
            if self.flaw == Flaw::FailsWholeBatch
                && let Some(error) = answers.values().find_map(|o| o.clone().err())
            {
                for outcome in answers.values_mut() {
                    *outcome = Err(error.clone());
                }
            }
            answers
        }
    }

    macro_rules! dra_service {
        ($name:ident, $pb:ident) => {
            struct $name(Arc<Plugin>);

            // v1 devices have a share ID that v1beta1 devices lack: `..Default::default()`
            // fills it in one version and is a no-op in the other.
            #[allow(clippy::needless_update)]
            #[tonic::async_trait]
            impl $pb::dra_plugin_server::DraPlugin for $name {
                async fn node_prepare_resources(
                    &self,
                    request: Request<$pb::NodePrepareResourcesRequest>,
                ) -> Result<Response<$pb::NodePrepareResourcesResponse>, Status> {
                    let claims = request
                        .into_inner()
                        .claims
                        .into_iter()
                        .map(|c| (c.namespace, c.name, c.uid))
                        .collect();
                    let claims = self
                        .0
                        .prepare(claims)
                        .await
                        .into_iter()
                        .map(|(uid, outcome)| {
                            let answer = match outcome {
                                Ok(devices) => $pb::NodePrepareResourceResponse {
                                    devices: devices
                                        .into_iter()
                                        .map(|(request, pool, device, cdi)| $pb::Device {
                                            request_names: vec![request],
                                            pool_name: pool,
                                            device_name: device,
                                            cdi_device_ids: cdi,
                                            ..Default::default()
                                        })
                                        .collect(),
                                    error: String::new(),
                                },
                                Err(error) => $pb::NodePrepareResourceResponse {
                                    devices: Vec::new(),
                                    error,
                                },
                            };
                            (uid, answer)
                        })
                        .collect();
                    Ok(Response::new($pb::NodePrepareResourcesResponse { claims }))
                }

                async fn node_unprepare_resources(
                    &self,
                    request: Request<$pb::NodeUnprepareResourcesRequest>,
                ) -> Result<Response<$pb::NodeUnprepareResourcesResponse>, Status> {
                    let claims = request
                        .into_inner()
                        .claims
                        .into_iter()
                        .map(|c| (c.uid, $pb::NodeUnprepareResourceResponse::default()))
                        .collect();
                    Ok(Response::new($pb::NodeUnprepareResourcesResponse {
                        claims,
                    }))
                }
            }
        };
    }

    dra_service!(V1, dra_v1);
    dra_service!(V1beta1, dra_v1beta1);

    struct Registration {
        endpoint: PathBuf,
    }

    #[tonic::async_trait]
    impl reg::registration_server::Registration for Registration {
        async fn get_info(
            &self,
            _: Request<reg::InfoRequest>,
        ) -> Result<Response<reg::PluginInfo>, Status> {
            Ok(Response::new(reg::PluginInfo {
                r#type: "DRAPlugin".into(),
                name: DRIVER.into(),
                endpoint: self.endpoint.display().to_string(),
                supported_versions: vec!["v1.DRAPlugin".into(), "v1beta1.DRAPlugin".into()],
            }))
        }

        async fn notify_registration_status(
            &self,
            _: Request<reg::RegistrationStatus>,
        ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
            Ok(Response::new(reg::RegistrationStatusResponse {}))
        }
    }

    /// Serves the plugin in `dir`; returns the registration socket.
    pub(super) fn serve(dir: &Path, client: kube::Client, flaw: Flaw) -> PathBuf {
        let plugin = Arc::new(Plugin {
            client,
            flaw,
            prepares: AtomicUsize::new(0),
        });
        let dra = dir.join("raw-dra.sock");
        let registration = dir.join("raw-reg.sock");
        let dra_listener = tokio::net::UnixListener::bind(&dra).unwrap();
        let registration_listener = tokio::net::UnixListener::bind(&registration).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(V1(
                    Arc::clone(&plugin),
                )))
                .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
                    V1beta1(plugin),
                ))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(
                    dra_listener,
                )),
        );
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(reg::registration_server::RegistrationServer::new(
                    Registration { endpoint: dra },
                ))
                // A stock tonic server cannot be registered by a real kubelet (nor by the
                // simulator, which sends the same percent-encoded `:authority`).
                .serve_with_incoming(
                    tokio_stream::wrappers::UnixListenerStream::new(registration_listener)
                        .map_ok(dra_sdk::advanced::AuthorityRewriteStream::new),
                ),
        );
        registration
    }
}

/// Runs the suite against a raw plugin with `flaw`, its slices published on a test cluster.
async fn run_against_raw(flaw: raw::Flaw) -> Report {
    let cluster = TestCluster::start().await.unwrap();
    let publisher = dra_sdk::advanced::slices::ResourceSlicePublisher::for_node(
        cluster.client(),
        DRIVER,
        NODE_NAME,
    )
    .spawn(gpus(4));
    publisher.synced().await;
    let socket = raw::serve(cluster.path(), cluster.client(), flaw);
    let report = Conformance::remote(&socket)
        .client(cluster.client())
        .run()
        .await
        .unwrap();
    publisher.stop().await;
    report
}

fn failure(report: &Report, case: Case) -> String {
    match outcome(report, case) {
        Outcome::Failed(message) => message.clone(),
        other => panic!("{case} should fail, it is {other:?}:\n{report}"),
    }
}

#[tokio::test]
async fn a_non_idempotent_prepare_is_caught() {
    let report = run_against_raw(raw::Flaw::NonIdempotent).await;
    let message = failure(&report, Case::PrepareIdempotent);
    assert_contains(&message, "prepare #2 of the same claim answered");
    assert!(report.case(Case::Registration.name()).unwrap().outcome == Outcome::Passed);
}

#[tokio::test]
async fn a_plugin_dropping_answers_is_caught() {
    let report = run_against_raw(raw::Flaw::DropsUnknownClaims).await;
    let message = failure(&report, Case::EveryClaimAnswered);
    assert_contains(&message, "no answer for requested claim");
    // Everything else about this plugin is right.
    let failed: Vec<&str> = report.failures().map(|c| c.name).collect();
    assert_eq!(failed, ["every-claim-answered"], "{report}");
}

#[tokio::test]
async fn a_bad_config_failing_the_whole_batch_is_caught() {
    let report = run_against_raw(raw::Flaw::FailsWholeBatch).await;
    let message = failure(&report, Case::BadConfigIsolated);
    assert_contains(
        &message,
        "the claim without config failed because of the others in its batch",
    );
    // A missing claim in a batch is one bad claim too.
    let failed: Vec<&str> = report.failures().map(|c| c.name).collect();
    assert_eq!(
        failed,
        ["every-claim-answered", "bad-config-isolated"],
        "{report}"
    );
}
