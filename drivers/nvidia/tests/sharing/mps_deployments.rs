//! MPS control daemons run as Deployments (`--image-name`), on the sharing set-up of
//! `sharing.rs` and the fake API server: the Deployment the plugin creates, readiness played by
//! the test (the fake server runs no controllers), adoption and re-creation across plugin
//! restarts, deletion at unprepare, the rollback of a daemon that never gets ready, and the
//! deletion of Deployments no claim owns.

use dra_driver_nvidia::sharing::mps::{DeploymentRef, MpsDeploymentConfig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use super::*;

const NAMESPACE: &str = "nvidia-dra";
const IMAGE: &str = "registry.example.com/gpu-kubelet-plugin:1.0";

fn deployment_config() -> MpsDeploymentConfig {
    MpsDeploymentConfig::new(NAMESPACE, IMAGE)
}

/// `mps_fixture` with room for the test to play the controllers before readiness runs out.
fn deployment_fixture() -> (Fixture, MpsSettings) {
    let (f, settings) = mps_fixture("dgx-h100");
    let settings = MpsSettings {
        ready_steps: 30,
        delete_timeout: Duration::from_secs(5),
        ..settings
    };
    (f, settings)
}

fn deployments(client: &kube::Client) -> Api<Deployment> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// Plays the Deployment controller, the kubelet and the daemon for daemon `id`: waits for its
/// Deployment, reports one ready replica, makes its pod with a Ready container and creates
/// the control socket. Returns the Deployment as the plugin created it.
async fn serve_daemon(client: &kube::Client, id: &str, pipe_dir: &Path) -> Deployment {
    let api = deployments(client);
    let name = format!("mps-control-daemon-{id}");
    let mut created = None;
    for _ in 0..500 {
        if let Some(found) = api.get_opt(&name).await.unwrap() {
            created = Some(found);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let created = created.unwrap_or_else(|| panic!("no Deployment {name}"));
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"replicas": 1, "readyReplicas": 1}})),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let labels = created.spec.template.metadata.clone();
    let pod_name = format!("{name}-{}", created.metadata.uid.as_deref().unwrap());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": pod_name, "labels": labels.unwrap().labels},
        "spec": created.spec.template.spec,
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        &pod_name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Running", "containerStatuses": [{
                "name": "mps-control-daemon", "image": IMAGE, "imageID": "", "ready": true,
                "restartCount": 0, "started": true,
            }]}}),
        ),
    )
    .await
    .unwrap();
    std::fs::write(pipe_dir.join("control"), "").unwrap();
    created
}

