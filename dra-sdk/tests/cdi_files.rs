//! The per-claim spec writer against a real directory: names, contents, replacement, removal,
//! orphan sweeping and the files it must never touch.

mod cdi_common;

use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;
use std::time::{Duration, SystemTime};

use cdi_common::{assert_schema_valid, schema_validators};
use dra_sdk::advanced::cdi::{ClaimDevice, QualifiedName, SPEC_FILE_MODE, Spec, SpecWriter};
use dra_sdk::cdi::{CdiError, ContainerEdits, DeviceNode, Hook, HookName, Mount};

const UID_A: &str = "0b7a41f6-ccd3-4b5c-9d7a-2f3e52e6a3f1";
const UID_B: &str = "c2d4e6f8-1a3b-4c5d-8e7f-9a0b1c2d3e4f";

fn writer(root: &Path) -> SpecWriter {
    SpecWriter::new(root, "k8s.gpu.example.com/gpu".parse().unwrap())
}

fn gpu(index: u32) -> ClaimDevice {
    ClaimDevice::new(
        format!("gpu-{index}"),
        ContainerEdits::new()
            .env(format!("GPU_DEVICE_{index}"), format!("gpu-{index}"))
            .device_node(DeviceNode::new(format!("/dev/gpu{index}")).permissions("rw")),
    )
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn touch(path: &Path, contents: &str) {
    fs::write(path, contents).unwrap();
}

fn spec_of_kind(kind: &str, device: &str) -> String {
    format!(
        r#"{{"cdiVersion":"0.3.0","kind":"{kind}","devices":[{{"name":"{device}","containerEdits":{{"env":["A=1"]}}}}]}}"#
    )
}

#[test]
fn write_claim_writes_the_expected_spec_and_returns_qualified_names() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path());
    let common = ContainerEdits::new()
        .env("DRA_RESOURCE_DRIVER_NAME", "gpu.example.com")
        .hook(Hook::new(HookName::CreateContainer, "/usr/bin/gpu-hook").arg("gpu-hook"));
    let devices = [gpu(1), gpu(0)];

    let ids = writer.write_claim(UID_A, &common, &devices).unwrap();

    let expected_ids: Vec<QualifiedName> = [
        format!("k8s.gpu.example.com/gpu={UID_A}-gpu-1"),
        format!("k8s.gpu.example.com/gpu={UID_A}-gpu-0"),
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    assert_eq!(ids, expected_ids, "in the order of `devices`");
    assert_eq!(writer.device_name(UID_A, "gpu-1").unwrap(), expected_ids[0]);

    let path = dir
        .path()
        .join(format!("k8s.gpu.example.com-gpu_{UID_A}.json"));
    assert_eq!(
        names_in(dir.path()),
        [path.file_name().unwrap().to_str().unwrap()]
    );
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, SPEC_FILE_MODE);

    let document = fs::read(&path).unwrap();
    assert_schema_valid(&schema_validators(), &document, "written spec");
    let expected = format!(
        concat!(
            r#"{{"cdiVersion":"0.5.0","kind":"k8s.gpu.example.com/gpu","devices":["#,
            r#"{{"name":"{uid}-gpu-1","containerEdits":{{"env":["GPU_DEVICE_1=gpu-1"],"deviceNodes":[{{"path":"/dev/gpu1","permissions":"rw"}}]}}}},"#,
            r#"{{"name":"{uid}-gpu-0","containerEdits":{{"env":["GPU_DEVICE_0=gpu-0"],"deviceNodes":[{{"path":"/dev/gpu0","permissions":"rw"}}]}}}}],"#,
            r#""containerEdits":{{"env":["DRA_RESOURCE_DRIVER_NAME=gpu.example.com"],"hooks":[{{"hookName":"createContainer","path":"/usr/bin/gpu-hook","args":["gpu-hook"]}}]}}}}"#,
            "\n"
        ),
        uid = UID_A
    );
    assert_eq!(String::from_utf8(document).unwrap(), expected);
}

#[test]
fn empty_common_edits_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path());
    writer
        .write_claim("claim", &ContainerEdits::new(), &[gpu(0)])
        .unwrap();
    let text = fs::read_to_string(writer.spec_path("claim").unwrap()).unwrap();
    assert_eq!(text.matches("containerEdits").count(), 1, "{text}");
}

