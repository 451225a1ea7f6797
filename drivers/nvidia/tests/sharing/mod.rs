//! GPU sharing through the kubelet simulator on a fake host tree: the exact commands each
//! strategy runs, the CDI edits, the checkpoint records, the reset rules when two claims
//! share a GPU, MPS daemons (a stand-in process) surviving and re-adopted across plugin
//! restarts, and the errors of bad configs.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use dra_driver_nvidia::driver::ClaimState;
use dra_driver_nvidia::host::{Host, ProcessId};
use dra_driver_nvidia::sharing::{AppliedSharing, ConsumableShares, MpsDaemonRecord, MpsSettings};
use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimRecord};
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::BOOT_ID;

use super::*;

mod mps_deployments;

/// A tool of the fixture's driver root, as the driver runs it.
fn tool(f: &Fixture, name: &str) -> String {
    f.driver_root
        .resolve(Path::new(&format!("/usr/bin/{name}")))
        .display()
        .to_string()
}

fn smi(f: &Fixture, args: &[&str]) -> HostEvent {
    HostEvent::Command(HostCommand::new(
        tool(f, "nvidia-smi"),
        args.iter().copied(),
    ))
}

fn uuid(f: &Fixture, minor: u32) -> String {
    f.inventory
        .gpus
        .iter()
        .find(|gpu| gpu.info.minor == minor)
        .unwrap()
        .info
        .uuid
        .clone()
}

fn gpu_sharing(sharing: Value) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing})
}

/// The driver state the checkpoint records for a claim.
fn recorded_state(cluster: &TestCluster, claim: &ClaimRef) -> Value {
    checkpointed(cluster)[&claim.uid]
        .driver_state
        .clone()
        .unwrap()
}

/// The claims the plugin's checkpoint records, as a restarted plugin gets them.
fn checkpointed(cluster: &TestCluster) -> BTreeMap<String, ClaimRecord> {
    let (checkpoint, _) =
        Checkpoint::open(&cluster.plugins_dir().join(DRIVER_NAME), BOOT_ID).unwrap();
    checkpoint.records().unwrap()
}

