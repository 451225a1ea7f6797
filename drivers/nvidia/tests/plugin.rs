//! `gpu-kubelet-plugin` on a mock machine against the SDK's test cluster: what it publishes
//! reaches the API server as valid ResourceSlices, the DeviceClasses select by type, claims
//! written as in the public guides (CEL on productName, on the memory capacity, on the MIG
//! profile) allocate the expected devices, a GPU and its VFIO twin are never allocated
//! together, and with consumable shares a GPU is allocated to as many claims as it has
//! shares.

use dra_driver_nvidia::devices::{DRIVER_NAME, device_classes};
use dra_driver_nvidia::plugin::NvidiaPlugin;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::{NODE_NAME, NewClaim, TestCluster};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use kube::api::{Api, ListParams, PostParams};

mod fixture;

use fixture::plugin_cli;

struct Fixture {
    cluster: TestCluster,
    _plugin: dra_sdk::plugin::KubeletPlugin,
    _nvidia: NvidiaPlugin,
}

async fn start(profile: &str, gates: &str) -> Fixture {
    start_with(profile, &["--feature-gates", gates]).await
}

/// The plugin with more flags.
async fn start_with(profile: &str, flags: &[&str]) -> Fixture {
    let cli = plugin_cli(&[&["--mock-profile", profile], flags].concat());
    let nvidia = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
    let (cluster, plugin) = serve(&nvidia, nvidia.resources(NODE_NAME)).await;
    Fixture {
        cluster,
        _plugin: plugin,
        _nvidia: nvidia,
    }
}

/// A test cluster with the NVIDIA DeviceClasses, and `nvidia`'s driver serving `resources` in
/// it, published.
async fn serve(
    nvidia: &NvidiaPlugin,
    resources: dra_sdk::slices::DriverResources,
) -> (TestCluster, dra_sdk::plugin::KubeletPlugin) {
    let cluster = TestCluster::start().await.unwrap();
    let classes: Api<DeviceClass> = Api::all(cluster.client());
    for class in device_classes() {
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }
    let plugin = cluster
        .plugin(nvidia.driver.clone(), DRIVER_NAME)
        .resources(resources)
        .start()
        .await
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), plugin.published())
        .await
        .unwrap();
    (cluster, plugin)
}

impl Fixture {
    async fn published(&self) -> Vec<String> {
        let slices: Api<ResourceSlice> = Api::all(self.cluster.client());
        let mut names: Vec<String> = slices
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .flat_map(|slice| slice.spec.devices.unwrap_or_default())
            .map(|device| device.name)
            .collect();
        names.sort();
        names
    }

    /// Creates and allocates a claim of one request; the allocated device names, or the
    /// allocator's error.
    async fn allocate(
        &self,
        name: &str,
        class: &str,
        selector: Option<&str>,
    ) -> Result<Vec<String>, String> {
        Ok(self
            .allocate_results(name, class, selector)
            .await?
            .into_iter()
            .map(|result| result.device)
            .collect())
    }

    /// Asserts that the claim cannot be allocated; the allocator's reason.
    async fn refused(&self, name: &str, class: &str, selector: Option<&str>) -> String {
        match self.allocate(name, class, selector).await {
            Ok(devices) => panic!("claim {name} ({class}) got {devices:?}, expected none"),
            Err(error) => {
                assert!(!error.is_empty(), "claim {name}: an empty reason");
                error
            }
        }
    }

    /// [`allocate`](Self::allocate), with the whole allocation results.
    async fn allocate_results(
        &self,
        name: &str,
        class: &str,
        selector: Option<&str>,
    ) -> Result<Vec<DeviceRequestAllocationResult>, String> {
        let mut claim = NewClaim::new("default", name).request("req", class);
        if let Some(selector) = selector {
            claim = claim.selector(selector);
        }
        self.allocate_claim(name, claim).await
    }

    /// Creates and allocates `claim` (named `name`); its allocation results, or the
    /// allocator's error.
    async fn allocate_claim(
        &self,
        name: &str,
        claim: NewClaim,
    ) -> Result<Vec<DeviceRequestAllocationResult>, String> {
        self.cluster.create_claim(claim).await.unwrap();
        self.cluster
            .allocate("default", name)
            .await
            .map_err(|error| error.to_string())?;
        let claims: Api<ResourceClaim> = Api::namespaced(self.cluster.client(), "default");
        let claim = claims.get(name).await.unwrap();
        Ok(claim
            .status
            .and_then(|status| status.allocation)
            .and_then(|allocation| allocation.devices)
            .and_then(|devices| devices.results)
            .unwrap_or_default())
    }
}

