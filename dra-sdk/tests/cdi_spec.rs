//! CDI spec parsing, validation and minimum versions, against the official schema and fixtures.

mod cdi_common;

use cdi_common::{assert_schema_valid, fixture_files, schema_validators};
use dra_sdk::advanced::cdi::{
    CdiDevice, CdiVersion, ClaimDevice, IntelRdt, NetDevice, Spec, SpecWriter,
};
use dra_sdk::cdi::{CdiError, ContainerEdits, DeviceNode, Hook, HookName, Kind, Mount};

#[test]
fn official_good_fixtures_parse_validate_and_round_trip() {
    let validators = schema_validators();
    for path in fixture_files("cdi-schema/schema/testdata/good") {
        let document = std::fs::read(&path).unwrap();
        assert_schema_valid(&validators, &document, &path.display().to_string());
        let spec = Spec::read_file(&path).unwrap_or_else(|err| panic!("{err}"));
        let written = spec.to_json().unwrap();
        assert_schema_valid(&validators, &written, "re-serialized fixture");
        assert_eq!(Spec::parse(&written).unwrap(), spec, "{}", path.display());
    }
}

#[test]
fn official_bad_fixtures_are_rejected() {
    let validators = schema_validators();
    for path in fixture_files("cdi-schema/schema/testdata/bad") {
        let document = std::fs::read(&path).unwrap();
        let err = Spec::read_file(&path).unwrap_err();
        assert!(matches!(err, CdiError::InFile { .. }), "{err}");
        // The schema rejects them too: not JSON at all, or missing required fields.
        if let Ok(instance) = serde_json::from_slice::<serde_json::Value>(&document) {
            for (which, validator) in &validators {
                assert!(
                    !validator.is_valid(&instance),
                    "{} passes {which}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn minimal_fixture_reads_as_expected() {
    let spec = Spec::read_file(cdi_common::fixture(
        "cdi-schema/schema/testdata/good/minimal.json",
    ))
    .unwrap();
    let expected = Spec::new("vendor.com/device".parse().unwrap()).device(CdiDevice::new(
        "myDevice",
        ContainerEdits::new().device_node(DeviceNode::new("/dev/card1")),
    ));
    assert_eq!(spec, expected);
}

#[test]
fn own_good_fixtures_parse_validate_and_match_the_schema() {
    let validators = schema_validators();
    for path in fixture_files("cdi/good") {
        let spec = Spec::read_file(&path).unwrap_or_else(|err| panic!("{err}"));
        // YAML fixtures are checked against the schema through their JSON form.
        let json = spec.to_json().unwrap();
        assert_schema_valid(&validators, &json, &path.display().to_string());
        assert_eq!(Spec::parse(&json).unwrap(), spec);
        assert_eq!(Spec::parse(&spec.to_json_pretty().unwrap()).unwrap(), spec);
    }
}

#[test]
fn nvidia_like_yaml_reads_field_by_field() {
    let spec = Spec::read_file(cdi_common::fixture("cdi/good/nvidia-like.yaml")).unwrap();
    assert_eq!(spec.kind.to_string(), "nvidia.com/gpu");
    assert_eq!(spec.minimum_version(), CdiVersion::V0_5_0);
    assert_eq!(spec.devices[0].name, "0");
    let hooks = &spec.container_edits.hooks;
    assert_eq!(hooks.len(), 3);
    assert!(
        hooks
            .iter()
            .all(|h| h.hook_name == HookName::CreateContainer
                && h.path == "/usr/bin/nvidia-cdi-hook"
                && h.env == ["NVIDIA_CTK_DEBUG=false"])
    );
    assert_eq!(hooks[1].args[2], "--host-driver-version=999.88.77");
    assert_eq!(
        spec.container_edits.mounts[0].options,
        ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    );
}

/// A 1.1.0 spec with one device `dev0` whose edits are `edits` (JSON).
fn with_device_edits(edits: &str) -> String {
    format!(
        r#"{{"cdiVersion":"1.1.0","kind":"vendor.com/class","devices":[{{"name":"dev0","containerEdits":{edits}}}]}}"#
    )
}

/// A 1.1.0 spec whose spec-level edits are `edits` (JSON) and with one valid device.
fn with_spec_edits(edits: &str) -> String {
    format!(
        r#"{{"cdiVersion":"1.1.0","kind":"vendor.com/class","containerEdits":{edits},"devices":[{{"name":"dev0","containerEdits":{{"env":["A=1"]}}}}]}}"#
    )
}

#[test]
fn bad_specs_are_rejected_naming_device_and_field() {
    let long_clos = "c".repeat(4096);
    let big_value = "v".repeat(256 * 1024);
    let cases: Vec<(String, &str)> = vec![
        // env
        (with_device_edits(r#"{"env":["FOO"]}"#), r#"device "dev0": containerEdits.env[0]: expected KEY=VALUE"#),
        (with_device_edits(r#"{"env":["A=1","=x"]}"#), r#"device "dev0": containerEdits.env[1]: expected KEY=VALUE"#),
        (with_spec_edits(r#"{"env":["FOO"]}"#), "invalid CDI spec: containerEdits.env[0]: expected KEY=VALUE"),
        // device nodes
        (with_device_edits(r#"{"deviceNodes":[{"path":""}]}"#), r#"device "dev0": containerEdits.deviceNodes[0].path: must not be empty"#),
        (with_device_edits(r#"{"deviceNodes":[{"path":"dev/x"}]}"#), r#"device "dev0": containerEdits.deviceNodes[0].path: must be an absolute path"#),
        (with_device_edits(r#"{"deviceNodes":[{"path":"/dev/x","hostPath":"x"}]}"#), "containerEdits.deviceNodes[0].hostPath: must be an absolute path"),
        (with_device_edits(r#"{"deviceNodes":[{"path":"/dev/x","permissions":"rwx"}]}"#), "containerEdits.deviceNodes[0].permissions: invalid permission 'x'"),
        (with_device_edits(r#"{"deviceNodes":[{"path":"/dev/x","permissions":"none"}]}"#), "containerEdits.deviceNodes[0].permissions"),
        (with_device_edits(r#"{"deviceNodes":[{"path":"/dev/x","type":"x"}]}"#), "devices[0].containerEdits.deviceNodes[0].type: unknown device node type"),
        (with_device_edits(r#"{"deviceNodes":[{"path":"/dev/x","uid":-1}]}"#), "devices[0].containerEdits.deviceNodes[0].uid"),
        // hooks
        (with_device_edits(r#"{"hooks":[{"hookName":"poststop","path":""}]}"#), "containerEdits.hooks[0].path: must not be empty"),
        (with_device_edits(r#"{"hooks":[{"hookName":"poststop","path":"hook"}]}"#), "containerEdits.hooks[0].path: must be an absolute path"),
        (with_device_edits(r#"{"hooks":[{"hookName":"poststop","path":"/h","env":["X"]}]}"#), "containerEdits.hooks[0].env[0]: expected KEY=VALUE"),
        (with_device_edits(r#"{"hooks":[{"hookName":"poststop","path":"/h","timeout":0}]}"#), "containerEdits.hooks[0].timeout: must be a positive number"),
        (with_device_edits(r#"{"hooks":[{"hookName":"poststop","path":"/h","timeout":-5}]}"#), "containerEdits.hooks[0].timeout: must be a positive number"),
        (with_device_edits(r#"{"hooks":[{"hookName":"poststop","path":"/h","timeout":4294967296}]}"#), "containerEdits.hooks[0].timeout: 4294967296 seconds does not fit"),
        (with_device_edits(r#"{"hooks":[{"hookName":"onStart","path":"/h"}]}"#), "devices[0].containerEdits.hooks[0].hookName"),
        // mounts
        (with_device_edits(r#"{"mounts":[{"hostPath":"","containerPath":"/x"}]}"#), "containerEdits.mounts[0].hostPath: must not be empty"),
        (with_device_edits(r#"{"mounts":[{"hostPath":"/x","containerPath":""}]}"#), "containerEdits.mounts[0].containerPath: must not be empty"),
        (with_device_edits(r#"{"mounts":[{"hostPath":"/x","containerPath":"x"}]}"#), "containerEdits.mounts[0].containerPath: must be an absolute path"),
        (with_device_edits(r#"{"mounts":[{"hostPath":"lib","containerPath":"/x"}]}"#), "containerEdits.mounts[0].hostPath: must be an absolute path, got \"lib\" (it is the source of a bind mount)"),
        (with_device_edits(r#"{"mounts":[{"hostPath":"lib","containerPath":"/x","type":"none","options":["rbind"]}]}"#), "containerEdits.mounts[0].hostPath: must be an absolute path"),
        // intelRdt
        (with_device_edits(r#"{"intelRdt":{"closID":"."}}"#), "containerEdits.intelRdt.closID: invalid class of service"),
        (with_device_edits(r#"{"intelRdt":{"closID":".."}}"#), "containerEdits.intelRdt.closID"),
        (with_device_edits(r#"{"intelRdt":{"closID":"a/b"}}"#), "containerEdits.intelRdt.closID"),
        (with_device_edits(r#"{"intelRdt":{"closID":"a\nb"}}"#), "containerEdits.intelRdt.closID"),
        (with_device_edits(&format!(r#"{{"intelRdt":{{"closID":"{long_clos}"}}}}"#)), "containerEdits.intelRdt.closID"),
        (with_device_edits(r#"{"intelRdt":{"enableMBM":true}}"#), "unknown field `enableMBM`"),
        // netDevices
        (with_device_edits(r#"{"netDevices":[{"hostInterfaceName":"","name":"n"}]}"#), "containerEdits.netDevices[0].hostInterfaceName: must not be empty"),
        (with_device_edits(r#"{"netDevices":[{"hostInterfaceName":"h","name":""}]}"#), "containerEdits.netDevices[0].name: must not be empty"),
        (with_device_edits(r#"{"netDevices":[{"hostInterfaceName":"h","name":"a"},{"hostInterfaceName":"h","name":"b"}]}"#), "containerEdits.netDevices[1].hostInterfaceName: duplicate host interface \"h\""),
        (with_device_edits(r#"{"netDevices":[{"hostInterfaceName":"g","name":"a"},{"hostInterfaceName":"h","name":"a"}]}"#), "containerEdits.netDevices[1].name: duplicate container interface \"a\""),
        // devices
        (with_device_edits("{}"), r#"device "dev0": containerEdits: a device needs at least one container edit"#),
        (with_device_edits("null"), r#"device "dev0": containerEdits: a device needs at least one container edit"#),
        (
            r#"{"cdiVersion":"0.3.0","kind":"vendor.com/class","devices":[]}"#.to_owned(),
            "devices: a spec needs at least one device",
        ),
        (
            r#"{"cdiVersion":"0.3.0","kind":"vendor.com/class","devices":[{"name":"-x","containerEdits":{"env":["A=1"]}}]}"#.to_owned(),
            r#"invalid CDI device name "-x": must start with an ASCII letter or digit"#,
        ),
        (
            r#"{"cdiVersion":"0.3.0","kind":"vendor.com/class","devices":[{"name":"x","containerEdits":{"env":["A=1"]}},{"name":"x","containerEdits":{"env":["B=1"]}}]}"#.to_owned(),
            r#"devices[1].name: duplicate device name "x""#,
        ),
        // kind
        (
            r#"{"cdiVersion":"0.3.0","kind":"1vendor.com/class","devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}"#.to_owned(),
            r#"kind: invalid CDI vendor name "1vendor.com""#,
        ),
        // annotations
        (
            r#"{"cdiVersion":"1.1.0","kind":"vendor.com/class","annotations":{"a/b/c":"x"},"devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}"#.to_owned(),
            r#"invalid CDI spec: annotations["a/b/c"]: a qualified name has at most one '/'"#,
        ),
        (
            r#"{"cdiVersion":"1.1.0","kind":"vendor.com/class","devices":[{"name":"x","annotations":{"Bad_Prefix.com/x":"1"},"containerEdits":{"env":["A=1"]}}]}"#.to_owned(),
            r#"device "x": annotations["Bad_Prefix.com/x"]: the prefix "bad_prefix.com" must be a DNS subdomain"#,
        ),
        (
            format!(r#"{{"cdiVersion":"1.1.0","kind":"vendor.com/class","devices":[{{"name":"x","annotations":{{"k":"{big_value}"}},"containerEdits":{{"env":["A=1"]}}}}]}}"#),
            r#"device "x": annotations: total size 262145 bytes exceeds the limit of 262144 bytes"#,
        ),
        (
            r#"{"cdiVersion":"1.1.0","kind":"vendor.com/class","annotations":{"k":1},"devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}"#.to_owned(),
            "annotations.k: invalid type: integer `1`, expected a string",
        ),
        // versions
        (
            r#"{"cdiVersion":"0.4.0","kind":"vendor.com/class","devices":[{"name":"x","containerEdits":{"deviceNodes":[{"path":"/dev/x","hostPath":"/dev/y"}]}}]}"#.to_owned(),
            r#"declares cdiVersion 0.4.0, but at least 0.5.0 is required: device "x" uses deviceNodes[].hostPath"#,
        ),
        (
            r#"{"cdiVersion":"0.2.0","kind":"vendor.com/class","devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}"#.to_owned(),
            "declares cdiVersion 0.2.0, but at least 0.3.0 is required",
        ),
        (
            r#"{"cdiVersion":"1.2.0","kind":"vendor.com/class","devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}"#.to_owned(),
            r#"cdiVersion: unknown CDI version "1.2.0""#,
        ),
    ];
    for (document, expected) in cases {
        let err = match Spec::parse(document.as_bytes()) {
            Ok(_) => panic!("accepted, expected {expected:?}: {document}"),
            Err(err) => err.to_string(),
        };
        assert!(err.contains(expected), "expected {expected:?} in\n  {err}");
    }
}

#[test]
fn relaxed_where_the_reference_is() {
    for edits in [
        // Typed mounts take any source.
        r#"{"mounts":[{"hostPath":"tmpfs","containerPath":"/x","type":"tmpfs"}]}"#,
        // Empty values and unusual but accepted permission strings.
        r#"{"env":["A="],"deviceNodes":[{"path":"/d","permissions":"mrwr"}]}"#,
        // The root class of service, and gid 0 (skipped by runtimes, not an error).
        r#"{"intelRdt":{"closID":"/"},"additionalGids":[0]}"#,
        // The same interface names at spec and device level are not compared.
        r#"{"netDevices":[{"hostInterfaceName":"h","name":"n"}]}"#,
        // Any major, minor, mode, uid and gid.
        r#"{"deviceNodes":[{"path":"/d","major":-1,"minor":9999999,"fileMode":4294967295,"uid":0,"gid":4294967295}]}"#,
    ] {
        let document = with_device_edits(edits);
        Spec::parse(document.as_bytes()).unwrap_or_else(|err| panic!("{edits}: {err}"));
    }
    let both_levels = with_spec_edits(r#"{"netDevices":[{"hostInterfaceName":"h","name":"n"}]}"#)
        .replace(
            r#"{"env":["A=1"]}"#,
            r#"{"netDevices":[{"hostInterfaceName":"h","name":"n"}]}"#,
        );
    Spec::parse(both_levels.as_bytes()).unwrap();
}

/// One spec per feature that raises the minimum version, with the version it needs.
fn version_cases() -> Vec<(&'static str, Spec, CdiVersion)> {
    let kind: Kind = "vendor.com/class".parse().unwrap();
    let env = || ContainerEdits::new().env("A", "1");
    let one = |edits: ContainerEdits| Spec::new(kind.clone()).device(CdiDevice::new("dev", edits));
    let spec_level = |edits: ContainerEdits| one(env()).container_edits(edits);
    vec![
        ("nothing versioned", one(env()), CdiVersion::V0_3_0),
        (
            "device nodes, hooks, uid/gid, permissions",
            one(env()
                .device_node(
                    DeviceNode::new("/dev/x")
                        .permissions("rw")
                        .file_mode(0o666)
                        .uid(1)
                        .gid(2)
                        .major(1)
                        .minor(2),
                )
                .hook(Hook::new(HookName::Prestart, "/h").env("A", "1").timeout(3))
                .mount(Mount::new("/a", "/b").option("ro"))),
            CdiVersion::V0_3_0,
        ),
        (
            "mount type",
            one(env().mount(Mount::new("tmpfs", "/b").mount_type("tmpfs"))),
            CdiVersion::V0_4_0,
        ),
        (
            "spec-level mount type",
            spec_level(ContainerEdits::new().mount(Mount::new("tmpfs", "/b").mount_type("tmpfs"))),
            CdiVersion::V0_4_0,
        ),
        (
            "device node hostPath",
            one(ContainerEdits::new().device_node(DeviceNode::new("/dev/x").host_path("/dev/y"))),
            CdiVersion::V0_5_0,
        ),
        (
            "spec-level hostPath",
            spec_level(
                ContainerEdits::new().device_node(DeviceNode::new("/dev/x").host_path("/dev/y")),
            ),
            CdiVersion::V0_5_0,
        ),
        (
            "device name starting with a digit",
            Spec::new(kind.clone()).device(CdiDevice::new("0", env())),
            CdiVersion::V0_5_0,
        ),
        (
            "spec annotations",
            one(env()).annotation("a", "b"),
            CdiVersion::V0_6_0,
        ),
        (
            "device annotations",
            Spec::new(kind.clone()).device(CdiDevice::new("dev", env()).annotation("a", "b")),
            CdiVersion::V0_6_0,
        ),
        (
            "dot in the class",
            Spec::new("vendor.com/cl.ass".parse().unwrap()).device(CdiDevice::new("dev", env())),
            CdiVersion::V0_6_0,
        ),
        (
            "empty intelRdt",
            one(ContainerEdits::new().intel_rdt(IntelRdt::new())),
            CdiVersion::V0_7_0,
        ),
        (
            "intelRdt closID",
            one(ContainerEdits::new()
                .intel_rdt(IntelRdt::new().clos_id("c").enable_monitoring(false))),
            CdiVersion::V0_7_0,
        ),
        (
            "additionalGids",
            one(ContainerEdits::new().additional_gid(44)),
            CdiVersion::V0_7_0,
        ),
        (
            "spec-level additionalGids",
            spec_level(ContainerEdits::new().additional_gid(44)),
            CdiVersion::V0_7_0,
        ),
        (
            "netDevices",
            one(ContainerEdits::new().net_device(NetDevice::new("h", "n"))),
            CdiVersion::V1_1_0,
        ),
        (
            "spec-level netDevices",
            spec_level(ContainerEdits::new().net_device(NetDevice::new("h", "n"))),
            CdiVersion::V1_1_0,
        ),
        (
            "intelRdt schemata",
            one(ContainerEdits::new().intel_rdt(IntelRdt::new().schemata(["L3:0=f"]))),
            CdiVersion::V1_1_0,
        ),
        (
            "explicitly empty intelRdt schemata",
            one(ContainerEdits::new().intel_rdt(IntelRdt::new().schemata(Vec::<String>::new()))),
            CdiVersion::V1_1_0,
        ),
        (
            "intelRdt enableMonitoring",
            one(ContainerEdits::new().intel_rdt(IntelRdt::new().enable_monitoring(true))),
            CdiVersion::V1_1_0,
        ),
        (
            "the newest feature wins",
            Spec::new(kind.clone())
                .annotation("a", "b")
                .device(CdiDevice::new(
                    "0",
                    ContainerEdits::new()
                        .mount(Mount::new("tmpfs", "/b").mount_type("tmpfs"))
                        .additional_gid(1),
                )),
            CdiVersion::V0_7_0,
        ),
    ]
}

#[test]
fn minimum_version_for_each_feature() {
    let validators = schema_validators();
    for (feature, spec, expected) in version_cases() {
        assert_eq!(spec.minimum_version(), expected, "{feature}");

        // Declaring exactly the minimum, or anything newer, is valid.
        for declared in CdiVersion::ALL.into_iter().filter(|v| *v >= expected) {
            spec.clone()
                .version(declared)
                .validate()
                .unwrap_or_else(|err| panic!("{feature} at {declared}: {err}"));
        }
        // Declaring anything lower is an error that names the requirement.
        for declared in CdiVersion::ALL.into_iter().filter(|v| *v < expected) {
            match spec.clone().version(declared).validate() {
                Err(CdiError::VersionTooLow {
                    declared: d,
                    required,
                    ..
                }) => {
                    assert_eq!(
                        (d, required),
                        (declared, expected.max(CdiVersion::EARLIEST)),
                        "{feature}"
                    );
                }
                other => panic!("{feature} declared {declared}: {other:?}"),
            }
        }

        // What set_minimum_version writes reads back with the same version and passes the schema.
        let mut written = spec.clone();
        written.set_minimum_version();
        let json = written.to_json().unwrap();
        assert!(
            String::from_utf8_lossy(&json).starts_with(&format!(r#"{{"cdiVersion":"{expected}""#))
        );
        assert_schema_valid(&validators, &json, feature);
        assert_eq!(Spec::parse(&json).unwrap(), written, "{feature}");
    }
}

#[test]
fn writer_declares_the_minimum_version() {
    let dir = tempfile::tempdir().unwrap();
    let read_version = |writer: &SpecWriter, uid: &str| {
        Spec::read_file(writer.spec_path(uid).unwrap())
            .unwrap()
            .version
    };
    let plain = SpecWriter::new(dir.path(), "vendor.com/class".parse().unwrap());
    let env = ContainerEdits::new().env("A", "1");

    plain
        .write_claim(
            "claim",
            &ContainerEdits::new(),
            &[ClaimDevice::new("dev", env.clone())],
        )
        .unwrap();
    assert_eq!(read_version(&plain, "claim"), CdiVersion::V0_3_0);
    // A UUID claim UID may start with a digit, which makes every device name start with one.
    plain
        .write_claim(
            "4b3e6c5e",
            &ContainerEdits::new(),
            &[ClaimDevice::new("dev", env.clone())],
        )
        .unwrap();
    assert_eq!(read_version(&plain, "4b3e6c5e"), CdiVersion::V0_5_0);
    // Common edits count.
    plain
        .write_claim(
            "claim",
            &ContainerEdits::new().additional_gid(5),
            &[ClaimDevice::new("dev", env.clone())],
        )
        .unwrap();
    assert_eq!(read_version(&plain, "claim"), CdiVersion::V0_7_0);
    plain
        .write_claim(
            "claim",
            &ContainerEdits::new(),
            &[ClaimDevice::new(
                "dev",
                env.clone().net_device(NetDevice::new("h", "n")),
            )],
        )
        .unwrap();
    assert_eq!(read_version(&plain, "claim"), CdiVersion::V1_1_0);

    let dotted = SpecWriter::new(dir.path(), "vendor.com/cl.ass".parse().unwrap());
    dotted
        .write_claim(
            "claim",
            &ContainerEdits::new(),
            &[ClaimDevice::new("dev", env)],
        )
        .unwrap();
    assert_eq!(read_version(&dotted, "claim"), CdiVersion::V0_6_0);
}
