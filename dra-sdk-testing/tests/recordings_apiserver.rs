//! The real API server's verdicts (`apiserver/cases.yaml` of the recordings) judge the SDK's
//! slice validation and the fake API server's admission.
//!
//! Every recorded case is fed to both. The SDK must accept every ResourceSlice the real
//! kube-apiserver v1.36.2 accepted and reject, naming the same field, every one it rejected; the
//! fake API server must never reject what the real one accepted and, where it rejects, must name
//! the recorded fields with the recorded HTTP code. What either side deliberately does not
//! check is listed below with the reason, rule by rule, and a rule that no case needs any more
//! fails the test, so the lists cannot rot.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;

use dra_sdk::advanced::slices::{
    KubernetesVersion, SliceLimits, ValidationError, validate_driver_name,
};
use dra_sdk::k8s_openapi::api::core::v1::NodeSelector;
use dra_sdk::slices::{
    AttributeValue, CapacityRequestPolicy, CounterSet, Device, DeviceCapacity,
    DeviceCounterConsumption, DeviceNodeSelection, DeviceTaint, DriverResources, Pool,
    PoolNodeSelection, Quantity, TaintEffect, ValidRequestValues,
};
use dra_sdk_testing::apiserver::{FakeApiServer, ResourceType};
use dra_sdk_testing::recordings::recordings_or_skip;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde::Deserialize;
use serde_json::Value;

/// The release that recorded the verdicts: the SDK validates for it whatever the case's
/// `apiVersion` (the publisher picks limits by `/version`, not by the served API version).
const RELEASE: KubernetesVersion = KubernetesVersion::new(1, 36);

#[derive(Deserialize)]
struct Corpus {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    name: String,
    api_version: String,
    object: Value,
    verdict: Value,
}

/// What a server (or the SDK) said about one object.
#[derive(Clone, Debug, PartialEq)]
enum Verdict {
    Accepted,
    Rejected {
        code: u16,
        reason: String,
        /// The fields of `details.causes`; for a 400 strict-decoding error, which has no causes,
        /// the unknown field its message names.
        fields: Vec<String>,
        message: String,
    },
}