#[tokio::test]
async fn dgx_a100_publishes_every_device() {
    let fixture = start("dgx-a100", "PassthroughSupport=true").await;
    let names = fixture.published().await;
    assert_eq!(names.len(), 5 + 14 + 5, "{names:?}");
    assert!(names.contains(&"gpu-0-mig-1g10gb-19-6".to_owned()));
    assert!(names.contains(&"gpu-vfio-7".to_owned()));
}

#[tokio::test]
async fn claims_from_the_guides_allocate_what_they_ask_for() {
    let fixture = start("dgx-a100", "").await;
    let domain = "device.attributes['gpu.nvidia.com']";
    assert_eq!(
        fixture
            .allocate(
                "by-product",
                "gpu.nvidia.com",
                Some(&format!("{domain}.productName == 'NVIDIA A100-SXM4-80GB'"))
            )
            .await
            .unwrap()
            .len(),
        1
    );
    let mig = fixture
        .allocate(
            "one-slice",
            "mig.nvidia.com",
            Some(&format!("{domain}.profile == '1g.10gb'")),
        )
        .await
        .unwrap();
    assert!(mig[0].contains("-mig-1g10gb-19-"), "{mig:?}");
    let whole = fixture
        .allocate(
            "forty-gig-gpu",
            "gpu.nvidia.com",
            Some("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"),
        )
        .await
        .unwrap();
    assert_eq!(whole.len(), 1);
    // Real "40gb" MIG profiles have 40192 MiB (39.25 GiB): asking for 40Gi finds none, as
    // on the real hardware; 39Gi finds a 3g.40gb or 4g.40gb.
    let error = fixture
        .refused(
            "forty-gig-mig",
            "mig.nvidia.com",
            Some("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"),
        )
        .await;
    assert_contains(&error, "no device matches");
    let big = fixture
        .allocate(
            "thirty-nine-gig-mig",
            "mig.nvidia.com",
            Some("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('39Gi')) >= 0"),
        )
        .await
        .unwrap();
    assert!(
        big[0].contains("3g40gb") || big[0].contains("4g40gb"),
        "{big:?}"
    );
    // The MIG class never hands out a full GPU, nor the GPU class a MIG device.
    let gpu = fixture
        .allocate("whole", "gpu.nvidia.com", None)
        .await
        .unwrap();
    assert!(!gpu[0].contains("mig"), "{gpu:?}");
}

#[tokio::test]
async fn a_gpu_and_its_vfio_twin_are_never_allocated_together() {
    let fixture = start("workstation", "PassthroughSupport=true").await;
    let vfio = fixture
        .allocate("vm", "vfio.gpu.nvidia.com", None)
        .await
        .unwrap();
    assert_eq!(vfio, ["gpu-vfio-0"]);
    fixture.refused("container", "gpu.nvidia.com", None).await;
    // The other way round on a fresh machine.
    let fixture = start("workstation", "PassthroughSupport=true").await;
    assert_eq!(
        fixture
            .allocate("container", "gpu.nvidia.com", None)
            .await
            .unwrap(),
        ["gpu-0"]
    );
    fixture.refused("vm", "vfio.gpu.nvidia.com", None).await;
}

/// With consumable shares and passthrough, the shares of a GPU charge its twin counter once,
/// for the first (as the real scheduler does): every share of the GPU is allocated, and its
/// VFIO twin none while any share is left.
#[tokio::test]
async fn shares_of_a_gpu_charge_its_twin_counter_once() {
    let fixture = start_with(
        "workstation",
        &[
            "--feature-gates",
            "PassthroughSupport=true,ConsumableShares=true",
            "--consumable-shares",
            "2",
        ],
    )
    .await;
    for name in ["first", "second"] {
        assert_eq!(
            fixture
                .allocate(name, "gpu.nvidia.com", None)
                .await
                .unwrap(),
            ["gpu-0"]
        );
    }
    fixture.refused("vm", "vfio.gpu.nvidia.com", None).await;
}