fn env_of(deployment: &Deployment) -> BTreeMap<String, String> {
    deployment.spec.template.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_daemon_deployment_is_created_adopted_recreated_and_deleted() {
    let (f, settings) = deployment_fixture();
    let builder = |f: &Fixture| {
        f.builder("MPSSupport=true")
            .mps(settings.clone())
            .mps_deployments(deployment_config())
    };
    let driver = builder(&f).build();
    let r = start_driver(f, driver).await;
    let client = r.cluster.client();
    let (gpu2, gpu3) = (uuid(&r.f, 2), uuid(&r.f, 3));
    let claim = r
        .claim(shared_gpus(
            "mps",
            &["gpu-2", "gpu-3"],
            json!({"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
            }}),
        ))
        .await;
    let id = format!("{}-0", claim.uid);
    let dir = settings.root.join(&id);
    let pipe_dir = dir.join("pipe");
    let (prepared, created) = tokio::join!(
        prepare_one(&r, &claim),
        serve_daemon(&client, &id, &pipe_dir)
    );
    prepared.unwrap();

    // The Deployment: pinned to the node, privileged, host PID, the plugin's image, the
    // daemon in the foreground from the driver root (which has no chroot here).
    let name = format!("mps-control-daemon-{id}");
    assert_eq!(created.metadata.namespace.as_deref(), Some(NAMESPACE));
    let labels = created.metadata.labels.clone().unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "gpu-kubelet-plugin");
    assert_eq!(labels["resource.nvidia.com/mps-daemon"], id);
    assert_eq!(labels["resource.nvidia.com/mps-claim-uid"], claim.uid);
    let spec = created.spec.clone();
    assert_eq!(spec.replicas, Some(1));
    let pod = spec.template.spec.clone().unwrap();
    assert_eq!(pod.node_name.as_deref(), Some(NODE_NAME));
    assert_eq!(pod.host_pid, Some(true));
    let container = &pod.containers[0];
    assert_eq!(container.image.as_deref(), Some(IMAGE));
    assert_eq!(
        container.security_context.as_ref().unwrap().privileged,
        Some(true)
    );
    assert_eq!(
        container.command.clone().unwrap(),
        ["/driver-root/usr/bin/nvidia-cuda-mps-control", "-f"]
    );
    let pipe = dir.join("pipe").display().to_string();
    let log = dir.join("log").display().to_string();
    let shm = dir.join("shm").display().to_string();
    assert_eq!(
        env_of(&created),
        BTreeMap::from([
            ("CUDA_VISIBLE_DEVICES".to_owned(), format!("{gpu2},{gpu3}")),
            ("CUDA_MPS_PIPE_DIRECTORY".to_owned(), pipe.clone()),
            ("CUDA_MPS_LOG_DIRECTORY".to_owned(), log.clone()),
        ])
    );
    let volumes: Vec<(String, String)> = pod
        .volumes
        .unwrap()
        .into_iter()
        .map(|v| (v.name, v.host_path.unwrap().path))
        .collect();
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        volumes,
        [
            pair("driver-root", NODE_DRIVER_ROOT),
            pair("mps-pipe", &pipe),
            pair("mps-log", &log),
            pair("mps-shm", &shm),
        ]
    );
    let mounts: Vec<(String, String)> = container
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| (m.name, m.mount_path))
        .collect();
    assert_eq!(
        mounts,
        [
            pair("driver-root", "/driver-root"),
            pair("mps-pipe", &pipe),
            pair("mps-log", &log),
            pair("mps-shm", "/dev/shm"),
        ]
    );

    // The shared steps ran as with a host process; nothing was spawned on the host.
    let record = mps_record(&recorded_state(&r.cluster, &claim));
    let uid = created.metadata.uid.clone().unwrap();
    assert_eq!(
        record.deployment,
        Some(DeploymentRef {
            namespace: NAMESPACE.into(),
            name: name.clone(),
            uid: uid.clone(),
        })
    );
    assert_eq!(record.process.pid, 0);
    let limits = control(&r.f, &record, "set_default_active_thread_percentage 50");
    let events = r.f.host.events();
    assert_eq!(
        events[1..],
        [
            smi(&r.f, &["-i", &gpu2, "-c", "EXCLUSIVE_PROCESS"]),
            smi(&r.f, &["-i", &gpu3, "-c", "EXCLUSIVE_PROCESS"]),
            limits.clone(),
        ]
    );
    assert!(matches!(&events[0], HostEvent::MountTmpfs { .. }));
    let edits = &r.spec(&claim)["devices"][0]["containerEdits"];
    assert_eq!(
        edits["env"],
        json!(["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"])
    );
    assert_eq!(edits["mounts"][0]["hostPath"], pipe);

    // A new plugin over the same checkpoint: the Deployment is adopted as it is.
    let Running {
        f, cluster, plugin, ..
    } = r;
    plugin.shutdown().await.unwrap();
    f.host.clear_events();
    let restart = |f: &Fixture| builder(f).build();
    let creates = cluster.api().stats().resource("deployments").create;
    let plugin = cluster
        .plugin(restart(&f), DRIVER_NAME)
        .start()
        .await
        .unwrap();
    assert_eq!(
        cluster.api().stats().resource("deployments").create,
        creates
    );
    let api = deployments(&client);
    assert_eq!(
        api.get(&name).await.unwrap().metadata.uid,
        Some(uid.clone())
    );
    assert_eq!(mps_record(&recorded_state(&cluster, &claim)), record);
    assert_eq!(f.host.events(), []);
    plugin.shutdown().await.unwrap();

    // Deleted behind the plugin's back: the next start creates it again, sends the limits
    // again and records the new UID.
    // (With its pod, as the garbage collector would.)
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.delete(&format!("{name}-{uid}"), &DeleteParams::default())
        .await
        .unwrap();
    std::fs::remove_file(dir.join("pipe/control")).unwrap();
    let driver = restart(&f);
    let (plugin, again) = tokio::join!(
        cluster.plugin(driver.clone(), DRIVER_NAME).start(),
        serve_daemon(&client, &id, &pipe_dir)
    );
    let plugin = plugin.unwrap();
    let new_uid = again.metadata.uid.clone().unwrap();
    assert_ne!(new_uid, uid);
    let recreated = mps_record(&recorded_state(&cluster, &claim));
    assert_eq!(
        recreated.deployment.as_ref().map(|d| d.uid.clone()),
        Some(new_uid)
    );
    assert_eq!(f.host.events(), [limits]);

    // Unprepare: the Deployment is deleted and waited for, then the shared clean-up.
    f.host.clear_events();
    unprepare_through(&cluster, &plugin, &claim).await;
    assert!(api.get_opt(&name).await.unwrap().is_none());
    assert_eq!(
        f.host.events(),
        [
            HostEvent::Unmount {
                target: dir.join("shm")
            },
            smi(&f, &["-i", &gpu2, "-c", "DEFAULT"]),
            smi(&f, &["-i", &gpu3, "-c", "DEFAULT"]),
        ]
    );
    assert!(!dir.exists());
    assert!(driver.prepared_devices().is_empty());
    plugin.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_deployment_that_never_gets_ready_is_rolled_back_and_orphans_are_deleted() {
    let (f, settings) = mps_fixture("dgx-h100");
    // Deployments of this driver on this node that no claim owns (a lost record), and one of
    // another node.
    let cluster = TestCluster::start().await.unwrap();
    let api = deployments(&cluster.client());
    let orphan = |name: &str, node: &str| -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/managed-by": "gpu-kubelet-plugin",
                "resource.nvidia.com/mps-daemon": format!("{name}-0"),
            }},
            "spec": {
                "selector": {"matchLabels": {"resource.nvidia.com/mps-daemon": format!("{name}-0")}},
                "template": {
                    "metadata": {"labels": {"resource.nvidia.com/mps-daemon": format!("{name}-0")}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": IMAGE}]},
                },
            },
        }))
        .unwrap()
    };
    for (name, node) in [("lost", NODE_NAME), ("elsewhere", "node-2")] {
        api.create(&PostParams::default(), &orphan(name, node))
            .await
            .unwrap();
    }
    let driver = f
        .builder("MPSSupport=true")
        .mps(settings.clone())
        .mps_deployments(deployment_config())
        .build();
    let plugin = cluster
        .plugin(driver.clone(), DRIVER_NAME)
        .start()
        .await
        .unwrap();
    assert!(api.get_opt("lost").await.unwrap().is_none());
    assert!(api.get_opt("elsewhere").await.unwrap().is_some());
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let r = Running {
        f,
        cluster,
        driver,
        plugin,
        kubelet,
    };

    // Nobody makes the Deployment ready: the claim fails, naming what was missing, and
    // everything is undone.
    let claim = r
        .claim(shared_gpus(
            "never-ready",
            &["gpu-4"],
            json!({"strategy": "MPS"}),
        ))
        .await;
    let error = prepare_one(&r, &claim).await.unwrap_err();
    let name = format!("mps-control-daemon-{}-0", claim.uid);
    assert!(
        error.contains(&format!(
            "MPS control daemon {}-0: not ready after",
            claim.uid
        )) && error.contains(&format!(
            "Deployment {NAMESPACE}/{name} has 0 ready replicas, not 1"
        )),
        "{error}"
    );
    assert_eq!(r.cluster.api().stats().resource("deployments").create, 3);
    assert!(api.get_opt(&name).await.unwrap().is_none());
    let gpu = uuid(&r.f, 4);
    assert_eq!(
        r.f.host.events().last().unwrap(),
        &smi(&r.f, &["-i", &gpu, "-c", "DEFAULT"])
    );
    assert_eq!(std::fs::read_dir(&settings.root).unwrap().count(), 0);
    assert!(r.driver.prepared_devices().is_empty());
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_an_existing_daemon_deployment_adopts_it_or_replaces_another_spec() {
    use dra_driver_nvidia::sharing::mps::{DaemonCommand, DeploymentRunner};

    let cluster = TestCluster::start().await.unwrap();
    let runner = |image: &str| {
        DeploymentRunner::new(
            cluster.client(),
            tokio::runtime::Handle::current(),
            NODE_NAME,
            MpsDeploymentConfig::new(NAMESPACE, image),
        )
    };
    let record = daemon_record(true);
    let daemon = DaemonCommand {
        node_root: "/".into(),
        mps_control: Some("/usr/bin/nvidia-cuda-mps-control".into()),
        chroot: Some("/usr/sbin/chroot".into()),
        library_dir: None,
    };
    let (first, again, upgraded) = {
        let (old, new) = (
            runner(IMAGE),
            runner("registry.example.com/gpu-kubelet-plugin:2.0"),
        );
        tokio::task::spawn_blocking(move || {
            let create = |runner: &DeploymentRunner| {
                let desired = runner.build(&record, &daemon).unwrap();
                runner.create(&record.id, &desired).unwrap()
            };
            (create(&old), create(&old), create(&new))
        })
        .await
        .unwrap()
    };
    // The same daemon: adopted, not replaced.
    assert_eq!(again, first);
    // Another image (a plugin upgrade): deleted and created again.
    assert_ne!(upgraded.uid, first.uid);
    let stored = deployments(&cluster.client())
        .get("mps-control-daemon-uid-0")
        .await
        .unwrap();
    let container = &stored.spec.template.spec.unwrap().containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("registry.example.com/gpu-kubelet-plugin:2.0")
    );
    // Chrooted into the driver root, multi-user.
    assert_eq!(
        container.command.clone().unwrap(),
        [
            "/driver-root/usr/sbin/chroot",
            "/driver-root",
            "/usr/bin/nvidia-cuda-mps-control",
            "-f",
            "-M"
        ]
    );
    let stats = cluster.api().stats().resource("deployments");
    assert_eq!((stats.create, stats.delete), (4, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_pod_pulls_as_the_plugin_does_and_is_probed_by_the_plugins_binary() {
    use dra_driver_nvidia::sharing::mps::deployment::{IMAGE_BINARY, PROBE_SUBCOMMAND};
    use dra_driver_nvidia::sharing::mps::{DaemonCommand, DeploymentRunner, ImagePullPolicy};

    let cluster = TestCluster::start().await.unwrap();
    let config = MpsDeploymentConfig {
        image_pull_policy: Some(ImagePullPolicy::Always),
        image_pull_secrets: vec!["registry-a".into(), "registry-b".into()],
        service_account_name: Some("gpu-kubelet-plugin".into()),
        ..MpsDeploymentConfig::new(NAMESPACE, IMAGE)
    };
    let runner = DeploymentRunner::new(
        cluster.client(),
        tokio::runtime::Handle::current(),
        NODE_NAME,
        config,
    );
    let record = daemon_record(false);
    for (chroot, socket) in [
        // Chrooted: the pipe directory is mounted under the driver root.
        (
            Some("/usr/sbin/chroot"),
            "/driver-root/mps/uid-0/pipe/control",
        ),
        (None, "/mps/uid-0/pipe/control"),
    ] {
        let daemon = DaemonCommand {
            node_root: "/".into(),
            mps_control: Some("/usr/bin/nvidia-cuda-mps-control".into()),
            chroot: chroot.map(Into::into),
            library_dir: None,
        };
        let deployment = runner.build(&record, &daemon).unwrap();
        let pod = deployment.spec.template.spec.unwrap();
        let secrets: Vec<&str> = pod
            .image_pull_secrets
            .iter()
            .flatten()
            .map(|secret| secret.name.as_str())
            .collect();
        assert_eq!(secrets, ["registry-a", "registry-b"]);
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("gpu-kubelet-plugin")
        );
        let container = &pod.containers[0];
        assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
        // The probe is the plugin's own binary, at the path its image has it, checking the
        // socket where the container sees it.
        let probe = container.readiness_probe.clone().unwrap();
        assert_eq!(
            probe.exec.unwrap().command.unwrap(),
            [IMAGE_BINARY, PROBE_SUBCOMMAND, socket]
        );
        let mounts: Vec<String> = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|mount| mount.mount_path.clone())
            .collect();
        let pipe = std::path::Path::new(socket).parent().unwrap();
        assert!(
            mounts.iter().any(|m| std::path::Path::new(m) == pipe),
            "{mounts:?}"
        );
    }
}

