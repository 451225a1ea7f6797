//! Replays the recorded CRI conversation of a real kubelet (v1.36.2) against the test kit's
//! CRI double: the recording is the judge.
//!
//! For every `*.jsonl` under `kubelet-cri/` and `kubelet-cri/unimplemented/` of the recordings
//! (found at run time: a new file is checked without a code change), a fresh double configured
//! like the recording runtime (`fakecri-rec`) was gets every recorded request, in order, over
//! its real Unix socket, encoded from the recorded protojson with the double's own
//! descriptors. Each answer must have:
//!
//! - the recorded gRPC code (`OK` included), and for errors the recorded message, except
//!   where the recorder wrote its own name into it (its injected `CreateContainer` failure);
//! - for a success, the recorded *shape*: the same fields set, recursively, the same list
//!   lengths and map keys, the same enum values. Scalars (ids, timestamps, paths) may differ.
//!
//! The recorder's configuration: `--fail-once-pod fail-once` (pod `default/fail-once`) always;
//! for `unimplemented/<Method>[--<Gate>].jsonl`, `Method` answered `Unimplemented`; and its
//! `--fake-metric-descriptors`, read back from the file's `ListMetricDescriptors` answer.
//!
//! Requests are rewritten in two ways only: ids the recorder handed out are mapped to the
//! double's (learnt from `RunPodSandbox`/`CreateContainer` answers), and `log_directory`
//! (`/srv/rec/...` on the recording machine) is moved under a temporary folder, because the
//! double creates the containers' log files there.
//!
//! Every field of a recorded request or response that the double's proto
//! (`dra-sdk-testing/proto/cri-v1.proto`) does not model must be listed in [`UNMODELLED`] with the reason;
//! any other would be dropped silently, so it fails the test.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use bytes::{Buf as _, BufMut as _};
use dra_sdk_testing::cri::{CriDouble, FILE_DESCRIPTOR_SET, proto};
use dra_sdk_testing::recordings::{files_with_suffix, recordings_or_skip};
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, MethodDescriptor,
    ReflectMessage as _, SerializeOptions, Value,
};
use serde_json::Value as Json;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Fields of recorded messages that the double's proto leaves out, by
/// `(method, "request" | "response", field path)`, with the reason. A listed field that no
/// recording has fails the test too, so the list stays true.
const UNMODELLED: &[(&str, &str, &str, &str)] = &[];

/// The pod whose first `CreateContainer` the recorder failed (its `--fail-once-pod`).
const FAIL_ONCE_POD: (&str, &str) = ("default", "fail-once");

/// The recorder's own fault messages name it; the double's name the double.
const RECORDER_MESSAGE_PREFIX: &str = "fakecri-rec: ";

#[tokio::test]
async fn the_double_answers_every_recorded_kubelet_call_as_the_recorded_runtime() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Some(recordings) = recordings_or_skip(&workspace) else {
        return;
    };
    let dir = recordings.join("kubelet-cri");
    let mut files = files_with_suffix(&dir, ".jsonl");
    files.extend(files_with_suffix(&dir.join("unimplemented"), ".jsonl"));
    assert!(!files.is_empty(), "no recordings in {}", dir.display());

    let pool = DescriptorPool::decode(FILE_DESCRIPTOR_SET).expect("the double's descriptors");
    let mut failures = Vec::new();
    let mut unmodelled_seen = BTreeSet::new();
    let mut calls = 0;
    for file in &files {
        let replay = replay(&pool, file, &mut unmodelled_seen).await;
        calls += replay.calls;
        failures.extend(replay.failures);
    }
    for (method, side, path, reason) in UNMODELLED {
        if !unmodelled_seen.contains(&(*method, *side, *path)) {
            failures.push(format!(
                "UNMODELLED lists {method} {side} {path} ({reason}), which no recording has"
            ));
        }
    }
    eprintln!(
        "cri recordings: {calls} calls of {} files replayed, {} unmodelled fields listed",
        files.len(),
        UNMODELLED.len()
    );
    assert!(
        failures.is_empty(),
        "{} disagreements between the CRI double and the recordings:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

struct Replay {
    calls: usize,
    failures: Vec<String>,
}

/// The recorder's configuration for one file.
fn double_for(
    file: &Path,
    lines: &[(usize, Json)],
    pool: &DescriptorPool,
    socket: &Path,
) -> CriDouble {
    let mut builder =
        CriDouble::builder(socket).fail_first_create(FAIL_ONCE_POD.0, FAIL_ONCE_POD.1);
    let in_unimplemented = file
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|dir| dir == "unimplemented");
    if in_unimplemented {
        let stem = file
            .file_stem()
            .and_then(|stem| stem.to_str())
            .expect("a UTF-8 file name");
        let method = stem.split_once("--").map_or(stem, |(method, _gate)| method);
        builder = builder.unimplemented([method]);
    }
    let descriptors = lines.iter().find_map(|(_, line)| {
        (line["method"] == "/runtime.v1.RuntimeService/ListMetricDescriptors")
            .then(|| line.get("response"))
            .flatten()
    });
    if let Some(response) = descriptors {
        let output = pool
            .get_message_by_name("runtime.v1.ListMetricDescriptorsResponse")
            .expect("ListMetricDescriptorsResponse");
        let message = from_json(output, response).expect("the recorded descriptors");
        let response: proto::ListMetricDescriptorsResponse =
            message.transcode_to().expect("transcode the descriptors");
        builder = builder.metric_descriptors(response.descriptors);
    }
    builder.start().expect("start the CRI double")
}