impl Verdict {
    fn recorded(case: &Case) -> Self {
        if case.verdict.as_str() == Some("accepted") {
            return Self::Accepted;
        }
        let text = |key: &str| {
            case.verdict
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let message = text("message");
        let mut fields: Vec<String> = case
            .verdict
            .get("causes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|cause| cause.get("field")?.as_str().map(str::to_owned))
            .collect();
        if fields.is_empty()
            && let Some((_, rest)) = message.split_once("unknown field \"")
            && let Some((field, _)) = rest.split_once('"')
        {
            fields.push(field.to_owned());
        }
        Self::Rejected {
            code: case
                .verdict
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|code| u16::try_from(code).ok())
                .unwrap_or_default(),
            reason: text("reason"),
            fields,
            message,
        }
    }

    fn fields(&self) -> &[String] {
        match self {
            Self::Accepted => &[],
            Self::Rejected { fields, .. } => fields,
        }
    }

    /// The recorded message of the cause naming `field` (or the whole message).
    fn message_for(&self, case: &Case, field: &str) -> String {
        case.verdict
            .get("causes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|cause| cause.get("field").and_then(Value::as_str) == Some(field))
            .and_then(|cause| cause.get("message")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| match self {
                Self::Rejected { message, .. } => message.clone(),
                Self::Accepted => String::new(),
            })
    }
}

fn load_cases() -> Option<Vec<Case>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = recordings_or_skip(&root)?.join("apiserver");
    let mut cases = Vec::new();
    for file in dra_sdk_testing::recordings::files_with_suffix(&dir, ".yaml") {
        let text = std::fs::read_to_string(&file).unwrap();
        let corpus: Corpus = serde_saphyr::from_str(&text)
            .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        cases.extend(corpus.cases);
    }
    assert!(!cases.is_empty(), "no cases in {}", dir.display());
    Some(cases)
}

fn kind(case: &Case) -> &str {
    case.object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Whether our error at `ours` names the field the real server named `recorded`: the same
/// path, or a part of it (the server names a map, `spec.devices[0].attributes`, where we may
/// name the entry), or the list whose entry the server named (`spec.sharedCounters` for the
/// server's `spec.sharedCounters[1]`, a duplicate). Indexes compare literally except `[*]`
/// in a table pattern, which matches any.
fn same_field(recorded: &str, ours: &str) -> bool {
    let (recorded, ours) = (segments(recorded), segments(ours));
    let matches = |x: &String, y: &String| x == y || x == "[*]" || y == "[*]";
    if recorded.len() <= ours.len() {
        recorded.iter().zip(&ours).all(|(x, y)| matches(x, y))
    } else {
        recorded.len() == ours.len() + 1
            && recorded.last().is_some_and(|last| last.starts_with('['))
            && ours.iter().zip(&recorded).all(|(x, y)| matches(x, y))
    }
}

/// `spec.devices[0].name` as `["spec", "devices", "[0]", "name"]`; brackets are kept whole
/// (attribute names contain dots).
fn segments(field: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut depth = 0;
    for c in field.chars() {
        match c {
            '[' if depth == 0 => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
                depth += 1;
                current.push(c);
            }
            ']' if depth == 1 => {
                current.push(c);
                out.push(std::mem::take(&mut current));
                depth = 0;
            }
            '.' if depth == 0 => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
            _ => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The SDK's slice validation.
// ---------------------------------------------------------------------------------------------

/// A recorded rule the SDK's validation does not check, and why the publisher still never sends
/// a slice that breaks it.
struct NotChecked {
    /// The recorded cause's field (`[*]` matches any index).
    field: &'static str,
    /// A part of the recorded cause's message.
    message: &'static str,
    why: &'static str,
    /// Checks the SDK against the recorded limit, where there is one.
    check: Option<LimitCheck>,
}

/// Compares a recorded cause's message (with its limit) with the SDK's limits.
type LimitCheck = fn(&str, &SliceLimits) -> Result<(), String>;

/// The recorded `must have at most N items`.
fn at_most(message: &str) -> Option<usize> {
    message
        .split("must have at most ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

const SDK_NOT_CHECKED: &[NotChecked] = &[
    NotChecked {
        field: "spec.devices",
        message: "Too many",
        why: "devices per slice: the publisher splits a pool into slices of at most \
              SliceLimits::default_devices_per_slice devices; the recorded limit must be the SDK's",
        check: Some(|message, limits| {
            let max = at_most(message).ok_or("no limit in the message")?;
            if max == limits.max_devices_per_slice || max == limits.max_devices_per_slice_advanced {
                Ok(())
            } else {
                Err(format!(
                    "recorded limit {max}, the SDK's are {} and {} (advanced)",
                    limits.max_devices_per_slice, limits.max_devices_per_slice_advanced
                ))
            }
        }),
    },
    NotChecked {
        field: "spec.sharedCounters",
        message: "Too many",
        why: "counter sets per slice: the 1.35+ layout puts at most \
              SliceLimits::max_counter_sets_per_slice sets in a slice",
        check: Some(|message, limits| match at_most(message) {
            Some(max) if max == limits.max_counter_sets_per_slice => Ok(()),
            other => Err(format!(
                "recorded limit {other:?}, the SDK's is {}",
                limits.max_counter_sets_per_slice
            )),
        }),
    },
    NotChecked {
        field: "spec",
        message: "sharedCounters",
        why: "devices and sharedCounters in one slice: the 1.35+ layout gives counter sets \
              slices of their own",
        check: None,
    },
    NotChecked {
        field: "spec.pool.resourceSliceCount",
        message: "",
        why: "the publisher computes resourceSliceCount (at least 1) itself",
        check: None,
    },
];

/// The SDK's verdict on a recorded slice: the recorded object read into the SDK's model (parts
/// the model cannot express are rejections: a driver cannot ask the publisher to send them),
/// then `validate_driver_name` and `DriverResources::validate`, each error spelled as the
/// server's field path.
fn sdk_fields(case: &Case, limits: &SliceLimits) -> Vec<(String, String)> {
    let mut spec = case.object.get("spec").cloned().unwrap_or(Value::Null);
    let mut reader = Reader::default();
    if case.api_version.ends_with("/v1beta1") {
        reader.unwrap_basic(&mut spec);
    }
    let (driver, pool_name, pool) = reader.slice(&spec);
    let mut out = std::mem::take(&mut reader.unrepresentable);
    if let Err(error) = validate_driver_name(&driver) {
        out.push(("spec.driver".to_owned(), error.to_string()));
    }
    let resources = DriverResources::new().with_pool(pool_name, pool);
    if let Err(errors) = resources.validate(limits) {
        for error in errors.errors {
            let field = server_field(&spec, &error);
            // The sets stood in for the pool's other slices are not this slice's content.
            let elsewhere = reader
                .elsewhere
                .iter()
                .any(|set| field.starts_with(&format!("spec.sharedCounters[{set}]")));
            if !elsewhere {
                out.push((field, error.to_string()));
            }
        }
    }
    out
}

/// Reads a recorded v1 slice spec into the SDK's model.
#[derive(Default)]
struct Reader {
    /// Server-spelled fields the model cannot express, with why.
    unrepresentable: Vec<(String, String)>,
    /// Counter sets added for the pool's other slices.
    elsewhere: Vec<String>,
}

impl Reader {
    fn cannot(&mut self, field: impl Into<String>, why: &str) {
        self.unrepresentable.push((
            field.into(),
            format!("the SDK's model cannot express this: {why}"),
        ));
    }

    /// v1beta1 devices wrap everything but the name in `basic`; the SDK's wire layer always
    /// writes that shape, so other fields beside the name are unknown fields.
    fn unwrap_basic(&mut self, spec: &mut Value) {
        let Some(devices) = spec.get_mut("devices").and_then(Value::as_array_mut) else {
            return;
        };
        for (i, device) in devices.iter_mut().enumerate() {
            let Some(fields) = device.as_object_mut() else {
                continue;
            };
            let basic = fields.remove("basic");
            for key in fields.keys().filter(|key| *key != "name") {
                self.unrepresentable.push((
                    format!("spec.devices[{i}].{key}"),
                    "v1beta1 devices keep their fields in `basic`".to_owned(),
                ));
            }
            fields.retain(|key, _| key == "name");
            if let Some(Value::Object(basic)) = basic {
                fields.extend(basic);
            }
        }
    }

    fn unknown_keys(&mut self, path: &str, value: &Value, known: &[&str]) {
        for key in value.as_object().into_iter().flat_map(|o| o.keys()) {
            if !known.contains(&key.as_str()) {
                self.cannot(format!("{path}.{key}"), "unknown field");
            }
        }
    }

    fn slice(&mut self, spec: &Value) -> (String, String, Pool) {
        self.unknown_keys(
            "spec",
            spec,
            &[
                "driver",
                "nodeName",
                "nodeSelector",
                "allNodes",
                "perDeviceNodeSelection",
                "pool",
                "devices",
                "sharedCounters",
            ],
        );
        let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_owned);
        let driver = text(spec.get("driver")).unwrap_or_default();
        let pool_name = text(spec.pointer("/pool/name")).unwrap_or_default();
        let mut pool = Pool::new([]);
        if let Some(generation) = spec.pointer("/pool/generation").and_then(Value::as_i64) {
            pool = pool.generation(generation);
        }
        let selections: Vec<PoolNodeSelection> = [
            text(spec.get("nodeName")).map(|_| PoolNodeSelection::Local),
            spec.get("nodeSelector")
                .map(|s| PoolNodeSelection::NodeSelector(node_selector(s))),
            flag(spec, "allNodes").map(|_| PoolNodeSelection::AllNodes),
            flag(spec, "perDeviceNodeSelection").map(|_| PoolNodeSelection::PerDevice),
        ]
        .into_iter()
        .flatten()
        .collect();
        for name in ["allNodes", "perDeviceNodeSelection"] {
            if spec.get(name) == Some(&Value::Bool(false)) {
                self.cannot(format!("spec.{name}"), "an explicit false");
            }
        }
        match selections.len() {
            0 => self.cannot("spec", "a slice without node selection"),
            1 => pool = pool.node_selection(selections.into_iter().next().unwrap_or_default()),
            _ => self.cannot("spec", "two kinds of node selection"),
        }
        for (i, set) in list(spec, "sharedCounters").iter().enumerate() {
            let path = format!("spec.sharedCounters[{i}]");
            self.unknown_keys(&path, set, &["name", "counters"]);
            pool = pool.counter_set(CounterSet {
                name: text(set.get("name")).unwrap_or_default(),
                counters: self.counters(&format!("{path}.counters"), set.get("counters")),
            });
        }
        for (i, device) in list(spec, "devices").iter().enumerate() {
            let device = self.device(&format!("spec.devices[{i}]"), device);
            pool = pool.device(device);
        }
        // A slice is one part of a pool; from 1.35 on, the counter sets its devices consume live
        // in the pool's other slices, which the server does not see when it validates this one.
        // The SDK validates whole pools, so give the pool those sets, with what is consumed.
        let mut elsewhere: BTreeMap<String, CounterSet> = BTreeMap::new();
        for consumption in pool.devices.iter().flat_map(|d| &d.consumes_counters) {
            if pool
                .shared_counters
                .iter()
                .all(|set| set.name != consumption.counter_set)
            {
                let set = elsewhere
                    .entry(consumption.counter_set.clone())
                    .or_insert_with(|| CounterSet {
                        name: consumption.counter_set.clone(),
                        counters: BTreeMap::new(),
                    });
                set.counters.extend(consumption.counters.clone());
            }
        }
        for set in elsewhere.into_values() {
            self.elsewhere.push(set.name.clone());
            pool = pool.counter_set(set);
        }
        (driver, pool_name, pool)
    }

    fn counters(&mut self, path: &str, counters: Option<&Value>) -> BTreeMap<String, Quantity> {
        let mut out = BTreeMap::new();
        for (name, counter) in counters.and_then(Value::as_object).into_iter().flatten() {
            self.unknown_keys(&format!("{path}[{name}]"), counter, &["value"]);
            out.insert(name.clone(), quantity(counter.get("value")));
        }
        out
    }

    fn device(&mut self, path: &str, value: &Value) -> Device {
        self.unknown_keys(
            path,
            value,
            &[
                "name",
                "attributes",
                "capacity",
                "consumesCounters",
                "nodeName",
                "nodeSelector",
                "allNodes",
                "taints",
                "bindsToNode",
                "bindingConditions",
                "bindingFailureConditions",
                "allowMultipleAllocations",
            ],
        );
        let name = value
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut device = Device::new(name);
        for (name, attribute) in value
            .get("attributes")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            match attribute_value(attribute) {
                Some(value) => device.attributes.insert(name.clone(), value),
                None => {
                    self.cannot(
                        format!("{path}.attributes[{name}]"),
                        "an attribute without exactly one value",
                    );
                    continue;
                }
            };
        }
        for (name, capacity) in value
            .get("capacity")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let field = format!("{path}.capacity[{name}]");
            let mut out = DeviceCapacity::from(quantity(capacity.get("value")));
            if let Some(policy) = capacity.get("requestPolicy") {
                out = out.with_request_policy(self.request_policy(&field, policy));
            }
            device.capacity.insert(name.clone(), out);
        }
        for (i, consumption) in list(value, "consumesCounters").iter().enumerate() {
            let field = format!("{path}.consumesCounters[{i}]");
            let set = consumption
                .get("counterSet")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let mut out = DeviceCounterConsumption::new(set, [] as [(String, String); 0]);
            out.counters = self.counters(&format!("{field}.counters"), consumption.get("counters"));
            device.consumes_counters.push(out);
        }
        let selections: Vec<DeviceNodeSelection> = [
            value
                .get("nodeName")
                .and_then(Value::as_str)
                .map(|n| DeviceNodeSelection::NodeName(n.to_owned())),
            value
                .get("nodeSelector")
                .map(|s| DeviceNodeSelection::NodeSelector(node_selector(s))),
            flag(value, "allNodes").map(|_| DeviceNodeSelection::AllNodes),
        ]
        .into_iter()
        .flatten()
        .collect();
        match selections.len() {
            0 => {}
            1 => device.node_selection = selections.into_iter().next(),
            _ => self.cannot(path, "two kinds of node selection"),
        }
        for (i, taint) in list(value, "taints").iter().enumerate() {
            let field = format!("{path}.taints[{i}]");
            let effect = match taint.get("effect").and_then(Value::as_str) {
                Some("NoSchedule") => TaintEffect::NoSchedule,
                Some("NoExecute") => TaintEffect::NoExecute,
                Some("None") => TaintEffect::None,
                _ => {
                    self.cannot(format!("{field}.effect"), "only the three taint effects");
                    continue;
                }
            };
            let key = taint.get("key").and_then(Value::as_str).unwrap_or_default();
            let mut out = DeviceTaint::new(key, effect);
            if let Some(v) = taint.get("value").and_then(Value::as_str) {
                out = out.value(v);
            }
            device.taints.push(out);
        }
        device.binds_to_node = flag(value, "bindsToNode").is_some();
        device.allow_multiple_allocations = flag(value, "allowMultipleAllocations").is_some();
        device.binding_conditions = strings(value.get("bindingConditions"));
        device.binding_failure_conditions = strings(value.get("bindingFailureConditions"));
        device
    }

    fn request_policy(&mut self, field: &str, policy: &Value) -> CapacityRequestPolicy {
        let mut out = CapacityRequestPolicy::default();
        out.default = policy.get("default").map(|q| quantity(Some(q)));
        match (policy.get("validValues"), policy.get("validRange")) {
            (Some(_), Some(_)) => {
                self.cannot(
                    format!("{field}.requestPolicy"),
                    "both validValues and validRange",
                );
            }
            (Some(values), None) => {
                out.valid = Some(ValidRequestValues::Values(
                    values
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|q| quantity(Some(q)))
                        .collect(),
                ));
            }
            (None, Some(range)) => {
                out.valid = Some(ValidRequestValues::Range {
                    min: quantity(range.get("min")),
                    max: range.get("max").map(|q| quantity(Some(q))),
                    step: range.get("step").map(|q| quantity(Some(q))),
                });
            }
            (None, None) => {}
        }
        out
    }
}

fn flag(value: &Value, name: &str) -> Option<()> {
    (value.get(name) == Some(&Value::Bool(true))).then_some(())
}

fn list<'a>(value: &'a Value, name: &str) -> &'a [Value] {
    value
        .get(name)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn quantity(value: Option<&Value>) -> Quantity {
    Quantity(match value {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    })
}

fn node_selector(value: &Value) -> NodeSelector {
    serde_json::from_value(value.clone()).unwrap()
}

fn attribute_value(attribute: &Value) -> Option<AttributeValue> {
    let set: Vec<(&String, &Value)> = attribute
        .as_object()?
        .iter()
        .filter(|(_, v)| !v.is_null())
        .collect();
    let [(kind, value)] = set.as_slice() else {
        return None;
    };
    let texts = || strings(Some(value));
    Some(match kind.as_str() {
        "int" => AttributeValue::Int(value.as_i64()?),
        "bool" => AttributeValue::Bool(value.as_bool()?),
        "string" => AttributeValue::String(value.as_str()?.to_owned()),
        "version" => AttributeValue::Version(value.as_str()?.to_owned()),
        "ints" => {
            AttributeValue::Ints(value.as_array()?.iter().filter_map(Value::as_i64).collect())
        }
        "bools" => AttributeValue::Bools(
            value
                .as_array()?
                .iter()
                .filter_map(Value::as_bool)
                .collect(),
        ),
        "strings" => AttributeValue::Strings(texts()),
        "versions" => AttributeValue::Versions(texts()),
        _ => return None,
    })
}

/// An SDK error's field in the server's spelling: devices by index instead of name, list
/// entries (counter consumptions, taints, counter sets, conditions) by index instead of key.
fn server_field(spec: &Value, error: &ValidationError) -> String {
    let (mut out, mut at) = match &error.path.device {
        Some(name) => {
            let index = list(spec, "devices")
                .iter()
                .position(|d| d.get("name").and_then(Value::as_str) == Some(name))
                .unwrap_or_default();
            (
                format!("spec.devices[{index}]"),
                list(spec, "devices").get(index).cloned(),
            )
        }
        None => ("spec".to_owned(), Some(spec.clone())),
    };
    for segment in segments(&error.path.field) {
        // Our names for a whole device or slice, where the server names the device or spec.
        if matches!(segment.as_str(), "nodeSelection" | "attributes+capacity") {
            continue;
        }
        if let Some(key) = segment.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            let key: String = serde_json::from_str(key).unwrap_or_else(|_| key.to_owned());
            let index = at.as_ref().and_then(Value::as_array).and_then(|items| {
                items.iter().position(|item| {
                    item.as_str() == Some(&key)
                        || ["name", "key", "counterSet"]
                            .iter()
                            .any(|k| item.get(k).and_then(Value::as_str) == Some(&key))
                })
            });
            let next = match index {
                Some(index) => {
                    out.push_str(&format!("[{index}]"));
                    at.as_ref().and_then(|a| a.get(index)).cloned()
                }
                None => {
                    out.push_str(&format!("[{key}]"));
                    at.as_ref().and_then(|a| a.get(&key)).cloned()
                }
            };
            at = next;
        } else {
            out.push('.');
            out.push_str(&segment);
            at = at.as_ref().and_then(|a| a.get(&segment)).cloned();
        }
    }
    out
}

