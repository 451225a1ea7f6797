//! Property tests: name parsing against a model of the rules, and the edits builder through
//! validation, serialization, the writer and the official schema.

mod cdi_common;

use dra_sdk::advanced::cdi::{
    CdiDevice, ClaimDevice, IntelRdt, NetDevice, QualifiedName, Spec, SpecWriter,
};
use dra_sdk::cdi::{ContainerEdits, DeviceNode, DeviceNodeType, Hook, HookName, Kind, Mount};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

// ---- names ----------------------------------------------------------------------------------

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// The rules, written as "first / middle / last" character sets.
fn model_name(s: &str, first: fn(char) -> bool, middle: &str) -> bool {
    let chars: Vec<char> = s.chars().collect();
    match chars.as_slice() {
        [] => false,
        [only] => first(*only),
        [head, inner @ .., tail] => {
            first(*head)
                && is_alnum(*tail)
                && inner.iter().all(|c| is_alnum(*c) || middle.contains(*c))
        }
    }
}

fn model_vendor_or_class(s: &str) -> bool {
    model_name(s, |c| c.is_ascii_alphabetic(), "_-.")
}

fn model_device(s: &str) -> bool {
    model_name(s, is_alnum, "_-.:")
}

fn model_qualified(s: &str) -> bool {
    let Some((kind, name)) = s.split_once('=') else {
        return false;
    };
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    model_vendor_or_class(vendor) && model_vendor_or_class(class) && model_device(name)
}

const VENDOR: &str = "[A-Za-z]([A-Za-z0-9_.-]{0,12}[A-Za-z0-9])?";
const DEVICE: &str = "[A-Za-z0-9]([A-Za-z0-9_.:-]{0,12}[A-Za-z0-9])?";
/// Strings close to names: the valid characters, the separators and a few invalid ones.
const NAMEISH: &str = "[a-zA-Z0-9_.:=/ é-]{0,14}";

proptest! {
    #[test]
    fn valid_names_round_trip(vendor in VENDOR, class in VENDOR, device in DEVICE) {
        let kind = Kind::new(&vendor, &class).unwrap();
        prop_assert_eq!(kind.to_string(), format!("{vendor}/{class}"));
        prop_assert_eq!(kind.to_string().parse::<Kind>().unwrap(), kind.clone());

        let text = format!("{vendor}/{class}={device}");
        let name: QualifiedName = text.parse().unwrap();
        prop_assert_eq!((name.vendor(), name.class(), name.name()), (vendor.as_str(), class.as_str(), device.as_str()));
        prop_assert_eq!(name.to_string(), text);
        prop_assert_eq!(kind.device(&device).unwrap(), name.clone());
        let json = serde_json::to_string(&name).unwrap();
        prop_assert_eq!(serde_json::from_str::<QualifiedName>(&json).unwrap(), name);
    }

    #[test]
    fn name_parsing_matches_the_model(s in NAMEISH) {
        prop_assert_eq!(dra_sdk::advanced::cdi::validate_vendor_name(&s).is_ok(), model_vendor_or_class(&s));
        prop_assert_eq!(dra_sdk::advanced::cdi::validate_device_name(&s).is_ok(), model_device(&s));
        match s.parse::<QualifiedName>() {
            Ok(name) => {
                prop_assert!(model_qualified(&s));
                prop_assert_eq!(name.to_string(), s.clone());
            }
            Err(_) => prop_assert!(!model_qualified(&s)),
        }
        if let Ok(kind) = s.parse::<Kind>() {
            prop_assert_eq!(kind.to_string(), s);
        }
    }

    #[test]
    fn composed_names_match_the_model(vendor in NAMEISH, class in NAMEISH, device in NAMEISH) {
        let text = format!("{vendor}/{class}={device}");
        prop_assert_eq!(text.parse::<QualifiedName>().is_ok(), model_qualified(&text));
    }

    #[test]
    fn arbitrary_text_never_panics(s in any::<String>()) {
        let _ = s.parse::<QualifiedName>();
        let _ = s.parse::<Kind>();
        let _ = Spec::parse(s.as_bytes());
    }
}

// ---- builder --------------------------------------------------------------------------------

/// One builder call, with a flag saying whether the rules allow it.
#[derive(Clone, Debug)]
enum Op {
    Env(String, String),
    Node {
        path: String,
        host_path: Option<String>,
        device_type: Option<DeviceNodeType>,
        permissions: String,
        numbers: Option<(i64, i64, u32, u32, u32)>,
    },
    Mount {
        host_path: String,
        container_path: String,
        mount_type: String,
        options: Vec<String>,
    },
    Hook {
        name: HookName,
        path: String,
        args: Vec<String>,
        env: Option<(String, String)>,
        timeout: Option<u32>,
    },
    Gid(u32),
    Net,
    Rdt {
        clos_id: String,
        schemata: Option<Vec<String>>,
        monitoring: bool,
    },
}