async fn replay(
    pool: &DescriptorPool,
    file: &Path,
    unmodelled_seen: &mut BTreeSet<(&'static str, &'static str, &'static str)>,
) -> Replay {
    let name = file.display().to_string();
    let text = std::fs::read_to_string(file).unwrap_or_else(|error| panic!("{name}: {error}"));
    let lines: Vec<(usize, Json)> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            let json = serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("{name}:{}: {error}", index + 1));
            (index + 1, json)
        })
        .collect();
    let scratch = tempfile::tempdir().expect("a temporary folder");
    let cri = double_for(file, &lines, pool, &scratch.path().join("cri.sock"));
    let channel = cri.connect().await.expect("connect to the double");
    let mut ids: HashMap<String, String> = HashMap::new();
    let mut failures = Vec::new();
    for (number, line) in &lines {
        let method_path = line["method"].as_str().unwrap_or_default();
        let at = format!("{name}:{number} {method_path}");
        let Some(method) = method_descriptor(pool, method_path) else {
            failures.push(format!(
                "{at}: the double's proto has no such method (the kubelet called it)"
            ));
            continue;
        };
        let short = method.name().to_owned();
        let mut request = line["request"].clone();
        rewrite_request(&mut request, &ids, scratch.path());
        let lost = check_modelled(method.input(), &request, &short, "request", unmodelled_seen);
        let request = match lost.and_then(|()| {
            from_json(method.input(), &request).map_err(|error| format!("parse: {error}"))
        }) {
            Ok(request) => request,
            Err(error) => {
                failures.push(format!("{at}: recorded request: {error}"));
                continue;
            }
        };
        let answer = call(&channel, &method, request.encode_to_vec()).await;
        let streamed = line.get("stream").and_then(Json::as_bool) == Some(true);
        let recorded: Vec<Json> = if streamed {
            line.get("responses")
                .and_then(Json::as_array)
                .cloned()
                .unwrap_or_default()
        } else {
            line.get("response").cloned().into_iter().collect()
        };
        let verdict = judge(
            &method,
            line.get("error"),
            &recorded,
            answer,
            &ids,
            unmodelled_seen,
        );
        match verdict {
            Ok(answers) => learn_ids(&short, &recorded, &answers, &mut ids),
            Err(why) => failures.push(format!("{at}: {why}")),
        }
    }
    // Let this runtime close the connection before the double's graceful stop waits for it.
    drop(channel);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    drop(cri);
    Replay {
        calls: lines.len(),
        failures,
    }
}

fn method_descriptor(pool: &DescriptorPool, path: &str) -> Option<MethodDescriptor> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    pool.get_service_by_name(service)?
        .methods()
        .find(|candidate| candidate.name() == method)
}