/// Unprepares `claim` through a kubelet registered with `plugin` (a restarted one).
async fn unprepare_through(cluster: &TestCluster, plugin: &KubeletPlugin, claim: &ClaimRef) {
    let kubelet = cluster
        .register(plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let result = kubelet
        .unprepare(std::slice::from_ref(claim))
        .await
        .unwrap();
    assert_eq!(result[&claim.uid], Ok(()));
}

fn mps_record(state: &Value) -> MpsDaemonRecord {
    let state = ClaimState::from_value(state).unwrap();
    match &state.sharing[..] {
        [AppliedSharing::Mps(record)] => record.clone(),
        other => panic!("not one MPS daemon: {other:?}"),
    }
}

/// A claim for `devices` (request `gpu`) with one `GpuConfig` of this `sharing`.
fn shared_gpus(name: &str, devices: &[&str], sharing: Value) -> AllocatedClaim {
    devices
        .iter()
        .fold(AllocatedClaim::new("default", name), |claim, device| {
            claim.device("gpu", DRIVER_NAME, NODE_NAME, device)
        })
        .claim_config(&["gpu"], DRIVER_NAME, gpu_sharing(sharing))
}

fn share(name: &str, device: &str, share_id: &str, config: Value) -> AllocatedClaim {
    AllocatedClaim::new("default", name)
        .result(DeviceRequestAllocationResult {
            request: "gpu".into(),
            driver: DRIVER_NAME.into(),
            pool: NODE_NAME.into(),
            device: device.into(),
            share_id: Some(share_id.into()),
            ..Default::default()
        })
        .claim_config(&["gpu"], DRIVER_NAME, config)
}

async fn prepare_one(r: &Running, claim: &ClaimRef) -> Result<(), String> {
    r.kubelet
        .prepare(std::slice::from_ref(claim))
        .await
        .unwrap()[&claim.uid]
        .clone()
        .map(|_| ())
}

async fn unprepare_one(r: &Running, claim: &ClaimRef) {
    let result = r
        .kubelet
        .unprepare(std::slice::from_ref(claim))
        .await
        .unwrap();
    assert_eq!(result[&claim.uid], Ok(()));
}

#[tokio::test]
async fn time_slicing_on_a_shared_gpu_is_reset_only_when_its_last_claim_goes() {
    let f = Fixture::new("dgx-h100");
    f.host
        .script(&tool(&f, "nvidia-smi"), [CommandOutput::ok("")]);
    let driver = f
        .builder("TimeSlicingSettings=true,ConsumableShares=true")
        .consumable_shares(ConsumableShares::Memory)
        .build();
    let r = start_driver(f, driver).await;
    let gpu = uuid(&r.f, 3);
    let long =
        gpu_sharing(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}));
    let first = r
        .claim(share("first", "gpu-3", "share-1", long.clone()))
        .await;
    let second = r.claim(share("second", "gpu-3", "share-2", long)).await;
    let short = r
        .claim(share(
            "short",
            "gpu-3",
            "share-3",
            gpu_sharing(
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}),
            ),
        ))
        .await;
    let exclusive = r
        .claim(AllocatedClaim::new("default", "exclusive").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-3",
        ))
        .await;

    prepare_one(&r, &first).await.unwrap();
    let set = [
        smi(&r.f, &["-i", &gpu, "-c", "DEFAULT"]),
        smi(
            &r.f,
            &["compute-policy", "-i", &gpu, "--set-timeslice", "3"],
        ),
    ];
    assert_eq!(r.f.host.events(), set);
    let state = recorded_state(&r.cluster, &first);
    assert_eq!(
        state["sharing"],
        json!([{"strategy": "TimeSlicing", "devices": ["gpu-3"], "gpus": [gpu], "interval": "Long"}])
    );
    assert_eq!(state["shares"][0]["device"], "gpu-3");
    assert_eq!(state["shares"][0]["shareID"], "share-1");
    assert_eq!(
        state["shares"][0]["config"]["sharing"]["timeSlicingConfig"]["interval"],
        "Long"
    );

    // The same config on the same GPU: prepared too (the commands are idempotent).
    r.f.host.clear_events();
    prepare_one(&r, &second).await.unwrap();
    assert_eq!(r.f.host.events(), set);
    let mut holders = vec![first.uid.clone(), second.uid.clone()];
    holders.sort();
    assert_eq!(r.driver.shared_devices()["gpu-3"], holders);

    // Another interval, or the GPU alone: refused, naming the holder; nothing run.
    r.f.host.clear_events();
    let error = prepare_one(&r, &short).await.unwrap_err();
    assert_contains(
        &error,
        "conflicting configuration: device gpu-3 is shared with claim default/",
    );
    assert_contains(&error, "\"interval\":\"Long\"");
    let error = prepare_one(&r, &exclusive).await.unwrap_err();
    assert_contains(
        &error,
        "device gpu-3: it is prepared as a consumable share for claim default/",
    );
    assert_eq!(r.f.host.events(), []);

    // The first claim goes: the second still uses the GPU, its time slice stays.
    unprepare_one(&r, &first).await;
    assert_eq!(r.f.host.events(), []);
    // The last one goes: back to Default.
    unprepare_one(&r, &second).await;
    assert_eq!(
        r.f.host.events(),
        [smi(
            &r.f,
            &["compute-policy", "-i", &gpu, "--set-timeslice", "0"]
        )]
    );
    assert!(r.driver.shared_devices().is_empty());
    r.shutdown().await;
}