#[test]
fn sdk_slice_validation_agrees_with_the_real_api_server() {
    let Some(cases) = load_cases() else { return };
    let limits = SliceLimits::for_release(RELEASE);
    let not_checked_used: Vec<Cell<bool>> =
        SDK_NOT_CHECKED.iter().map(|_| Cell::new(false)).collect();
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases.iter().filter(|case| kind(case) == "ResourceSlice") {
        checked += 1;
        let recorded = Verdict::recorded(case);
        let mut ours = sdk_fields(case, &limits);
        let mut problems = Vec::new();
        for (field, error) in &ours {
            if !recorded.fields().iter().any(|r| same_field(r, field)) {
                problems.push(format!("we reject {field} ({error}), the server did not"));
            }
        }
        for field in recorded.fields() {
            if ours.iter().any(|(ours, _)| same_field(field, ours)) {
                continue;
            }
            let message = recorded.message_for(case, field);
            let rule = SDK_NOT_CHECKED.iter().enumerate().find(|(_, rule)| {
                same_field(rule.field, field)
                    && segments(rule.field).len() == segments(field).len()
                    && message.contains(rule.message)
            });
            match rule {
                Some((i, rule)) => {
                    not_checked_used[i].set(true);
                    if let Some(check) = rule.check
                        && let Err(why) = check(&message, &limits)
                    {
                        problems.push(format!("{field}: {why}"));
                    }
                }
                None => problems.push(format!(
                    "the server rejected {field} ({message}), we did not"
                )),
            }
        }
        if !problems.is_empty() {
            let shown = problems.len().min(5);
            problems.truncate(shown);
            ours.truncate(5);
            failures.push(format!(
                "{} ({}): recorded {recorded:?}; ours (at most 5): {ours:?}:\n    {}",
                case.name,
                case.api_version,
                problems.join("\n    ")
            ));
        }
    }
    for (rule, used) in SDK_NOT_CHECKED.iter().zip(&not_checked_used) {
        if !used.get() {
            failures.push(format!(
                "SDK_NOT_CHECKED rule for {} ({}) is used by no case",
                rule.field, rule.why
            ));
        }
    }
    assert!(checked > 0, "no ResourceSlice cases");
    assert!(
        failures.is_empty(),
        "{} of {checked} ResourceSlice cases disagree with the real API server:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The fake API server's admission.
// ---------------------------------------------------------------------------------------------

/// A recorded rule the fake API server does not enforce, and why that is acceptable.
struct FakeNotValidated {
    /// The kind, or `*` for every kind.
    kind: &'static str,
    /// Recorded cause fields this covers (`[*]` matches any index; a field covers what is
    /// below it; empty covers every field).
    field: &'static str,
    /// The recorded Status reason this covers, or empty for any.
    reason: &'static str,
    why: &'static str,
}

const FAKE_NOT_VALIDATED: &[FakeNotValidated] = &[
    FakeNotValidated {
        kind: "*",
        field: "",
        reason: "BadRequest",
        why: "strict decoding (400 for unknown fields): the fake stores JSON as sent; typed \
              clients (k8s-openapi, the SDK's wire layer) cannot send unknown fields",
    },
    FakeNotValidated {
        kind: "DeviceClass",
        field: "spec",
        reason: "",
        why: "DeviceClass specs are not validated (CEL compilation and cost, opaque \
              parameters, extended resource names): classes are test fixtures, written by the \
              tests themselves, never by the SDK",
    },
    FakeNotValidated {
        kind: "ResourceClaim",
        field: "spec",
        reason: "",
        why: "ResourceClaim specs are not validated (requests, CEL, config, constraints, \
              tolerations, admin access): claims are test fixtures; the fake validates what a \
              driver writes, status.devices",
    },
    FakeNotValidated {
        kind: "ResourceSlice",
        field: "spec.devices[*].capacity[*].requestPolicy",
        reason: "",
        why: "capacity request policies (DRAConsumableCapacity): the relations between default, \
              valid values, step and capacity need quantity arithmetic; the SDK's validation \
              rejects these cases before any write (sdk_slice_validation_agrees_with_the_real_api_server)",
    },
];

#[tokio::test]
async fn fake_api_server_admission_agrees_with_the_real_api_server() {
    let Some(cases) = load_cases() else { return };
    let mut types = ResourceType::defaults();
    for version in ["v1beta2", "v1beta1"] {
        types.extend([
            ResourceType::RESOURCE_SLICES.with_version(version),
            ResourceType::RESOURCE_CLAIMS.with_version(version),
            ResourceType::DEVICE_CLASSES.with_version(version),
        ]);
    }
    let server = FakeApiServer::builder()
        .resource_types(types)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let used: Vec<Cell<bool>> = FAKE_NOT_VALIDATED
        .iter()
        .map(|_| Cell::new(false))
        .collect();
    let mut failures = Vec::new();
    for case in &cases {
        let recorded = Verdict::recorded(case);
        let kind = kind(case);
        let (group, version) = case.api_version.split_once('/').unwrap();
        let ar = ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: case.api_version.clone(),
            kind: kind.to_owned(),
            plural: match kind {
                "DeviceClass" => "deviceclasses".to_owned(),
                other => format!("{}s", other.to_ascii_lowercase()),
            },
        };
        let api: Api<DynamicObject> = if kind == "ResourceClaim" {
            let namespace = if case.name == "claim-admin-access-namespace-labelled" {
                "api-cases-admin"
            } else {
                "api-cases"
            };
            Api::namespaced_with(client.clone(), namespace, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let object: DynamicObject = serde_json::from_value(case.object.clone()).unwrap();
        let params = PostParams {
            dry_run: true,
            field_manager: Some("kubectl-create".to_owned()),
        };
        let fake = match api.create(&params, &object).await {
            Ok(_) => Verdict::Accepted,
            Err(kube::Error::Api(status)) => Verdict::Rejected {
                code: status.code,
                reason: status.reason.clone(),
                fields: status
                    .details
                    .iter()
                    .flat_map(|d| d.causes.iter().map(|c| c.field.clone()))
                    .collect(),
                message: status.message.clone(),
            },
            Err(other) => panic!("{}: {other}", case.name),
        };
        let recorded_reason = match &recorded {
            Verdict::Rejected { reason, .. } => reason.as_str(),
            Verdict::Accepted => "",
        };
        let covered = |field: &str| {
            FAKE_NOT_VALIDATED.iter().enumerate().any(|(i, rule)| {
                let hit = (rule.kind == "*" || rule.kind == kind)
                    && (rule.reason.is_empty() || rule.reason == recorded_reason)
                    && segments(rule.field).len() <= segments(field).len()
                    && same_field(rule.field, field);
                if hit {
                    used[i].set(true);
                }
                hit
            })
        };
        let mut problems = Vec::new();
        match (&recorded, &fake) {
            (Verdict::Accepted, Verdict::Accepted) => {}
            (Verdict::Accepted, Verdict::Rejected { .. }) => {
                problems.push("the fake rejects what the server accepted".to_owned());
            }
            (Verdict::Rejected { fields, .. }, Verdict::Accepted) => {
                for field in fields {
                    if !covered(field) {
                        problems.push(format!(
                            "the fake accepts {field}, which the server rejected, and FAKE_NOT_VALIDATED does not list it"
                        ));
                    }
                }
            }
            (
                Verdict::Rejected {
                    code,
                    fields,
                    reason,
                    ..
                },
                Verdict::Rejected {
                    code: fake_code,
                    fields: fake_fields,
                    reason: fake_reason,
                    ..
                },
            ) => {
                if (code, reason) != (fake_code, fake_reason) {
                    problems.push(format!(
                        "the fake answers {fake_code} {fake_reason}, the server {code} {reason}"
                    ));
                }
                for field in fake_fields {
                    if !fields.iter().any(|r| same_field(r, field)) {
                        problems.push(format!("the fake rejects {field}, the server did not"));
                    }
                }
                for field in fields {
                    if !fake_fields.iter().any(|f| same_field(field, f)) && !covered(field) {
                        problems.push(format!(
                            "the fake does not name {field}, and FAKE_NOT_VALIDATED does not list it"
                        ));
                    }
                }
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{} ({} {kind}): recorded {recorded:?}; fake {fake:?}:\n    {}",
                case.name,
                case.api_version,
                problems.join("\n    ")
            ));
        }
    }
    for (rule, used) in FAKE_NOT_VALIDATED.iter().zip(&used) {
        if !used.get() {
            failures.push(format!(
                "FAKE_NOT_VALIDATED rule {} {} ({}) is used by no case",
                rule.kind, rule.field, rule.why
            ));
        }
    }
    server.shutdown().await;
    assert!(
        failures.is_empty(),
        "{} of {} cases: the fake API server disagrees with the real one:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