/// Compares one answer of the double with the recorded one; returns the answer's messages.
fn judge(
    method: &MethodDescriptor,
    recorded_error: Option<&Json>,
    recorded: &[Json],
    answer: Result<Vec<Vec<u8>>, tonic::Status>,
    ids: &HashMap<String, String>,
    unmodelled_seen: &mut BTreeSet<(&'static str, &'static str, &'static str)>,
) -> Result<Vec<DynamicMessage>, String> {
    let short = method.name();
    match (recorded_error, answer) {
        (Some(error), Err(status)) => {
            let code = error["code"].as_i64().unwrap_or(-1);
            if i64::from(i32::from(status.code())) != code {
                return Err(format!(
                    "answered {:?} ({}), recorded code {code} ({})",
                    status.code(),
                    status.message(),
                    error["message"]
                ));
            }
            let message = error["message"].as_str().unwrap_or_default();
            let expected = rewrite_ids(message, ids);
            if !message.starts_with(RECORDER_MESSAGE_PREFIX) && status.message() != expected {
                return Err(format!(
                    "answered {:?} with {:?}, recorded {expected:?}",
                    status.code(),
                    status.message()
                ));
            }
            Ok(Vec::new())
        }
        (Some(error), Ok(_)) => Err(format!("answered OK, recorded the error {error}")),
        (None, Err(status)) => Err(format!(
            "answered {:?} ({}), recorded OK",
            status.code(),
            status.message()
        )),
        (None, Ok(answers)) => {
            if answers.len() != recorded.len() {
                return Err(format!(
                    "answered {} messages, recorded {}",
                    answers.len(),
                    recorded.len()
                ));
            }
            let mut decoded = Vec::new();
            let mut differences = Vec::new();
            for (recorded, answer) in recorded.iter().zip(answers) {
                check_modelled(
                    method.output(),
                    recorded,
                    short,
                    "response",
                    unmodelled_seen,
                )?;
                let recorded = from_json(method.output(), recorded)
                    .map_err(|error| format!("recorded response: {error}"))?;
                let ours = DynamicMessage::decode(method.output(), answer.as_slice())
                    .map_err(|error| format!("the double's answer does not decode: {error}"))?;
                compare_messages("", &recorded, &ours, &mut differences);
                decoded.push(ours);
            }
            if differences.is_empty() {
                Ok(decoded)
            } else {
                let ours: Vec<Json> = decoded.iter().map(to_json).collect();
                Err(format!(
                    "shape differs: {}\n    recorded: {}\n    answered: {}",
                    differences.join("; "),
                    clip(&Json::from(recorded.to_vec()).to_string()),
                    clip(&Json::from(ours).to_string())
                ))
            }
        }
    }
}

/// The start of a long JSON text, for failure messages.
fn clip(text: &str) -> String {
    const MAX: usize = 1500;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}... ({} bytes)", &text[..end], text.len()),
        None => text.to_owned(),
    }
}

/// Maps the recorder's sandbox and container ids to the double's.
fn learn_ids(
    method: &str,
    recorded: &[Json],
    answers: &[DynamicMessage],
    ids: &mut HashMap<String, String>,
) {
    let field = match method {
        "RunPodSandbox" => "pod_sandbox_id",
        "CreateContainer" => "container_id",
        _ => return,
    };
    if let (Some(recorded), Some(ours)) = (recorded.first(), answers.first())
        && let (Some(theirs), Some(Json::String(ours))) =
            (recorded[field].as_str(), to_json(ours).get(field))
    {
        ids.insert(theirs.to_owned(), ours.clone());
    }
}

fn rewrite_ids(text: &str, ids: &HashMap<String, String>) -> String {
    ids.iter().fold(text.to_owned(), |text, (theirs, ours)| {
        text.replace(theirs, ours)
    })
}

/// Maps recorded ids to the double's, and moves `log_directory` under `scratch`.
fn rewrite_request(json: &mut Json, ids: &HashMap<String, String>, scratch: &Path) {
    match json {
        Json::Object(object) => {
            for (key, value) in object.iter_mut() {
                if key == "log_directory"
                    && let Json::String(dir) = value
                {
                    let moved: PathBuf = scratch.join("logs").join(dir.trim_start_matches('/'));
                    *dir = moved.display().to_string();
                } else {
                    rewrite_request(value, ids, scratch);
                }
            }
        }
        Json::Array(items) => {
            for item in items {
                rewrite_request(item, ids, scratch);
            }
        }
        Json::String(text) => {
            if let Some(ours) = ids.get(text.as_str()) {
                *text = ours.clone();
            }
        }
        _ => {}
    }
}

fn from_json(descriptor: MessageDescriptor, json: &Json) -> Result<DynamicMessage, String> {
    DynamicMessage::deserialize_with_options(
        descriptor,
        json.clone(),
        &DeserializeOptions::new().deny_unknown_fields(false),
    )
    .map_err(|error| error.to_string())
}

/// Protojson as the recorder wrote it: proto field names, defaults left out.
fn to_json(message: &DynamicMessage) -> Json {
    message
        .serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new().use_proto_field_name(true),
        )
        .expect("a dynamic message serialises")
}

/// Fails on a recorded field the proto drops (parsed and written back, it is gone) unless
/// [`UNMODELLED`] lists it; notes the listed ones it saw.
fn check_modelled(
    descriptor: MessageDescriptor,
    recorded: &Json,
    method: &str,
    side: &str,
    seen: &mut BTreeSet<(&'static str, &'static str, &'static str)>,
) -> Result<(), String> {
    let back = to_json(&from_json(descriptor, recorded)?);
    let mut lost = Vec::new();
    lost_paths("", recorded, &back, &mut lost);
    let mut unlisted = Vec::new();
    for path in lost {
        match UNMODELLED
            .iter()
            .find(|(m, s, p, _)| *m == method && *s == side && *p == path)
        {
            Some((m, s, p, _)) => {
                seen.insert((*m, *s, *p));
            }
            None => unlisted.push(path),
        }
    }
    if unlisted.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the {side} has fields the double's proto does not model, and UNMODELLED does not \
             list them: {unlisted:?}"
        ))
    }
}