#[tokio::test]
async fn time_slicing_needs_its_gate_and_a_failing_nvidia_smi_fails_the_claim() {
    let f = Fixture::new("dgx-h100");
    f.host.script(
        &tool(&f, "nvidia-smi"),
        [CommandOutput::failed(
            2,
            "Unable to set the compute mode for GPU: Insufficient Permissions\n",
        )],
    );
    let driver = f.driver("TimeSlicingSettings=true");
    let r = start_driver(f, driver).await;
    let gpu = uuid(&r.f, 1);
    let claim = r
        .claim(shared_gpus(
            "sliced",
            &["gpu-1"],
            json!({"strategy": "TimeSlicing"}),
        ))
        .await;
    let error = prepare_one(&r, &claim).await.unwrap_err();
    assert_contains(
        &error,
        format!(
            "device gpu-1: `{} -i {gpu} -c DEFAULT` failed (exit status 2): Unable to set the \
             compute mode for GPU: Insufficient Permissions",
            tool(&r.f, "nvidia-smi")
        ),
    );
    assert!(r.driver.prepared_devices().is_empty());
    r.shutdown().await;

    // Gate off: the claim fails naming the gate, and nothing runs.
    let r = start("dgx-h100", "").await;
    let claim = r
        .claim(shared_gpus(
            "sliced",
            &["gpu-1"],
            json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}}),
        ))
        .await;
    let error = prepare_one(&r, &claim).await.unwrap_err();
    assert_contains(
        &error,
        "\"MPS\" is selected as the GPU sharing strategy, but the \"MPSSupport\" feature \
             gate is not enabled",
    );
    assert_eq!(r.f.host.events(), []);
    r.shutdown().await;
}

/// A driver root whose `nvidia-cuda-mps-control` is a stand-in: `sh` creating the control
/// socket (a plain file) and then sleeping, as a daemon would.
fn mps_fixture(profile: &str) -> (Fixture, MpsSettings) {
    let f = Fixture::new(profile);
    let control = tool(&f, "nvidia-cuda-mps-control");
    f.host.stand_in(
        &control,
        HostCommand::new(
            "sh",
            [
                "-c",
                "touch \"$CUDA_MPS_PIPE_DIRECTORY/control\" && exec sleep 600",
            ],
        ),
    );
    for program in [tool(&f, "nvidia-smi"), control] {
        f.host.script(&program, [CommandOutput::ok("")]);
    }
    let settings = MpsSettings {
        root: f.dir.path().join("mps"),
        ready_initial: Duration::from_millis(10),
        ready_steps: 8,
        ready_cap: Duration::from_millis(200),
        stop_grace: Duration::from_millis(300),
        orphan_grace: Duration::ZERO,
        delete_timeout: Duration::from_secs(5),
    };
    (f, settings)
}

fn control(f: &Fixture, record: &MpsDaemonRecord, input: &str) -> HostEvent {
    HostEvent::Command(
        HostCommand::new(tool(f, "nvidia-cuda-mps-control"), Vec::<String>::new())
            .env(
                "CUDA_MPS_PIPE_DIRECTORY",
                record.pipe_dir().display().to_string(),
            )
            .stdin(format!("{input}\n")),
    )
}