#[tokio::test]
async fn with_consumable_shares_a_gpu_is_allocated_to_as_many_claims_as_it_has_shares() {
    let fixture = start_with(
        "workstation",
        &[
            "--feature-gates",
            "ConsumableShares=true",
            "--consumable-shares",
            "2",
        ],
    )
    .await;
    let mut shares = Vec::new();
    for name in ["first", "second"] {
        let results = fixture
            .allocate_results(name, "gpu.nvidia.com", None)
            .await
            .unwrap();
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].device, "gpu-0");
        shares.push(results[0].share_id.clone().expect("a share ID"));
    }
    assert_ne!(shares[0], shares[1]);
    // Both shares of the only GPU are taken.
    fixture.refused("third", "gpu.nvidia.com", None).await;
}

/// With consumable shares a MIG device takes several claims like a GPU: every capacity besides
/// memory is published with a zero default (without a policy, each share would take all of
/// the device's multiprocessors and memory slices, and a second claim would never fit). The
/// same for a dynamic MIG partition, whose counters, charged once for all its shares, still
/// keep the full GPU away.
#[tokio::test]
async fn with_consumable_shares_mig_devices_and_partitions_take_several_claims() {
    let domain = "device.attributes['gpu.nvidia.com']";
    let flags = |gates: &'static str| ["--feature-gates", gates, "--consumable-shares", "2"];
    // Static MIG (dgx-a100: MIG devices on GPUs 0-2).
    let fixture = start_with("dgx-a100", &flags("ConsumableShares=true")).await;
    let profile = format!("{domain}.profile == '1g.10gb'");
    let mut devices = Vec::new();
    for name in ["static-1", "static-2"] {
        let results = fixture
            .allocate_results(name, "mig.nvidia.com", Some(&profile))
            .await
            .unwrap();
        assert!(results[0].share_id.is_some(), "{results:?}");
        devices.push(results[0].device.clone());
    }
    assert_eq!(devices[0], devices[1]);

    // Dynamic MIG (dgx-h100).
    let fixture = start_with("dgx-h100", &flags("DynamicMIG=true,ConsumableShares=true")).await;
    let gpu0 = fixture._nvidia.discovery.partitionable[0].info.uuid.clone();
    let partition = format!("{domain}.parentUUID == '{gpu0}' && {domain}.profile == '1g.10gb'");
    let mut devices = Vec::new();
    for name in ["first", "second", "third"] {
        devices.extend(
            fixture
                .allocate(name, "mig.nvidia.com", Some(&partition))
                .await
                .unwrap(),
        );
    }
    // Two shares per device: the third claim gets the next placement.
    assert_eq!(
        devices,
        [
            "gpu-0-mig-1g10gb-19-0",
            "gpu-0-mig-1g10gb-19-0",
            "gpu-0-mig-1g10gb-19-1"
        ]
    );
    let whole = format!("{domain}.uuid == '{gpu0}'");
    fixture
        .refused("whole", "gpu.nvidia.com", Some(&whole))
        .await;
}

