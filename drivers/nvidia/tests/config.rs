//! The opaque config API `resource.nvidia.com/v1beta1`: good and bad configs, with the exact
//! messages users see in their claim's events, and the same messages from the `gpu-webhook`
//! binary at admission.

use dra_driver_nvidia::config::*;
use serde_json::{Value, json};

fn decode(parameters: Value) -> Result<NvidiaConfig, String> {
    registry()
        .decode(&parameters)
        .map_err(|error| error.to_string())
}

fn error(parameters: Value) -> String {
    match decode(parameters) {
        Ok(config) => panic!("decoded: {config:?}"),
        Err(message) => message,
    }
}

fn gpu(extra: Value) -> Value {
    with_kind("GpuConfig", extra)
}

fn mig(extra: Value) -> Value {
    with_kind("MigDeviceConfig", extra)
}

fn vfio(extra: Value) -> Value {
    with_kind("VfioDeviceConfig", extra)
}

fn with_kind(kind: &str, extra: Value) -> Value {
    let mut object = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind});
    if let (Some(object), Value::Object(extra)) = (object.as_object_mut(), extra) {
        object.extend(extra);
    }
    object
}

#[test]
fn empty_configs_decode_to_the_defaults() {
    assert_eq!(
        decode(gpu(json!({}))).unwrap(),
        NvidiaConfig::Gpu(GpuConfig { sharing: None })
    );
    assert_eq!(
        decode(mig(json!({}))).unwrap(),
        NvidiaConfig::Mig(MigDeviceConfig { sharing: None })
    );
    assert_eq!(
        decode(vfio(json!({}))).unwrap(),
        NvidiaConfig::Vfio(VfioDeviceConfig {
            iommu: Some(IommuConfig {
                backend_policy: Some(IommuBackendPolicy::LegacyOnly),
                enable_api_device: Some(false),
            }),
        })
    );
    assert_eq!(
        decode(vfio(json!({}))).unwrap(),
        NvidiaConfig::default_for(DeviceType::Vfio)
    );
}