fn wait_until_stopped(process: &ProcessId) {
    for _ in 0..300 {
        if !process.is_running() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("process {process:?} still runs");
}

#[tokio::test]
async fn an_mps_daemon_serves_its_group_survives_restarts_and_stops_at_unprepare() {
    let (f, settings) = mps_fixture("dgx-h100");
    let driver = f.builder("MPSSupport=true").mps(settings.clone()).build();
    let r = start_driver(f, driver).await;
    let (gpu2, gpu3) = (uuid(&r.f, 2), uuid(&r.f, 3));
    let claim = r
        .claim(shared_gpus(
            "mps",
            &["gpu-2", "gpu-3"],
            json!({"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"1": "2Gi"},
            }}),
        ))
        .await;
    prepare_one(&r, &claim).await.unwrap();

    let record = mps_record(&recorded_state(&r.cluster, &claim));
    assert_eq!(record.id, format!("{}-0", claim.uid));
    assert_eq!(record.dir, settings.root.join(&record.id));
    assert_eq!(record.devices, ["gpu-2", "gpu-3"]);
    assert_eq!(record.exclusive_gpus, [gpu2.clone(), gpu3.clone()]);
    assert!(record.process.is_running());
    let mount = HostEvent::MountTmpfs {
        target: record.shm_dir(),
        // The fake host has no /proc/meminfo: upstream's fallback size.
        size: "65536k".into(),
    };
    let spawn = HostEvent::Spawn(
        HostCommand::new(tool(&r.f, "nvidia-cuda-mps-control"), ["-f"])
            .env("CUDA_VISIBLE_DEVICES", format!("{gpu2},{gpu3}"))
            .env(
                "CUDA_MPS_PIPE_DIRECTORY",
                record.pipe_dir().display().to_string(),
            )
            .env(
                "CUDA_MPS_LOG_DIRECTORY",
                record.log_dir().display().to_string(),
            ),
    );
    let limits = [
        control(&r.f, &record, "set_default_active_thread_percentage 50"),
        control(
            &r.f,
            &record,
            &format!("set_default_device_pinned_mem_limit {gpu2} 10240M"),
        ),
        control(
            &r.f,
            &record,
            &format!("set_default_device_pinned_mem_limit {gpu3} 2048M"),
        ),
    ];
    let mut expected = vec![
        mount,
        smi(&r.f, &["-i", &gpu2, "-c", "EXCLUSIVE_PROCESS"]),
        smi(&r.f, &["-i", &gpu3, "-c", "EXCLUSIVE_PROCESS"]),
        spawn.clone(),
    ];
    expected.extend(limits.iter().cloned());
    assert_eq!(r.f.host.events(), expected);
    // The record is also kept next to the daemon, for a start that finds no claim for it.
    assert!(record.dir.join("daemon.json").exists());

    // Both devices get the pipe and shm directories.
    let spec = r.spec(&claim);
    for device in 0..2 {
        let edits = &spec["devices"][device]["containerEdits"];
        assert_eq!(
            edits["env"],
            json!(["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"])
        );
        let mounts: Vec<(String, String)> = edits["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                assert_eq!(m["options"], json!(["rw", "nosuid", "nodev", "bind"]));
                (
                    m["hostPath"].as_str().unwrap().to_owned(),
                    m["containerPath"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            mounts,
            [
                (
                    record.pipe_dir().display().to_string(),
                    "/tmp/nvidia-mps".to_owned()
                ),
                (
                    record.shm_dir().display().to_string(),
                    "/dev/shm".to_owned()
                ),
            ]
        );
    }

    // Restart with the daemon running: adopted, nothing started.
    let Running {
        f, cluster, plugin, ..
    } = r;
    plugin.shutdown().await.unwrap();
    assert!(
        record.process.is_running(),
        "the daemon outlives the plugin"
    );
    f.host.clear_events();
    let restart = |f: &Fixture| f.builder("MPSSupport=true").mps(settings.clone()).build();
    let driver = restart(&f);
    let plugin = cluster.plugin(driver, DRIVER_NAME).start().await.unwrap();
    assert_eq!(f.host.events(), []);
    assert_eq!(mps_record(&recorded_state(&cluster, &claim)), record);
    plugin.shutdown().await.unwrap();

    // Restart after the daemon died: started again with the same directories and limits,
    // and the checkpoint records the new process.
    f.host.signal(&record.process, true).unwrap();
    wait_until_stopped(&record.process);
    f.host.clear_events();
    let driver = restart(&f);
    let plugin = cluster
        .plugin(driver.clone(), DRIVER_NAME)
        .start()
        .await
        .unwrap();
    let restarted = mps_record(&recorded_state(&cluster, &claim));
    assert_ne!(restarted.process, record.process);
    assert!(restarted.process.is_running());
    assert_eq!(
        MpsDaemonRecord {
            process: record.process,
            ..restarted.clone()
        },
        record
    );
    let mut expected = vec![spawn];
    expected.extend(limits.iter().cloned());
    assert_eq!(f.host.events(), expected);

    // Unprepare: quit on the pipe, SIGTERM when that is not enough (the stand-in ignores
    // `quit`), tmpfs unmounted, compute modes back to DEFAULT, directories gone.
    f.host.clear_events();
    unprepare_through(&cluster, &plugin, &claim).await;
    assert_eq!(
        f.host.events(),
        [
            control(&f, &record, "quit"),
            HostEvent::Signal {
                pid: restarted.process.pid,
                force: false
            },
            HostEvent::Unmount {
                target: record.shm_dir()
            },
            smi(&f, &["-i", &gpu2, "-c", "DEFAULT"]),
            smi(&f, &["-i", &gpu3, "-c", "DEFAULT"]),
        ]
    );
    assert!(!restarted.process.is_running());
    assert!(!record.dir.exists());
    assert!(driver.prepared_devices().is_empty());
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn mps_errors_name_the_field_and_a_failed_start_leaves_nothing_behind() {
    let (f, settings) = mps_fixture("dgx-h100");
    // A daemon that exits at once.
    f.host.stand_in(
        &tool(&f, "nvidia-cuda-mps-control"),
        HostCommand::new("sh", ["-c", "sleep 0.2"]),
    );
    let driver = f.builder("MPSSupport=true").mps(settings.clone()).build();
    let r = start_driver(f, driver).await;
    let mps = |name: &str, config: Value| {
        shared_gpus(
            name,
            &["gpu-4"],
            json!({"strategy": "MPS", "mpsConfig": config}),
        )
    };
    let bad_key = r
        .claim(mps(
            "bad-key",
            json!({"defaultPerDevicePinnedMemoryLimit": {"GPU-nope": "1Gi"}}),
        ))
        .await;
    let error = prepare_one(&r, &bad_key).await.unwrap_err();
    assert!(
        error.contains(
            "GpuConfig (resource.nvidia.com/v1beta1) for gpu-4: \
             sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[GPU-nope]: \"GPU-nope\" is \
             neither the UUID nor the index of a device of this config group (devices: 0 or GPU-"
        ),
        "{error}"
    );
    let too_small = r
        .claim(mps(
            "too-small",
            json!({"defaultPinnedDeviceMemoryLimit": "512Ki"}),
        ))
        .await;
    let error = prepare_one(&r, &too_small).await.unwrap_err();
    assert_contains(
        &error,
        "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got 524288 bytes",
    );
    assert_eq!(r.f.host.events(), [], "nothing touched for a bad config");

    let dies = r.claim(mps("dies", json!({}))).await;
    let error = prepare_one(&r, &dies).await.unwrap_err();
    assert_contains(&error, "exited before it was ready");
    let gpu = uuid(&r.f, 4);
    let events = r.f.host.events();
    // Set up, then undone: the tmpfs unmounted and the compute mode reset.
    assert_eq!(
        events.last().unwrap(),
        &smi(&r.f, &["-i", &gpu, "-c", "DEFAULT"])
    );
    assert!(
        events
            .iter()
            .any(|event| matches!(event, HostEvent::Unmount { .. })),
        "{events:?}"
    );
    assert_eq!(std::fs::read_dir(&settings.root).unwrap().count(), 0);
    assert!(r.driver.prepared_devices().is_empty());
    r.shutdown().await;
}

#[tokio::test]
async fn a_daemon_no_completed_claim_owns_is_stopped_at_start() {
    let (f, settings) = mps_fixture("dgx-h100");
    let driver = f.builder("MPSSupport=true").mps(settings.clone()).build();
    let r = start_driver(f, driver).await;
    let claim = r
        .claim(shared_gpus(
            "orphan",
            &["gpu-5"],
            json!({"strategy": "MPS"}),
        ))
        .await;
    prepare_one(&r, &claim).await.unwrap();
    let record = mps_record(&recorded_state(&r.cluster, &claim));
    // As after a crash that lost the claim: a new plugin process, whose checkpoint records
    // no completed claim, finds the daemon by its record in the MPS root.
    let report =
        r.f.builder("MPSSupport=true")
            .mps(settings)
            .build()
            .reconcile_claims(Vec::new());
    assert_eq!(report.daemons_stopped, std::slice::from_ref(&record.id));
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    wait_until_stopped(&record.process);
    assert!(!record.dir.exists());
    r.shutdown().await;
}

#[tokio::test]
async fn mps_is_refused_with_consumable_shares() {
    let (f, settings) = mps_fixture("dgx-h100");
    let driver = f
        .builder("MPSSupport=true,ConsumableShares=true")
        .mps(settings)
        .consumable_shares(ConsumableShares::Unlimited)
        .build();
    let r = start_driver(f, driver).await;
    let claim = r
        .claim(share(
            "mps",
            "gpu-6",
            "s-1",
            gpu_sharing(json!({"strategy": "MPS"})),
        ))
        .await;
    let error = prepare_one(&r, &claim).await.unwrap_err();
    assert_contains(
        &error,
        "sharing.strategy: MPS cannot be used with consumable shares \
             (--consumable-shares=unlimited)",
    );
    assert_eq!(r.f.host.events(), []);
    r.shutdown().await;
}

#[tokio::test]
async fn on_mig_devices_mps_leaves_the_compute_mode_alone_and_time_slicing_does_nothing() {
    let (f, settings) = mps_fixture("dgx-a100");
    let driver = f
        .builder("MPSSupport=true,TimeSlicingSettings=true")
        .mps(settings)
        .build();
    let r = start_driver(f, driver).await;
    let parent = &r.f.inventory.gpus[0];
    let mig_name = |index: usize| {
        let mig = &parent.mig_devices[index];
        format!(
            "gpu-{}-mig-1g10gb-{}-{}",
            parent.info.minor, mig.profile_id, mig.placement.start
        )
    };
    let mig_config = |strategy: &str| {
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
               "sharing": {"strategy": strategy}})
    };
    let sliced = r
        .claim(
            AllocatedClaim::new("default", "sliced")
                .device("mig", DRIVER_NAME, NODE_NAME, &mig_name(0))
                .claim_config(&["mig"], DRIVER_NAME, mig_config("TimeSlicing")),
        )
        .await;
    prepare_one(&r, &sliced).await.unwrap();
    assert_eq!(r.f.host.events(), [], "MIG devices have no time slice");
    assert!(recorded_state(&r.cluster, &sliced).get("sharing").is_none());

    let mps = r
        .claim(
            AllocatedClaim::new("default", "mps")
                .device("mig", DRIVER_NAME, NODE_NAME, &mig_name(1))
                .claim_config(&["mig"], DRIVER_NAME, mig_config("MPS")),
        )
        .await;
    prepare_one(&r, &mps).await.unwrap();
    let record = mps_record(&recorded_state(&r.cluster, &mps));
    assert!(record.exclusive_gpus.is_empty());
    let events = r.f.host.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let HostEvent::Spawn(spawn) = &events[1] else {
        panic!("{events:?}");
    };
    assert!(spawn.env.contains(&(
        "CUDA_VISIBLE_DEVICES".to_owned(),
        parent.mig_devices[1].uuid.clone()
    )));
    r.f.host.clear_events();
    unprepare_one(&r, &mps).await;
    // quit, SIGTERM, umount: no compute mode to reset.
    assert!(
        r.f.host.events().iter().all(
            |event| !matches!(event, HostEvent::Command(c) if c.program.ends_with("nvidia-smi"))
        ),
        "{:?}",
        r.f.host.events()
    );
    assert!(!record.process.is_running());
    r.shutdown().await;
}