/// Dynamic MIG through the test kit's allocator: the counters keep overlapping partitions
/// apart, a partition blocks the full GPU and the full GPU every partition, and a freed
/// placement is handed out again.
#[tokio::test]
async fn dynamic_mig_counters_keep_partitions_apart() {
    let fixture = start("dgx-h100", "DynamicMIG=true").await;
    let names = fixture.published().await;
    // 8 GPUs × (full GPU + 25 partitions).
    assert_eq!(names.len(), 8 * 26, "{names:?}");
    let gpu0 = fixture._nvidia.discovery.partitionable[0].info.uuid.clone();
    let domain = "device.attributes['gpu.nvidia.com']";
    let on_gpu0 = |profile: &str| {
        format!("{domain}.parentUUID == '{gpu0}' && {domain}.profile == '{profile}'")
    };
    let whole = format!("{domain}.uuid == '{gpu0}'");
    let claims: Api<ResourceClaim> = Api::namespaced(fixture.cluster.client(), "default");
    // What the resourceclaim controller does when the claim's pod is gone: the allocation
    // is cleared, which frees the counters.
    let deallocate = |name: &'static str| {
        let claims = claims.clone();
        async move {
            let mut claim = claims.get(name).await.unwrap();
            claim.status = None;
            claims
                .replace_status(name, &PostParams::default(), &claim)
                .await
                .unwrap();
        }
    };

    // The full GPU blocks every partition of it.
    assert_eq!(
        fixture
            .allocate("whole", "gpu.nvidia.com", Some(&whole))
            .await
            .unwrap(),
        ["gpu-0"]
    );
    fixture
        .refused("blocked", "mig.nvidia.com", Some(&on_gpu0("1g.10gb")))
        .await;
    deallocate("whole").await;

    // Two 3g.40gb fill the GPU's eight memory slices: nothing else fits, the full GPU
    // neither.
    assert_eq!(
        fixture
            .allocate("left", "mig.nvidia.com", Some(&on_gpu0("3g.40gb")))
            .await
            .unwrap(),
        ["gpu-0-mig-3g40gb-9-0"]
    );
    assert_eq!(
        fixture
            .allocate("right", "mig.nvidia.com", Some(&on_gpu0("3g.40gb")))
            .await
            .unwrap(),
        ["gpu-0-mig-3g40gb-9-4"]
    );
    for (name, profile) in [("small", "1g.10gb"), ("media", "1g.10gb+me")] {
        fixture
            .refused(name, "mig.nvidia.com", Some(&on_gpu0(profile)))
            .await;
    }
    fixture
        .refused("whole-again", "gpu.nvidia.com", Some(&whole))
        .await;

    // Freed slices are reused: two 2g.20gb where the left 3g.40gb was.
    deallocate("left").await;
    assert_eq!(
        fixture
            .allocate("two", "mig.nvidia.com", Some(&on_gpu0("2g.20gb")))
            .await
            .unwrap(),
        ["gpu-0-mig-2g20gb-14-0"]
    );
    assert_eq!(
        fixture
            .allocate("three", "mig.nvidia.com", Some(&on_gpu0("2g.20gb")))
            .await
            .unwrap(),
        ["gpu-0-mig-2g20gb-14-2"]
    );
    // The 2g.20gb at 4:2 overlaps the right 3g.40gb.
    fixture
        .refused("four", "mig.nvidia.com", Some(&on_gpu0("2g.20gb")))
        .await;
}

/// NVLink topology through the test kit's allocator: on the PCIe server bridged in pairs
/// (0-1, 2-3), a two-GPU claim with `matchAttribute` on `gpu.nvidia.com/nvlinkGroup` gets a
/// bridged pair even when another pair would be free GPU by GPU, and waits when no pair is
/// whole; a three-GPU claim never fits in a group.
#[tokio::test]
async fn two_gpu_claims_get_gpus_of_one_nvlink_group() {
    let fixture = start("pcie-a100-bridged", "").await;
    let gpu0 = fixture._nvidia.discovery.gpus[0].info.uuid.clone();
    let pair = |name: &str, count: u32| {
        NewClaim::new("default", name)
            .request("gpus", "gpu.nvidia.com")
            .count(count)
            .match_attribute("gpu.nvidia.com/nvlinkGroup", &[])
    };
    let devices = |results: Vec<DeviceRequestAllocationResult>| {
        let mut devices: Vec<String> = results.into_iter().map(|result| result.device).collect();
        devices.sort();
        devices
    };

    // GPU 0 taken: gpu-1 and gpu-2 are free too, but only 2-3 is a pair.
    let single = format!("device.attributes['gpu.nvidia.com'].uuid == '{gpu0}'");
    assert_eq!(
        fixture
            .allocate("single", "gpu.nvidia.com", Some(&single))
            .await
            .unwrap(),
        ["gpu-0"]
    );
    let first = fixture.allocate_claim("pair-a", pair("pair-a", 2)).await;
    assert_eq!(devices(first.unwrap()), ["gpu-2", "gpu-3"]);
    // Only gpu-1 is left of a pair.
    let error = fixture
        .allocate_claim("pair-b", pair("pair-b", 2))
        .await
        .unwrap_err();
    assert!(!error.is_empty());
    // No group has three GPUs.
    fixture
        .allocate_claim("trio", pair("trio", 3))
        .await
        .unwrap_err();
}