#[test]
fn sharing_is_normalised_like_upstream() {
    let NvidiaConfig::Gpu(config) =
        decode(gpu(json!({"sharing": {"strategy": "TimeSlicing"}}))).unwrap()
    else {
        panic!("a GpuConfig")
    };
    let sharing = config.sharing.unwrap();
    assert_eq!(sharing.strategy, SharingStrategy::TimeSlicing);
    assert_eq!(
        sharing.time_slicing_config,
        Some(TimeSlicingConfig {
            interval: Some(TimeSliceInterval::Default)
        })
    );
    assert_eq!(sharing.mps_config, None);

    let NvidiaConfig::Gpu(config) = decode(gpu(json!({"sharing": {"strategy": "MPS"}}))).unwrap()
    else {
        panic!("a GpuConfig")
    };
    assert_eq!(
        config.sharing.unwrap().mps_config,
        Some(MpsConfig::default())
    );

    let NvidiaConfig::Gpu(config) = decode(gpu(json!({"sharing": {
        "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}})))
    .unwrap() else {
        panic!("a GpuConfig")
    };
    let interval = config
        .sharing
        .unwrap()
        .time_slicing_config
        .unwrap()
        .interval
        .unwrap();
    assert_eq!(interval.nvidia_smi_value(), 3);
}

#[test]
fn a_full_mps_config_decodes() {
    let config = decode(mig(json!({"sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 50,
        "defaultPinnedDeviceMemoryLimit": "10Gi",
        "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "MIG-5b1f0c2a": "2Gi"},
        "multiUser": true,
    }}})))
    .unwrap();
    let NvidiaConfig::Mig(config) = config else {
        panic!("a MigDeviceConfig")
    };
    let mps = config.sharing.unwrap().mps_config.unwrap();
    assert_eq!(mps.default_active_thread_percentage, Some(50));
    assert_eq!(
        mps.default_pinned_device_memory_limit.unwrap().bytes(),
        Some(10 << 30)
    );
    assert_eq!(mps.default_per_device_pinned_memory_limit.unwrap().len(), 2);
    assert_eq!(mps.multi_user, Some(true));
}

#[test]
fn vfio_settings_decode_with_upstream_names() {
    let config = decode(vfio(
        json!({"iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": true}}),
    ))
    .unwrap();
    let NvidiaConfig::Vfio(config) = config else {
        panic!("a VfioDeviceConfig")
    };
    assert_eq!(config.backend_policy(), IommuBackendPolicy::PreferIommuFd);
    assert!(config.enable_api_device());
}

#[test]
fn bad_configs_fail_with_exact_messages() {
    let cases = [
        (
            gpu(json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfg": {}}})),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): unknown field \
             `sharing.timeSlicingConfg` (did you mean `timeSlicingConfig`?)",
        ),
        (
            gpu(json!({"sharng": {}})),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): unknown field `sharng` \
             (did you mean `sharing`?)",
        ),
        (
            gpu(json!({"sharing": {"strategy": "SpacePartitioning"}})),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): sharing.strategy: unknown variant, \
             expected `TimeSlicing` or `MPS`",
        ),
        (
            gpu(
                json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Fast"}}}),
            ),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): sharing.timeSlicingConfig.interval: \
             unknown variant, expected one of `Default`, `Short`, `Medium`, `Long`",
        ),
        (
            gpu(json!({"sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}})),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): sharing.mpsConfig: must not be set \
             with strategy TimeSlicing",
        ),
        (
            gpu(json!({"sharing": {"strategy": "MPS", "timeSlicingConfig": {}}})),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): sharing.timeSlicingConfig: must not \
             be set with strategy MPS",
        ),
        (
            gpu(
                json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}}),
            ),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): \
             sharing.mpsConfig.defaultActiveThreadPercentage: must be between 0 and 100, got 150",
        ),
        (
            gpu(
                json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}}),
            ),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): \
             sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got 524288 bytes",
        ),
        (
            gpu(
                json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}}),
            ),
            "invalid GpuConfig (resource.nvidia.com/v1beta1): \
             sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: is not a valid quantity \
             (for example 10Gi or 512Mi)",
        ),
        (
            mig(json!({"sharing": {"strategy": "MPS", "mpsConfig": {
                "defaultPerDevicePinnedMemoryLimit": {"0": "10"}}}})),
            "invalid MigDeviceConfig (resource.nvidia.com/v1beta1): \
             sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: must be at least 1Mi, got 10 bytes",
        ),
        (
            mig(json!({"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}})),
            "invalid MigDeviceConfig (resource.nvidia.com/v1beta1): unknown field \
             `sharing.timeSlicingConfig`",
        ),
        (
            mig(json!({"sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}})),
            "invalid MigDeviceConfig (resource.nvidia.com/v1beta1): sharing.mpsConfig: must not \
             be set with strategy TimeSlicing",
        ),
        (
            vfio(json!({"iommu": {"backendPolicy": "IommuFD"}})),
            "invalid VfioDeviceConfig (resource.nvidia.com/v1beta1): iommu.backendPolicy: unknown \
             variant, expected `LegacyOnly` or `PreferIommuFD`",
        ),
        (
            vfio(json!({"iommu": {"enableApiDevice": true}})),
            "invalid VfioDeviceConfig (resource.nvidia.com/v1beta1): unknown field \
             `iommu.enableApiDevice` (did you mean `enableAPIDevice`?)",
        ),
        (
            vfio(json!({"iommu": {"enableAPIDevice": "yes"}})),
            "invalid VfioDeviceConfig (resource.nvidia.com/v1beta1): iommu.enableAPIDevice: \
             invalid type: expected a boolean, found a string",
        ),
        (
            json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}),
            "unsupported opaque config kind \"GpuConfig\" in apiVersion \"resource.nvidia.com/v1\"; \
             this driver accepts GpuConfig (resource.nvidia.com/v1beta1), MigDeviceConfig \
             (resource.nvidia.com/v1beta1), VfioDeviceConfig (resource.nvidia.com/v1beta1)",
        ),
        (
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig"}),
            "unsupported opaque config kind \"ComputeDomainChannelConfig\" in apiVersion \
             \"resource.nvidia.com/v1beta1\"; this driver accepts GpuConfig \
             (resource.nvidia.com/v1beta1), MigDeviceConfig (resource.nvidia.com/v1beta1), \
             VfioDeviceConfig (resource.nvidia.com/v1beta1)",
        ),
    ];
    for (parameters, message) in cases {
        assert_eq!(error(parameters.clone()), message, "{parameters}");
    }
}

#[test]
fn sharing_needs_its_gate_and_is_not_implemented_yet() {
    let off = FeatureGates::new();
    let on = FeatureGates::new()
        .set(FeatureGate::TimeSlicingSettings, true)
        .set(FeatureGate::MpsSupport, true);
    let time_sliced = decode(gpu(json!({"sharing": {"strategy": "TimeSlicing"}}))).unwrap();
    let mps = decode(gpu(json!({"sharing": {"strategy": "MPS"}}))).unwrap();
    let mig_time_sliced = decode(mig(json!({"sharing": {"strategy": "TimeSlicing"}}))).unwrap();
    let mig_mps = decode(mig(json!({"sharing": {"strategy": "MPS"}}))).unwrap();
    let message = |config: &NvidiaConfig, gates: &FeatureGates| {
        config
            .check_supported(gates)
            .map_err(|error| error.to_string())
    };

    assert_eq!(
        message(&time_sliced, &off),
        Err(
            "\"TimeSlicing\" is selected as the GPU sharing strategy, but the \
             \"TimeSlicingSettings\" feature gate is not enabled"
                .into()
        )
    );
    assert_eq!(
        message(&mps, &off),
        Err(
            "\"MPS\" is selected as the GPU sharing strategy, but the \"MPSSupport\" feature \
             gate is not enabled"
                .into()
        )
    );
    // With their gates on, both strategies are accepted, on GPUs and MIG devices.
    assert_eq!(message(&time_sliced, &on), Ok(()));
    assert_eq!(message(&mps, &on), Ok(()));
    assert_eq!(message(&mig_mps, &on), Ok(()));
    assert!(message(&mig_mps, &off).is_err());
    // Upstream accepts time-slicing on MIG devices and does nothing: so does this driver.
    assert_eq!(message(&mig_time_sliced, &on), Ok(()));
    assert!(message(&mig_time_sliced, &off).is_err());
    assert_eq!(
        message(&NvidiaConfig::default_for(DeviceType::Gpu), &off),
        Ok(())
    );
    assert_eq!(
        message(&NvidiaConfig::default_for(DeviceType::Vfio), &off),
        Err(
            "VfioDeviceConfig needs the \"PassthroughSupport\" feature gate, which is not \
             enabled on this node"
                .into()
        )
    );
}

#[test]
fn per_request_matching_and_the_type_check() {
    let gpu_config = decode(gpu(json!({}))).unwrap();
    let mig_config = decode(mig(json!({}))).unwrap();
    let vfio_config = decode(vfio(json!({}))).unwrap();
    let all = |config| CandidateConfig {
        config,
        names_request: false,
    };
    let named = |config| CandidateConfig {
        config,
        names_request: true,
    };

    // A GpuConfig naming the request of a MIG device: an error naming both.
    assert_eq!(
        select_config(
            DeviceType::Mig,
            "gpu-0-mig-1g10gb-19-0",
            "mig",
            &[named(&mig_config), named(&gpu_config)]
        )
        .unwrap_err()
        .to_string(),
        "GpuConfig (resource.nvidia.com/v1beta1) cannot configure MIG device \
         \"gpu-0-mig-1g10gb-19-0\" (request \"mig\"); use MigDeviceConfig \
         (resource.nvidia.com/v1beta1)"
    );
    assert_eq!(
        select_config(DeviceType::Gpu, "gpu-1", "gpu", &[named(&vfio_config)])
            .unwrap_err()
            .to_string(),
        "VfioDeviceConfig (resource.nvidia.com/v1beta1) cannot configure GPU \"gpu-1\" (request \
         \"gpu\"); use GpuConfig (resource.nvidia.com/v1beta1)"
    );
    // Without `requests`, configs of other kinds are skipped.
    assert_eq!(
        select_config(
            DeviceType::Mig,
            "gpu-0-mig-1g10gb-19-0",
            "mig",
            &[all(&mig_config), all(&gpu_config), all(&vfio_config)]
        ),
        Ok(mig_config.clone())
    );
    // A named config of the right kind beats an earlier one; nothing at all gives the default.
    assert_eq!(
        select_config(
            DeviceType::Gpu,
            "gpu-1",
            "gpu",
            &[all(&gpu_config), named(&gpu_config)]
        ),
        Ok(gpu_config.clone())
    );
    assert_eq!(
        select_config(DeviceType::Vfio, "gpu-vfio-0", "vm", &[]),
        Ok(NvidiaConfig::default_for(DeviceType::Vfio))
    );
}

#[test]
fn configs_round_trip_through_json() {
    for parameters in [
        gpu(
            json!({"sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Gi"}}}),
        ),
        mig(json!({"sharing": {"strategy": "TimeSlicing"}})),
        vfio(json!({"iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": true}})),
    ] {
        let config = decode(parameters).unwrap();
        let mut written = serde_json::to_value(&config).unwrap();
        written["apiVersion"] = json!(API_VERSION);
        assert_eq!(decode(written).unwrap(), config);
    }
}

