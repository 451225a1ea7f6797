//! Property tests: name parsing against a model of the rules, the edits builder through
//! validation, serialization, the writer and the official schema, and hostile spec documents
//! (arbitrary bytes, broken text, well-formed specs with wrong values) through the parser.

mod cdi_common;

use dra_sdk::advanced::cdi::{
    CdiDevice, ClaimDevice, IntelRdt, NetDevice, QualifiedName, Spec, SpecWriter,
};
use dra_sdk::cdi::{
    CdiError, ContainerEdits, DeviceNode, DeviceNodeType, Hook, HookName, Kind, Mount,
};
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

// ---- hostile documents ----------------------------------------------------------------------

/// Whether an error says where the problem is: a field path, a line and column, or the field
/// or rule it names.
fn located(err: &CdiError) -> bool {
    let text = err.to_string();
    match err {
        CdiError::Parse { message, .. } => {
            let path = message.split_once(": ").is_some_and(|(path, _)| {
                !path.is_empty()
                    && path
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._[]".contains(c))
            });
            path || message.contains("line") || message.contains('`')
        }
        CdiError::InvalidSpec { field, .. } => !field.is_empty() && text.contains(field.as_str()),
        CdiError::VersionTooLow { .. } => text.contains("cdiVersion"),
        CdiError::InvalidName { .. } | CdiError::Empty => true,
        _ => false,
    }
}

/// Mostly what the field wants, sometimes any other JSON.
fn or_wrong(
    good: impl Strategy<Value = serde_json::Value> + 'static,
) -> BoxedStrategy<serde_json::Value> {
    use serde_json::Value;
    let wrong = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(1.5)),
        ".{0,10}".prop_map(Value::from),
        Just(serde_json::json!([])),
        Just(serde_json::json!({"unknownField": 1})),
    ];
    prop_oneof![20 => good, 1 => wrong].boxed()
}

fn text(pattern: &'static str) -> BoxedStrategy<serde_json::Value> {
    or_wrong(pattern.prop_map(serde_json::Value::from))
}

fn one_of(values: &'static [&'static str]) -> BoxedStrategy<serde_json::Value> {
    or_wrong(prop::sample::select(values).prop_map(serde_json::Value::from))
}

fn list(item: BoxedStrategy<serde_json::Value>) -> BoxedStrategy<serde_json::Value> {
    or_wrong(prop::collection::vec(item, 0..3).prop_map(serde_json::Value::from))
}