/// The paths of `recorded` that `back` lacks (lists as `[]`).
fn lost_paths(path: &str, recorded: &Json, back: &Json, lost: &mut Vec<String>) {
    match (recorded, back) {
        (Json::Object(recorded), Json::Object(back)) => {
            for (key, value) in recorded {
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match back.get(key) {
                    Some(other) => lost_paths(&here, value, other, lost),
                    None => lost.push(here),
                }
            }
        }
        (Json::Array(recorded), Json::Array(back)) => {
            for (value, other) in recorded.iter().zip(back) {
                lost_paths(&format!("{path}[]"), value, other, lost);
            }
        }
        _ => {}
    }
}

#[test]
fn lost_paths_name_what_a_round_trip_dropped() {
    let recorded = serde_json::json!({
        "status": {"id": "a", "resources": {"linux": {}}, "mounts": [{"host_path": "/x", "image": {}}]},
    });
    let back = serde_json::json!({"status": {"id": "a", "mounts": [{"host_path": "/x"}]}});
    let mut lost = Vec::new();
    lost_paths("", &recorded, &back, &mut lost);
    lost.sort();
    assert_eq!(lost, ["status.mounts[].image", "status.resources"]);
}

/// Same fields set, same list lengths and map keys, same enum values; other scalars may differ.
fn compare_messages(
    path: &str,
    recorded: &DynamicMessage,
    ours: &DynamicMessage,
    differences: &mut Vec<String>,
) {
    for field in recorded.descriptor().fields() {
        let here = if path.is_empty() {
            field.name().to_owned()
        } else {
            format!("{path}.{}", field.name())
        };
        match (recorded.has_field(&field), ours.has_field(&field)) {
            (false, false) => {}
            (true, false) => differences.push(format!("{here} missing")),
            (false, true) => differences.push(format!("{here} not recorded")),
            (true, true) => compare_values(
                &here,
                &recorded.get_field(&field),
                &ours.get_field(&field),
                differences,
            ),
        }
    }
}

fn compare_values(path: &str, recorded: &Value, ours: &Value, differences: &mut Vec<String>) {
    match (recorded, ours) {
        (Value::Message(recorded), Value::Message(ours)) => {
            compare_messages(path, recorded, ours, differences);
        }
        (Value::List(recorded), Value::List(ours)) => {
            if recorded.len() == ours.len() {
                for (index, (recorded, ours)) in recorded.iter().zip(ours).enumerate() {
                    compare_values(&format!("{path}[{index}]"), recorded, ours, differences);
                }
            } else {
                differences.push(format!(
                    "{path}: {} items, recorded {}",
                    ours.len(),
                    recorded.len()
                ));
            }
        }
        (Value::Map(recorded), Value::Map(ours)) => {
            let keys = |map: &HashMap<prost_reflect::MapKey, Value>| -> BTreeSet<String> {
                map.keys().map(|key| format!("{key:?}")).collect()
            };
            if keys(recorded) != keys(ours) {
                differences.push(format!(
                    "{path}: keys {:?}, recorded {:?}",
                    keys(ours),
                    keys(recorded)
                ));
            }
            for (key, value) in recorded {
                if let Some(other) = ours.get(key) {
                    compare_values(&format!("{path}[{key:?}]"), value, other, differences);
                }
            }
        }
        (Value::EnumNumber(recorded), Value::EnumNumber(ours)) if recorded != ours => {
            differences.push(format!("{path}: enum {ours}, recorded {recorded}"));
        }
        _ => {}
    }
}

/// One call over the socket: unary, or server-streaming (collected to its end).
async fn call(
    channel: &tonic::transport::Channel,
    method: &MethodDescriptor,
    request: Vec<u8>,
) -> Result<Vec<Vec<u8>>, tonic::Status> {
    let path = format!("/{}/{}", method.parent_service().full_name(), method.name());
    let path = http::uri::PathAndQuery::try_from(path.as_str())
        .map_err(|error| tonic::Status::internal(error.to_string()))?;
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready()
        .await
        .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
    let request = tonic::Request::new(request);
    if method.is_server_streaming() {
        let mut stream = grpc
            .server_streaming(request, path, Raw)
            .await?
            .into_inner();
        let mut messages = Vec::new();
        while let Some(message) = stream.message().await? {
            messages.push(message);
        }
        Ok(messages)
    } else {
        Ok(vec![grpc.unary(request, path, Raw).await?.into_inner()])
    }
}

/// A codec that passes encoded messages through: the replay encodes and decodes them with
/// `prost-reflect`.
#[derive(Clone, Copy, Debug, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut bytes = vec![0; src.remaining()];
        src.copy_to_slice(&mut bytes);
        Ok(Some(bytes))
    }
}