#[test]
fn rewriting_replaces_and_a_failed_write_keeps_the_old_spec() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path());
    let none = ContainerEdits::new();
    writer.write_claim(UID_A, &none, &[gpu(0), gpu(1)]).unwrap();
    writer.write_claim(UID_A, &none, &[gpu(2)]).unwrap();
    let path = writer.spec_path(UID_A).unwrap();
    let spec = Spec::read_file(&path).unwrap();
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, [format!("{UID_A}-gpu-2")]);

    let before = fs::read(&path).unwrap();
    let bad = ClaimDevice::new(
        "gpu-3",
        ContainerEdits::new().mount(Mount::new("lib", "/lib")),
    );
    let err = writer
        .write_claim(UID_A, &none, &[gpu(3), bad])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid CDI spec: device \"{UID_A}-gpu-3\": containerEdits.mounts[0].hostPath: must be an absolute path, got \"lib\" (it is the source of a bind mount)"
        )
    );
    assert_eq!(fs::read(&path).unwrap(), before);
    assert_eq!(
        names_in(dir.path()).len(),
        1,
        "no temporary file left behind"
    );
}

#[test]
fn claim_uid_and_device_name_errors() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path());
    let none = ContainerEdits::new();
    for uid in ["", "../etc", "a_b", "a.b", "-a", "a/b"] {
        assert!(matches!(
            writer.write_claim(uid, &none, &[gpu(0)]),
            Err(CdiError::InvalidClaimUid { .. })
        ));
        assert!(matches!(
            writer.remove_claim(uid),
            Err(CdiError::InvalidClaimUid { .. })
        ));
    }
    let err = writer
        .write_claim("claim", &none, &[ClaimDevice::new("gpu 0", gpu(0).edits)])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid CDI device name \"claim-gpu 0\": invalid character ' ': only ASCII letters, digits and '.', '_', '-', ':' are allowed"
    );
    assert!(names_in(dir.path()).is_empty());
}

#[test]
fn remove_claim_removes_json_and_own_yaml_only() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path());
    writer
        .write_claim(UID_A, &ContainerEdits::new(), &[gpu(0)])
        .unwrap();
    // A YAML spec of the same claim, as a Go driver of the same kind wrote it.
    let yaml = dir
        .path()
        .join(format!("k8s.gpu.example.com-gpu_{UID_A}.yaml"));
    touch(
        &yaml,
        &format!(
            "cdiVersion: 0.5.0\nkind: k8s.gpu.example.com/gpu\ndevices:\n  - name: {UID_A}-gpu-0\n    containerEdits:\n      env: [A=1]\n"
        ),
    );
    writer.remove_claim(UID_A).unwrap();
    assert!(names_in(dir.path()).is_empty());
    writer.remove_claim(UID_A).unwrap();

    // A YAML file with the same name but another kind is not ours.
    touch(&yaml, &spec_of_kind("k8s.gpu.example.com/other", "x"));
    writer.remove_claim(UID_A).unwrap();
    assert_eq!(names_in(dir.path()).len(), 1);
}

#[test]
fn orphans_are_removed_and_nothing_else_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let writer = writer(root);
    let none = ContainerEdits::new();
    writer.write_claim(UID_A, &none, &[gpu(0)]).unwrap();
    writer.write_claim(UID_B, &none, &[gpu(0)]).unwrap();
    writer.write_claim("claim-c", &none, &[gpu(0)]).unwrap();
    touch(
        &root.join("k8s.gpu.example.com-gpu_legacy.yaml"),
        &spec_of_kind("k8s.gpu.example.com/gpu", "legacy-gpu-0"),
    );

    // Everything below belongs to someone else.
    let foreign = [
        // Another kind of the same vendor, and the same claim.
        (
            format!("k8s.gpu.example.com-nic_{UID_A}.json"),
            spec_of_kind("k8s.gpu.example.com/nic", "x"),
        ),
        // A similar kind: "k8s.gpu.example.com-gpu-x_" does not start with our prefix.
        (
            format!("k8s.gpu.example.com-gpu-x_{UID_A}.json"),
            spec_of_kind("k8s.gpu.example.com/gpu-x", "x"),
        ),
        // Our exact naming pattern with another kind inside, as kinds "a-b/c" and "a/b-c" (both
        // "a-b-c_<uid>") produce.
        (
            format!("k8s.gpu.example.com-gpu_{UID_B}x.json"),
            spec_of_kind("k8s.gpu.example.com-gpu/x", "x"),
        ),
        // Names that are not claim UIDs or not spec extensions.
        (
            "k8s.gpu.example.com-gpu_common.yml".to_owned(),
            spec_of_kind("k8s.gpu.example.com/gpu", "c"),
        ),
        (
            "k8s.gpu.example.com-gpu_a_b.json".to_owned(),
            spec_of_kind("k8s.gpu.example.com/gpu", "c"),
        ),
        (
            "k8s.gpu.example.com-gpu.json".to_owned(),
            spec_of_kind("k8s.gpu.example.com/gpu", "c"),
        ),
        (
            "nvidia.com-gpu.yaml".to_owned(),
            spec_of_kind("nvidia.com/gpu", "0"),
        ),
        // Unreadable content under our exact naming pattern is left for a human.
        (
            "k8s.gpu.example.com-gpu_garbage.json".to_owned(),
            "{not json".to_owned(),
        ),
        ("README".to_owned(), "hello".to_owned()),
    ];
    for (name, contents) in &foreign {
        touch(&root.join(name), contents);
    }
    fs::create_dir(root.join(format!("k8s.gpu.example.com-gpu_{UID_A}x.json"))).unwrap();
    symlink(
        root.join("README"),
        root.join("k8s.gpu.example.com-gpu_linked.json"),
    )
    .unwrap();

    assert_eq!(
        writer.claim_uids().unwrap(),
        [UID_A, UID_B, "claim-c", "legacy"]
    );

    let removed = writer.remove_orphans(|uid| uid == UID_B).unwrap();
    assert_eq!(removed, [UID_A, "claim-c", "legacy"]);
    assert_eq!(writer.claim_uids().unwrap(), [UID_B]);

    let mut expected: Vec<String> = foreign.iter().map(|(name, _)| name.clone()).collect();
    expected.push(format!("k8s.gpu.example.com-gpu_{UID_A}x.json"));
    expected.push("k8s.gpu.example.com-gpu_linked.json".to_owned());
    expected.push(format!("k8s.gpu.example.com-gpu_{UID_B}.json"));
    expected.sort();
    assert_eq!(names_in(root), expected);
    for (name, contents) in &foreign {
        assert_eq!(
            &fs::read_to_string(root.join(name)).unwrap(),
            contents,
            "{name}"
        );
    }
}