/// An object of `fields`, each present with its probability.
fn object(
    fields: Vec<(&'static str, BoxedStrategy<serde_json::Value>, f64)>,
) -> BoxedStrategy<serde_json::Value> {
    let mut names = Vec::new();
    let mut values = Vec::new();
    for (name, value, present) in fields {
        names.push(name);
        values.push(prop::option::weighted(present, value));
    }
    or_wrong(values.prop_map(move |values| {
        let object: serde_json::Map<_, _> = names
            .iter()
            .zip(values)
            .filter_map(|(name, value)| value.map(|value| ((*name).to_owned(), value)))
            .collect();
        serde_json::Value::Object(object)
    }))
}

const SPEC_PATH: &str = "(/[a-z0-9]{1,6}){1,3}|(/[a-z0-9]{1,6}){1,3}|[a-z./]{0,8}";

fn edits_value() -> BoxedStrategy<serde_json::Value> {
    let node = object(vec![
        ("path", text(SPEC_PATH), 0.95),
        ("hostPath", text(SPEC_PATH), 0.6),
        ("type", one_of(&["c", "b", "u", "p", "x"]), 0.3),
        ("permissions", one_of(&["rwm", "r", "rwx", ""]), 0.3),
        (
            "major",
            or_wrong((-2i64..300).prop_map(serde_json::Value::from)),
            0.3,
        ),
    ]);
    let mount = object(vec![
        ("hostPath", text(SPEC_PATH), 0.6),
        ("containerPath", text(SPEC_PATH), 0.95),
        ("type", one_of(&["bind", "tmpfs", ""]), 0.3),
        ("options", list(one_of(&["ro", "rbind", "nosuid"])), 0.3),
    ]);
    let hook = object(vec![
        (
            "hookName",
            one_of(&["createRuntime", "prestart", "startContainer", "bogus"]),
            0.95,
        ),
        ("path", text(SPEC_PATH), 0.95),
        ("args", list(text("[a-z-]{0,6}")), 0.3),
        (
            "timeout",
            or_wrong((-2i64..5).prop_map(serde_json::Value::from)),
            0.3,
        ),
    ]);
    object(vec![
        (
            "env",
            list(text("[A-Z]{1,4}=[a-z0-9]{0,4}|[A-Z_]{0,4}=?[a-z0-9]{0,4}")),
            0.6,
        ),
        ("deviceNodes", list(node), 0.3),
        ("mounts", list(mount), 0.3),
        ("hooks", list(hook), 0.3),
        (
            "additionalGids",
            list(or_wrong((0u32..5).prop_map(serde_json::Value::from))),
            0.3,
        ),
    ])
}

/// A spec document's JSON: well-formed, with right and wrong values in every field.
fn spec_value() -> BoxedStrategy<serde_json::Value> {
    let device = object(vec![
        (
            "name",
            text("[a-z0-9]{1,4}|[a-z0-9]{1,4}|[a-z_.:-]{0,6}"),
            0.97,
        ),
        (
            "annotations",
            or_wrong(
                prop::collection::btree_map("[a-z./]{1,8}", ".{0,6}", 0..3)
                    .prop_map(|map| serde_json::json!(map)),
            ),
            0.3,
        ),
        ("containerEdits", edits_value(), 0.9),
        ("unknownField", text("[a-z]{0,3}"), 0.03),
    ]);
    object(vec![
        (
            "cdiVersion",
            one_of(&[
                "0.3.0", "0.5.0", "0.6.0", "0.8.0", "1.0.0", "1.1.0", "1.1.0", "1.1.0", "9.9.9",
            ]),
            0.97,
        ),
        (
            "kind",
            one_of(&[
                "vendor.com/class",
                "vendor.com/class",
                "vendor.com/class",
                "vendor.com",
                "v/c/d",
            ]),
            0.97,
        ),
        ("devices", list(device), 0.97),
        ("containerEdits", edits_value(), 0.9),
    ])
}

/// The same document as block YAML: keys and scalars as JSON strings, valid YAML.
fn to_yaml(value: &serde_json::Value) -> String {
    use serde_json::Value;
    fn scalar(value: &Value) -> Option<String> {
        match value {
            Value::Array(items) if items.is_empty() => Some("[]".into()),
            Value::Object(object) if object.is_empty() => Some("{}".into()),
            Value::Array(_) | Value::Object(_) => None,
            other => Some(other.to_string()),
        }
    }
    fn write(value: &Value, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match value {
            Value::Object(object) if !object.is_empty() => {
                for (key, item) in object {
                    out.push_str(&format!("{pad}{}:", Value::from(key.as_str())));
                    match scalar(item) {
                        Some(text) => out.push_str(&format!(" {text}\n")),
                        None => {
                            out.push('\n');
                            write(item, indent + 2, out);
                        }
                    }
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for item in items {
                    out.push_str(&format!("{pad}-"));
                    match scalar(item) {
                        Some(text) => out.push_str(&format!(" {text}\n")),
                        None => {
                            out.push('\n');
                            write(item, indent + 2, out);
                        }
                    }
                }
            }
            other => out.push_str(&format!("{pad}{}\n", scalar(other).unwrap_or_default())),
        }
    }
    let mut out = String::new();
    write(value, 0, &mut out);
    out
}

proptest! {
    #![proptest_config(Config::with_cases(256))]

    /// Well-formed JSON and YAML specs with wrong values anywhere (types, relative paths,
    /// bad names, env without `=`, unknown hook names and fields, unknown versions): never a
    /// panic; a rejection says where (the field path, or line and column); an accepted spec
    /// passes validation and reads back from its own JSON.
    #[test]
    fn wrong_specs_fail_with_the_field_named(spec in spec_value(), yaml in any::<bool>()) {
        let document = if yaml { to_yaml(&spec).into_bytes() } else { spec.to_string().into_bytes() };
        match Spec::parse(&document) {
            Err(err) => prop_assert!(located(&err), "unlocated error: {err}"),
            Ok(parsed) => {
                prop_assert!(parsed.validate().is_ok());
                let again = Spec::parse(&parsed.to_json().unwrap()).unwrap();
                prop_assert_eq!(again, parsed);
            }
        }
    }

    /// The same documents cut short and with bytes overwritten, and arbitrary bytes: never a
    /// panic, and every error says where.
    #[test]
    fn broken_spec_text_never_panics(
        spec in spec_value(),
        yaml in any::<bool>(),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        noise in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut document = if yaml { to_yaml(&spec).into_bytes() } else { spec.to_string().into_bytes() };
        document.truncate(cut.index(document.len() + 1));
        for (at, byte) in flips {
            if !document.is_empty() {
                let at = at.index(document.len());
                document[at] = byte;
            }
        }
        for document in [document, noise] {
            if let Err(err) = Spec::parse(&document) {
                prop_assert!(located(&err), "unlocated error: {err}");
            }
        }
    }
}

/// `read_file` names the file in every error, whatever is at the path.
#[test]
fn read_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, b"{\"cdiVersion\": \"0.3.0\", \"kind\": 7}").unwrap();
    let empty = dir.path().join("empty.yaml");
    std::fs::write(&empty, b"").unwrap();
    for path in [
        garbage,
        empty,
        dir.path().join("missing.json"),
        dir.path().to_owned(),
    ] {
        let err = Spec::read_file(&path).unwrap_err();
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}

/// The generator of wrong specs reaches every stage: some documents parse and validate, some
/// fail validation inside a device, some fail to parse inside a device; otherwise the property
/// above would test little.
#[test]
fn wrong_spec_generator_reaches_validation() {
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    let counts = std::cell::RefCell::new([0usize; 3]);
    runner
        .run(&spec_value(), |spec| {
            let mut counts = counts.borrow_mut();
            match Spec::parse(spec.to_string().as_bytes()) {
                Ok(_) => counts[0] += 1,
                Err(CdiError::InvalidSpec {
                    device: Some(_), ..
                }) => counts[1] += 1,
                Err(CdiError::Parse { message, .. }) if message.starts_with("devices[") => {
                    counts[2] += 1
                }
                Err(_) => {}
            }
            Ok(())
        })
        .unwrap();
    let counts = counts.into_inner();
    assert!(counts.iter().all(|&count| count > 0), "{counts:?}");
}