fn path() -> impl Strategy<Value = String> {
    // Mostly absolute; sometimes relative or empty, which the rules reject.
    prop_oneof![
        8 => "/[a-z0-9/._-]{0,20}",
        1 => "[a-z][a-z0-9/]{0,8}",
        1 => Just(String::new()),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let hook_name = prop_oneof![
        Just(HookName::Prestart),
        Just(HookName::CreateRuntime),
        Just(HookName::CreateContainer),
        Just(HookName::StartContainer),
        Just(HookName::Poststart),
        Just(HookName::Poststop),
    ];
    let device_type = prop_oneof![
        Just(DeviceNodeType::Block),
        Just(DeviceNodeType::Char),
        Just(DeviceNodeType::Unbuffered),
        Just(DeviceNodeType::Fifo),
    ];
    prop_oneof![
        // Keys may be empty or hold '=' (which the rule only catches at index 0).
        ("[A-Z_]{0,6}", "[ -~]{0,12}").prop_map(|(k, v)| Op::Env(k, v)),
        (
            path(),
            proptest::option::of(path()),
            proptest::option::of(device_type),
            prop_oneof![8 => "[rwm]{0,3}", 1 => "[rwxn]{1,4}"],
            proptest::option::of(any::<(i64, i64, u32, u32, u32)>()),
        )
            .prop_map(
                |(path, host_path, device_type, permissions, numbers)| Op::Node {
                    path,
                    host_path,
                    device_type,
                    permissions,
                    numbers,
                }
            ),
        (
            prop_oneof![3 => path(), 1 => Just("tmpfs".to_owned())],
            path(),
            prop_oneof![
                Just(String::new()),
                Just("tmpfs".to_owned()),
                Just("bind".to_owned())
            ],
            proptest::collection::vec(prop_oneof![Just("ro"), Just("rbind"), Just("nosuid")], 0..3)
                .prop_map(|o| o.into_iter().map(str::to_owned).collect()),
        )
            .prop_map(
                |(host_path, container_path, mount_type, options)| Op::Mount {
                    host_path,
                    container_path,
                    mount_type,
                    options,
                }
            ),
        (
            hook_name,
            path(),
            proptest::collection::vec("[a-z-]{1,8}", 0..3),
            proptest::option::of(("[A-Z]{0,3}", "[a-z]{0,3}")),
            proptest::option::of(0u32..5),
        )
            .prop_map(|(name, path, args, env, timeout)| Op::Hook {
                name,
                path,
                args,
                env,
                timeout
            }),
        any::<u32>().prop_map(Op::Gid),
        Just(Op::Net),
        (
            prop_oneof![
                Just(String::new()),
                Just("/".to_owned()),
                Just("..".to_owned()),
                "[a-z]{1,6}",
                Just("a/b".to_owned())
            ],
            proptest::option::of(proptest::collection::vec("L3:0=[0-9a-f]{1,4}", 0..2)),
            any::<bool>(),
        )
            .prop_map(|(clos_id, schemata, monitoring)| Op::Rdt {
                clos_id,
                schemata,
                monitoring
            }),
    ]
}

fn absolute(p: &str) -> bool {
    p.starts_with('/')
}

/// Whether the rules accept the op (net device names are unique by construction).
fn op_is_valid(op: &Op) -> bool {
    match op {
        Op::Env(key, _) => !key.is_empty(),
        Op::Node {
            path,
            host_path,
            permissions,
            ..
        } => {
            absolute(path)
                && host_path
                    .as_deref()
                    .is_none_or(|h| h.is_empty() || absolute(h))
                && permissions.chars().all(|c| "rwm".contains(c))
        }
        Op::Mount {
            host_path,
            container_path,
            mount_type,
            options,
        } => {
            let bind = matches!(mount_type.as_str(), "" | "bind")
                || options.iter().any(|o| o == "bind" || o == "rbind");
            !host_path.is_empty() && absolute(container_path) && (!bind || absolute(host_path))
        }
        Op::Hook {
            path, env, timeout, ..
        } => {
            absolute(path)
                && env.as_ref().is_none_or(|(k, _)| !k.is_empty())
                && timeout.is_none_or(|t| t > 0)
        }
        Op::Gid(_) | Op::Net => true,
        Op::Rdt { clos_id, .. } => !matches!(clos_id.as_str(), ".." | "a/b"),
    }
}

fn build(ops: &[Op]) -> ContainerEdits {
    let mut edits = ContainerEdits::new();
    for (index, op) in ops.iter().enumerate() {
        edits = match op.clone() {
            Op::Env(key, value) => edits.env(key, value),
            Op::Node {
                path,
                host_path,
                device_type,
                permissions,
                numbers,
            } => {
                let mut node = DeviceNode::new(path).permissions(permissions);
                if let Some(host_path) = host_path {
                    node = node.host_path(host_path);
                }
                if let Some(device_type) = device_type {
                    node = node.device_type(device_type);
                }
                if let Some((major, minor, mode, uid, gid)) = numbers {
                    node = node
                        .major(major)
                        .minor(minor)
                        .file_mode(mode)
                        .uid(uid)
                        .gid(gid);
                }
                edits.device_node(node)
            }
            Op::Mount {
                host_path,
                container_path,
                mount_type,
                options,
            } => edits.mount(
                Mount::new(host_path, container_path)
                    .mount_type(mount_type)
                    .options(options),
            ),
            Op::Hook {
                name,
                path,
                args,
                env,
                timeout,
            } => {
                let mut hook = Hook::new(name, path).args(args);
                if let Some((key, value)) = env {
                    hook = hook.env(key, value);
                }
                if let Some(timeout) = timeout {
                    hook = hook.timeout(timeout);
                }
                edits.hook(hook)
            }
            Op::Gid(gid) => edits.additional_gid(gid),
            Op::Net => {
                edits.net_device(NetDevice::new(format!("eth{index}"), format!("net{index}")))
            }
            Op::Rdt {
                clos_id,
                schemata,
                monitoring,
            } => {
                let mut rdt = IntelRdt::new()
                    .clos_id(clos_id)
                    .enable_monitoring(monitoring);
                if let Some(schemata) = schemata {
                    rdt = rdt.schemata(schemata);
                }
                edits.intel_rdt(rdt)
            }
        };
    }
    edits
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 0..8)
}