/// "Two GPUs on one PCIe root" is one constraint too: on the DGX A100 (GPUs 3-7 whole; 4-5
/// and 6-7 share a root complex, 3 has its own), a claim for two GPUs without a constraint
/// gets 3 and 4; then one with `matchAttribute` on `resource.kubernetes.io/pcieRoot` gets the
/// pair 6-7, not 5 with another; then, with only gpu-5 free, a claim constraining both the
/// root and the NVLink group (one group on this NVSwitch machine) gets nothing.
#[tokio::test]
async fn two_gpu_claims_get_gpus_of_one_pcie_root() {
    let fixture = start("dgx-a100", "").await;
    let claim = |name: &str, constraints: &[&str]| {
        constraints.iter().fold(
            NewClaim::new("default", name)
                .request("gpus", "gpu.nvidia.com")
                .count(2),
            |claim, attribute| claim.match_attribute(attribute, &[]),
        )
    };
    let devices = |results: Vec<DeviceRequestAllocationResult>| {
        let mut devices: Vec<String> = results.into_iter().map(|result| result.device).collect();
        devices.sort();
        devices
    };
    let any = fixture.allocate_claim("any", claim("any", &[])).await;
    assert_eq!(devices(any.unwrap()), ["gpu-3", "gpu-4"]);
    // gpu-3 and gpu-4 are taken now: the pair on one root is 6-7 (gpu-5's partner is held).
    let root = fixture
        .allocate_claim("root", claim("root", &["resource.kubernetes.io/pcieRoot"]))
        .await;
    assert_eq!(devices(root.unwrap()), ["gpu-6", "gpu-7"]);
    // Only gpu-5 is left: no pair on one root, whatever the NVLink group says.
    let both = [
        "resource.kubernetes.io/pcieRoot",
        "gpu.nvidia.com/nvlinkGroup",
    ];
    fixture
        .allocate_claim("both", claim("both", &both))
        .await
        .unwrap_err();
}

/// What reaches the API server is the same, byte for byte, whether the plugin reads the
/// machine through the mock backend or through NVML over the libnvidia-ml double: every
/// shipped profile, in the default, passthrough and dynamic-MIG layouts.
#[cfg(feature = "nvml")]
#[tokio::test]
async fn the_nvml_backend_publishes_byte_identical_slices() {
    for (profile, _) in dra_driver_nvidia::backend::mock::SHIPPED_PROFILES {
        for gates in ["", "PassthroughSupport=true", "DynamicMIG=true"] {
            let mock = published_specs(profile, gates, false).await;
            let nvml = published_specs(profile, gates, true).await;
            assert!(!mock.is_empty());
            assert_eq!(nvml, mock, "{profile} with {gates:?}");
        }
    }
}

/// The specs of the ResourceSlices the plugin publishes for `profile` (names and metadata are
/// the server's), as JSON, in a stable order.
#[cfg(feature = "nvml")]
async fn published_specs(profile: &str, gates: &str, over_nvml: bool) -> Vec<String> {
    use dra_driver_nvidia::backend::nvml::NvmlBackend;
    use dra_driver_nvidia::devices::{Discovery, DiscoveryOptions};

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("host");
    let cli = plugin_cli(&[
        "--mock-profile",
        profile,
        "--mock-host-root",
        root.to_str().unwrap(),
        "--feature-gates",
        gates,
    ]);
    let nvidia = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
    let mut double = None;
    let resources = if over_nvml {
        let loaded = nvml_mock::NvmlDouble::with_root(profile, &root).unwrap();
        let backend = NvmlBackend::open(loaded.library()).unwrap();
        let options = DiscoveryOptions::new()
            .passthrough(gates.contains("PassthroughSupport"))
            .dynamic_mig(gates.contains("DynamicMIG"));
        let discovery = Discovery::discover(&backend, nvidia.host.as_ref(), &options).unwrap();
        double = Some(loaded);
        discovery.resources(NODE_NAME)
    } else {
        nvidia.resources(NODE_NAME)
    };
    let (cluster, plugin) = serve(&nvidia, resources).await;
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    let mut specs: Vec<String> = slices
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|slice| serde_json::to_string(&slice.spec).unwrap())
        .collect();
    specs.sort();
    drop(plugin);
    drop(double);
    specs
}