#[test]
fn the_readiness_probe_passes_only_on_the_daemons_socket() {
    use dra_driver_nvidia::sharing::mps::deployment::PROBE_SUBCOMMAND;
    use std::process::Command;

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control");
    let probe = |path: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_gpu-kubelet-plugin"))
            .args([PROBE_SUBCOMMAND.as_ref(), path.as_os_str()])
            .output()
            .unwrap()
    };
    // Before the daemon listens: not ready, and why.
    let output = probe(&socket);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&socket.display().to_string()), "{stderr}");
    // A regular file is not the daemon's socket.
    std::fs::write(&socket, "").unwrap();
    assert_eq!(probe(&socket).status.code(), Some(1));
    std::fs::remove_file(&socket).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let output = probe(&socket);
    assert!(output.status.success(), "{output:?}");
}

/// The record of daemon `uid-0` on one GPU, as a prepare leaves it (no process: a Deployment).
fn daemon_record(multi_user: bool) -> MpsDaemonRecord {
    MpsDaemonRecord {
        id: "uid-0".into(),
        devices: vec!["gpu-0".into()],
        uuids: vec!["GPU-a".into()],
        exclusive_gpus: Vec::new(),
        process: dra_driver_nvidia::host::ProcessId {
            pid: 0,
            start_time: 0,
        },
        deployment: None,
        dir: "/mps/uid-0".into(),
        shm_mounted: true,
        multi_user,
        control_commands: Vec::new(),
    }
}