/// Whether the ops pass validation: only the last Intel RDT setting counts, as the builder
/// replaces earlier ones.
fn ops_are_valid(ops: &[Op]) -> bool {
    let last_rdt = ops.iter().rposition(|op| matches!(op, Op::Rdt { .. }));
    ops.iter()
        .enumerate()
        .filter(|(index, op)| !matches!(op, Op::Rdt { .. }) || Some(*index) == last_rdt)
        .all(|(_, op)| op_is_valid(op))
}

proptest! {
    #[test]
    fn validation_matches_the_model(ops in ops()) {
        let edits = build(&ops);
        let result = edits.validate();
        prop_assert_eq!(result.is_ok(), ops_are_valid(&ops), "{:?}", result);
    }

    #[test]
    fn builder_output_round_trips_through_json(ops in ops()) {
        let edits = build(&ops);
        let json = serde_json::to_vec(&edits).unwrap();
        prop_assert_eq!(serde_json::from_slice::<ContainerEdits>(&json).unwrap(), edits.clone());
        let device = CdiDevice::new("d", edits);
        let spec = Spec::new("vendor.com/class".parse().unwrap()).device(device);
        let reparsed = Spec::parse_unvalidated(&spec.to_json().unwrap()).unwrap();
        prop_assert_eq!(reparsed, spec);
    }

    #[test]
    fn env_splits_back_into_key_and_value(key in "[A-Za-z_][A-Za-z0-9_]{0,10}", value in "[ -~]{0,16}") {
        let edits = ContainerEdits::new().env(&key, &value);
        prop_assert_eq!(edits.env[0].split_once('='), Some((key.as_str(), value.as_str())));
        prop_assert!(edits.validate().is_ok());
    }

    #[test]
    fn merging_never_lowers_the_minimum_version(a in ops(), b in ops()) {
        let kind: Kind = "vendor.com/class".parse().unwrap();
        let version = |edits: ContainerEdits| Spec::new(kind.clone()).device(CdiDevice::new("d", edits)).minimum_version();
        let (ea, eb) = (build(&a), build(&b));
        // Intel RDT settings are replaced, not merged: `a`'s would be lost.
        prop_assume!(ea.intel_rdt.is_none() || eb.intel_rdt.is_none());
        let merged = version(ea.clone().merge(eb.clone()));
        prop_assert!(merged >= version(ea));
        prop_assert!(merged >= version(eb));
    }
}

#[test]
fn valid_builder_output_is_written_read_back_and_matches_the_schema() {
    let validators = cdi_common::schema_validators();
    let dir = tempfile::tempdir().unwrap();
    let writer = SpecWriter::new(dir.path(), "vendor.com/class".parse().unwrap());
    let strategy = (ops(), ops())
        .prop_filter("valid, non-empty device edits", |(common, device)| {
            ops_are_valid(common) && ops_are_valid(device) && !device.is_empty()
        });
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    runner
        .run(&strategy, |(common_ops, device_ops)| {
            let (common, edits) = (build(&common_ops), build(&device_ops));
            let ids = writer
                .write_claim("claim", &common, &[ClaimDevice::new("dev", edits.clone())])
                .map_err(|err| TestCaseError::fail(err.to_string()))?;
            prop_assert_eq!(ids[0].to_string(), "vendor.com/class=claim-dev");

            let path = writer.spec_path("claim").unwrap();
            let document = std::fs::read(&path).unwrap();
            cdi_common::assert_schema_valid(&validators, &document, "written spec");
            let spec =
                Spec::parse(&document).map_err(|err| TestCaseError::fail(err.to_string()))?;
            prop_assert_eq!(&spec.devices[0].container_edits, &edits);
            prop_assert_eq!(&spec.container_edits, &common);
            prop_assert_eq!(spec.version, spec.minimum_version());
            Ok(())
        })
        .unwrap();
}