#[test]
fn stale_temporary_files_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let writer = writer(root);
    let temp =
        |uid: &str, tag: &str| root.join(format!(".k8s.gpu.example.com=gpu_{uid}.{tag}.tmp"));
    // Left by a crash: of a claim that is gone, of a kept claim (fresh and old).
    touch(&temp(UID_A, "00000000000000a1"), "{\"cdiVersion\":");
    touch(&temp(UID_B, "00000000000000b1"), "{\"cdiVersion\":");
    touch(&temp(UID_B, "00000000000000b2"), "{\"cdiVersion\":");
    let two_minutes_ago = SystemTime::now() - Duration::from_secs(120);
    fs::File::options()
        .write(true)
        .open(temp(UID_B, "00000000000000b2"))
        .unwrap()
        .set_modified(two_minutes_ago)
        .unwrap();
    // Another kind's temporary file and another program's.
    touch(
        &root.join(format!(
            ".k8s.gpu.example.com=nic_{UID_A}.00000000000000c1.tmp"
        )),
        "x",
    );
    touch(&root.join("spec.123.tmp"), "x");

    // Temporary files are not specs.
    assert!(writer.claim_uids().unwrap().is_empty());
    assert!(
        writer
            .remove_orphans(|uid| uid == UID_B)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        names_in(root),
        [
            format!(".k8s.gpu.example.com=gpu_{UID_B}.00000000000000b1.tmp"),
            format!(".k8s.gpu.example.com=nic_{UID_A}.00000000000000c1.tmp"),
            "spec.123.tmp".to_owned(),
        ]
    );
}

#[test]
fn missing_root_is_empty_and_created_on_write() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run/cdi");
    let writer = writer(&root);
    assert!(writer.claim_uids().unwrap().is_empty());
    assert!(writer.remove_orphans(|_| false).unwrap().is_empty());
    writer.remove_claim(UID_A).unwrap();
    assert!(!root.exists());
    writer
        .write_claim(UID_A, &ContainerEdits::new(), &[gpu(0)])
        .unwrap();
    assert_eq!(writer.claim_uids().unwrap(), [UID_A]);
}

#[test]
fn io_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    // The root is a file: nothing can be created under it.
    let root = dir.path().join("not-a-dir");
    touch(&root, "");
    let writer = writer(&root);
    let err = writer
        .write_claim(UID_A, &ContainerEdits::new(), &[gpu(0)])
        .unwrap_err();
    assert!(matches!(err, CdiError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
    let err = writer.claim_uids().unwrap_err();
    assert!(err.to_string().starts_with("list CDI root"), "{err}");
}

#[test]
fn concurrent_writers_of_one_claim_leave_one_whole_spec() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path());
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let writer = &writer;
            scope.spawn(move || {
                for round in 0..50 {
                    let devices: Vec<ClaimDevice> = (0..=(thread + round) % 5).map(gpu).collect();
                    writer
                        .write_claim(UID_A, &ContainerEdits::new(), &devices)
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(names_in(dir.path()).len(), 1);
    Spec::read_file(writer.spec_path(UID_A).unwrap()).unwrap();
}