/// `gpu-webhook` over HTTPS: a v1beta1 claim (the version older clusters serve) with a MIG
/// config whose MPS percentage is out of range, and a GPU config of another version, denied
/// with prepare's messages; the same claim with good configs allowed; SIGTERM ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_binary_refuses_configs_with_prepares_messages() {
    use dra_sdk_testing::admission::{WebhookClient, WebhookPki, review};

    let dir = tempfile::tempdir().unwrap();
    let pki = WebhookPki::create(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-webhook"))
        .env("TLS_CERT_FILE", &pki.cert_file)
        .env("TLS_KEY_FILE", &pki.key_file)
        .args(["--port", &port.to_string()])
        .spawn()
        .expect("spawn gpu-webhook");
    let client = WebhookClient::new(([127, 0, 0, 1], port).into(), pki.ca_pem());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !matches!(client.request("GET", "/readyz", None).await, Ok(r) if r.status == 200) {
        assert!(child.try_wait().unwrap().is_none(), "gpu-webhook exited");
        assert!(
            std::time::Instant::now() < deadline,
            "gpu-webhook never ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    let claim = |configs: Vec<Value>| {
        let configs: Vec<Value> = configs
            .into_iter()
            .map(|parameters| json!({ "opaque": { "driver": "gpu.nvidia.com", "parameters": parameters } }))
            .collect();
        json!({
            "apiVersion": "resource.k8s.io/v1beta1",
            "kind": "ResourceClaim",
            "metadata": { "name": "mps", "namespace": "default" },
            "spec": { "devices": {
                "requests": [{ "name": "mig", "deviceClassName": "mig.nvidia.com" }],
                "config": configs,
            } },
        })
    };
    let mps = |percentage: i64| {
        mig(
            json!({ "sharing": { "strategy": "MPS", "mpsConfig": { "defaultActiveThreadPercentage": percentage } } }),
        )
    };
    let mut old_version = gpu(json!({}));
    old_version["apiVersion"] = json!("resource.nvidia.com/v1");
    let bad = claim(vec![mps(150), old_version.clone()]);
    let answer = client.review(&review("CREATE", &bad, None)).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let expected = [
        format!(
            "spec.devices.config[0].opaque.parameters: {}",
            error(mps(150))
        ),
        format!(
            "spec.devices.config[1].opaque.parameters: {}",
            error(old_version)
        ),
    ]
    .join("; ");
    assert_eq!(answer["response"]["status"]["message"], expected.as_str());
    assert!(
        expected.contains("sharing.mpsConfig.defaultActiveThreadPercentage"),
        "{expected}"
    );

    let good = claim(vec![mps(50), gpu(json!({}))]);
    let answer = client.review(&review("CREATE", &good, None)).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
}
