//! The cases. Each returns its notes when it passes, or why it failed or was skipped.

use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use super::session::{REQUEST, Session, TestClaim, api_name, get_info};
use super::{Case, CaseResult, Verdict};
use crate::cdi_check::{self, Snapshot};
use crate::kubelet::{
    DraApi, GET_INFO_TIMEOUT, HealthApi, KubeletDevice, KubeletError, KubeletSimulator,
    KubeletVersion, ObservedHealth,
};
use dra_sdk::advanced::slices::SliceLimits;
use dra_sdk::claim::ClaimRef;

/// How often the registration case calls `GetInfo`.
const GET_INFO_CALLS: usize = 3;
/// Concurrent calls per round of the concurrency case, and rounds.
const CONCURRENT_CALLS: usize = 8;
const CONCURRENT_ROUNDS: usize = 3;
/// How long the first health message may take.
const FIRST_HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The services the kubelet knows, as plugins advertise them.
const V1_SERVICE: &str = "v1.DRAPlugin";
const V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";
const HEALTH_V1_SERVICE: &str = "v1.DRAResourceHealth";
const HEALTH_V1ALPHA1_SERVICE: &str = "v1alpha1.DRAResourceHealth";

/// An opaque config no driver registers.
fn unknown_config() -> serde_json::Value {
    json!({ "apiVersion": "conformance.dra-sdk.invalid/v1", "kind": "NoSuchConfig" })
}

macro_rules! fail {
    ($($arg:tt)*) => {
        return Err(Verdict::Fail(format!($($arg)*)))
    };
}

macro_rules! ensure {
    ($condition:expr, $($arg:tt)*) => {
        if !$condition {
            fail!($($arg)*);
        }
    };
}

pub(super) async fn run(case: Case, s: &mut Session) -> CaseResult {
    match case {
        Case::Registration => registration(s).await,
        Case::SlicesValid => slices_valid(s).await,
        Case::ApiVersions => api_versions(s).await,
        Case::PrepareIdempotent => prepare_idempotent(s).await,
        Case::UnprepareUnknown => unprepare_unknown(s).await,
        Case::EveryClaimAnswered => every_claim_answered(s).await,
        Case::BadConfigIsolated => bad_config_isolated(s).await,
        Case::ConcurrentPrepareUnprepare => concurrent_prepare_unprepare(s).await,
        Case::CdiSpecs => cdi_specs(s).await,
        Case::CdiIdsResolve => cdi_ids_resolve(s).await,
        Case::HealthStream => health_stream(s).await,
        Case::RestartKeepsClaims => restart_keeps_claims(s).await,
    }
}

fn release(version: KubeletVersion) -> &'static str {
    match version {
        KubeletVersion::V1_32 => "1.32",
        KubeletVersion::V1_33 => "1.33",
        KubeletVersion::V1_34 => "1.34",
        KubeletVersion::V1_35 => "1.35",
        KubeletVersion::V1_36 => "1.36",
        _ => "1.37",
    }
}

/// A device as the kubelet records it, in a form that compares regardless of order.
type DeviceKey = (String, String, Vec<String>, Vec<String>, Option<String>);

fn normalized(devices: &[KubeletDevice], with_share_id: bool) -> Vec<DeviceKey> {
    let mut keys: Vec<DeviceKey> = devices
        .iter()
        .map(|d| {
            let mut requests = d.request_names.clone();
            requests.sort();
            let mut ids = d.cdi_device_ids.clone();
            ids.sort();
            let share = if with_share_id {
                d.share_id.clone()
            } else {
                None
            };
            (d.pool.clone(), d.device.clone(), requests, ids, share)
        })
        .collect();
    keys.sort();
    keys
}

fn cdi_ids(devices: &[KubeletDevice]) -> BTreeSet<String> {
    devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter().cloned())
        .collect()
}

/// The answer names exactly the allocated devices, with base request names.
fn check_answer(claim: &TestClaim, devices: &[KubeletDevice]) -> Result<(), Verdict> {
    let answered: BTreeSet<(String, String)> = devices
        .iter()
        .map(|d| (d.pool.clone(), d.device.clone()))
        .collect();
    ensure!(
        answered == claim.devices,
        "prepare of {} answered devices {answered:?}, the allocation has {:?}",
        claim.reference.name,
        claim.devices
    );
    for device in devices {
        ensure!(
            device.request_names.iter().all(|name| name == REQUEST),
            "device {}/{} names requests {:?}; the claim has only request {REQUEST:?} (base names, never request/subrequest)",
            device.pool,
            device.device,
            device.request_names
        );
    }
    Ok(())
}

async fn registration(s: &mut Session) -> CaseResult {
    let mut notes = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut info = None;
    for _ in 0..GET_INFO_CALLS {
        let started = Instant::now();
        let answer = get_info(&s.registration)
            .await
            .map_err(|error| Verdict::Fail(format!("GetInfo: {error}")))?;
        slowest = slowest.max(started.elapsed());
        info = Some(answer);
    }
    let Some(info) = info else {
        fail!("GetInfo was not called");
    };
    ensure!(
        slowest < GET_INFO_TIMEOUT,
        "GetInfo took {slowest:?}, the kubelet gives up after {GET_INFO_TIMEOUT:?}"
    );
    notes.push(format!(
        "GetInfo answered {GET_INFO_CALLS} times, the slowest in {:.1} ms",
        slowest.as_secs_f64() * 1000.0
    ));
    ensure!(
        info.r#type == "DRAPlugin",
        "PluginInfo.type is {:?}; the kubelet hands only \"DRAPlugin\" to its DRA manager",
        info.r#type
    );
    if let Err(reason) = dra_sdk::k8s::NameRule::DriverName.check(&info.name) {
        fail!(
            "PluginInfo.name {:?} is not a valid DRA driver name: {reason}",
            info.name
        );
    }
    if let Some(expected) = s.expected_driver() {
        ensure!(
            info.name == expected,
            "PluginInfo.name is {:?}, the plugin was started as {expected:?}",
            info.name
        );
    }
    if info.endpoint.is_empty() {
        notes.push(
            "empty endpoint: the kubelet calls the DRA service on the registration socket".into(),
        );
    } else {
        let endpoint = PathBuf::from(&info.endpoint);
        ensure!(
            endpoint.is_absolute(),
            "PluginInfo.endpoint {:?} is not an absolute path",
            info.endpoint
        );
        match std::fs::metadata(&endpoint) {
            Ok(metadata) if metadata.file_type().is_socket() => {}
            Ok(_) => fail!(
                "PluginInfo.endpoint {} is not a Unix socket",
                endpoint.display()
            ),
            Err(error) => fail!("PluginInfo.endpoint {}: {error}", endpoint.display()),
        }
    }
    let known = [
        V1_SERVICE,
        V1BETA1_SERVICE,
        HEALTH_V1_SERVICE,
        HEALTH_V1ALPHA1_SERVICE,
    ];
    let unknown: Vec<&String> = info
        .supported_versions
        .iter()
        .filter(|v| !known.contains(&v.as_str()))
        .collect();
    if !unknown.is_empty() {
        notes.push(format!(
            "services no kubelet knows are ignored: {unknown:?}"
        ));
    }

    let mut accepted = Vec::new();
    for version in [
        KubeletVersion::V1_32,
        KubeletVersion::V1_33,
        KubeletVersion::V1_34,
        KubeletVersion::V1_35,
        KubeletVersion::V1_36,
        KubeletVersion::V1_37,
    ] {
        let kubelet = KubeletSimulator::new(version);
        // Only accepting kubelets run the handshake: a rejection would reach a plugin that a
        // real kubelet registered. Older kubelets need v1beta1, which api-versions checks.
        match kubelet.choose_api(&info) {
            Ok(_) => {}
            Err(reason) if matches!(version, KubeletVersion::V1_32 | KubeletVersion::V1_33) => {
                accepted.push(format!("{} rejects it ({reason})", release(version)));
                continue;
            }
            Err(reason) => fail!("kubelet {} rejects the plugin: {reason}", release(version)),
        }
        match kubelet.register(&s.registration).await {
            Ok(plugin) => accepted.push(format!(
                "{} uses {}{}",
                release(version),
                api_name(plugin.api),
                match plugin.health_api {
                    Some(HealthApi::V1) => " and health v1",
                    Some(HealthApi::V1alpha1) => " and health v1alpha1",
                    None => "",
                }
            )),
            Err(error) => fail!("kubelet {}: {error}", release(version)),
        }
    }
    notes.push(format!("kubelets: {}", accepted.join(", ")));
    Ok(notes)
}

async fn slices_valid(s: &mut Session) -> CaseResult {
    let published = s.published().await?;
    if published.slices.is_empty() {
        return Err(Verdict::Skip(format!(
            "{} publishes no ResourceSlices{}",
            s.driver(),
            s.api()?
                .node
                .as_deref()
                .map(|node| format!(" for node {node}"))
                .unwrap_or_default()
        )));
    }
    let limits = SliceLimits::for_optional_release(published.release);
    let problems = super::slices::check(&published.slices, s.driver(), &limits);
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    let devices: usize = published
        .slices
        .iter()
        .filter_map(|slice| slice.pointer("/spec/devices").and_then(|d| d.as_array()))
        .map(Vec::len)
        .sum();
    let release = published.release.map_or_else(
        || "an unknown release (strictest limits)".to_owned(),
        |r| format!("Kubernetes {r}"),
    );
    Ok(vec![format!(
        "{} slices with {devices} devices in {}, checked against {release}",
        published.slices.len(),
        published.api_version
    )])
}

async fn api_versions(s: &mut Session) -> CaseResult {
    let kubelet = s.kubelet()?;
    let advertised = &kubelet.info.supported_versions;
    let missing: Vec<&str> = [V1_SERVICE, V1BETA1_SERVICE]
        .into_iter()
        .filter(|service| !advertised.iter().any(|v| v == service))
        .collect();
    ensure!(
        missing.is_empty(),
        "PluginInfo.supported_versions {advertised:?} lacks {missing:?}: kubelets 1.32 and 1.33 speak only v1beta1, 1.34 and newer pick the plugin's first of v1 and v1beta1"
    );
    let v1 = s.kubelet_via(DraApi::V1)?;
    let v1beta1 = s.kubelet_via(DraApi::V1beta1)?;
    if !s.can_allocate() {
        for handle in [&v1, &v1beta1] {
            let unknown = s.unknown_claim();
            s.unprepare_via(handle, &[unknown]).await?;
        }
        return Ok(vec![
            "without claims (no API access or node) only NodeUnprepareResources was called".into(),
        ]);
    }
    for (this, other) in [(&v1, &v1beta1), (&v1beta1, &v1)] {
        let claim = s.new_claim(None).await?;
        let devices = s.prepare_one_via(this, &claim.reference).await?;
        check_answer(&claim, &devices)?;
        // The other version sees the same prepared claim.
        let again = s.prepare_one_via(other, &claim.reference).await?;
        ensure!(
            normalized(&devices, false) == normalized(&again, false),
            "a claim prepared through {} is answered differently through {}: {devices:?} vs {again:?}",
            api_name(this.api),
            api_name(other.api)
        );
        s.unprepare_via(this, std::slice::from_ref(&claim.reference))
            .await?;
    }
    Ok(vec![
        "prepared through each version, read back and unprepared through both".into(),
    ])
}

async fn prepare_idempotent(s: &mut Session) -> CaseResult {
    let claim = s.new_claim(None).await?;
    let first = s.prepare_one(&claim.reference).await?;
    check_answer(&claim, &first)?;
    let snapshot = |s: &Session| s.cdi_root().ok().map(Snapshot::take).transpose();
    let before = snapshot(s).map_err(Verdict::Fail)?;
    for attempt in 2..=3 {
        let again = s.prepare_one(&claim.reference).await?;
        ensure!(
            normalized(&first, true) == normalized(&again, true),
            "prepare #{attempt} of the same claim answered {again:?}, the first {first:?}"
        );
    }
    let mut notes = Vec::new();
    if let (Some(before), Some(after)) = (before, snapshot(s).map_err(Verdict::Fail)?) {
        let rewritten = after.changed_since(&before);
        if !rewritten.is_empty() {
            notes.push(format!(
                "repeated prepares rewrote {} with other content",
                cdi_check::display_paths(&rewritten.into_iter().collect::<Vec<_>>())
            ));
        }
    }
    s.unprepare(std::slice::from_ref(&claim.reference)).await?;
    Ok(notes)
}

async fn unprepare_unknown(s: &mut Session) -> CaseResult {
    let unknown = s.unknown_claim();
    s.unprepare(std::slice::from_ref(&unknown)).await?;
    if !s.can_allocate() {
        return Ok(vec![
            "only a claim that does not exist was checked (no API access or node)".into(),
        ]);
    }
    let never_prepared = s.new_claim(None).await?;
    s.unprepare(std::slice::from_ref(&never_prepared.reference))
        .await?;
    let prepared = s.new_claim(None).await?;
    s.prepare_one(&prepared.reference).await?;
    for _ in 0..2 {
        s.unprepare(std::slice::from_ref(&prepared.reference))
            .await?;
    }
    Ok(vec![
        "a nonexistent claim, an allocated claim never prepared, and a claim unprepared twice"
            .into(),
    ])
}

async fn every_claim_answered(s: &mut Session) -> CaseResult {
    let empty = s.prepare(&[]).await?;
    ensure!(
        empty.is_empty(),
        "an empty prepare batch got answers {empty:?}"
    );
    let mut good = Vec::new();
    if s.can_allocate() {
        for _ in 0..2 {
            good.push(s.new_claim(None).await?);
        }
    }
    let unknown = [s.unknown_claim(), s.unknown_claim()];
    let batch: Vec<ClaimRef> = good
        .iter()
        .map(|claim| claim.reference.clone())
        .chain(unknown.iter().cloned())
        .collect();
    // The simulator rejects answers with missing or extra claims, like the kubelet.
    let answer = s.prepare(&batch).await?;
    for claim in &good {
        match &answer[&claim.reference.uid] {
            Ok(devices) => check_answer(claim, devices)?,
            Err(error) => fail!("prepare of {} failed: {error}", claim.reference.name),
        }
    }
    for claim in &unknown {
        match &answer[&claim.uid] {
            Err(error) if !error.is_empty() => {}
            Err(_) => fail!(
                "prepare of the nonexistent claim {} failed without a message",
                claim.name
            ),
            Ok(devices) => fail!(
                "prepare of the nonexistent claim {} succeeded with {devices:?}",
                claim.name
            ),
        }
    }
    s.unprepare(&batch).await?;
    Ok(vec![format!(
        "a batch of {} allocated and {} nonexistent claims, and an empty batch",
        good.len(),
        unknown.len()
    )])
}

async fn bad_config_isolated(s: &mut Session) -> CaseResult {
    let good = s.new_claim(None).await?;
    let unknown_kind = s.new_claim(Some(unknown_config())).await?;
    let malformed = s
        .try_new_claim(Some(json!(["not", "an", "object"])))
        .await?;
    let mut notes = Vec::new();
    let mut bad = vec![("an unknown apiVersion/kind", unknown_kind.reference.clone())];
    match &malformed {
        Some(claim) => bad.push(("a non-object config", claim.reference.clone())),
        None => notes.push(
            "the API server refuses non-object configs, so only the unknown kind was checked"
                .into(),
        ),
    }
    let batch: Vec<ClaimRef> = std::iter::once(good.reference.clone())
        .chain(bad.iter().map(|(_, claim)| claim.clone()))
        .collect();
    let answer = s.prepare(&batch).await?;
    match &answer[&good.reference.uid] {
        Ok(devices) => check_answer(&good, devices)?,
        Err(error) => {
            fail!("the claim without config failed because of the others in its batch: {error}")
        }
    }
    for (what, claim) in &bad {
        match &answer[&claim.uid] {
            Err(error) if !error.is_empty() => notes.push(format!("{what}: {error}")),
            Err(_) => fail!("the claim with {what} failed without a message"),
            Ok(_) => fail!("the claim with {what} was prepared; it must fail with a message"),
        }
    }
    s.unprepare(&batch).await?;
    Ok(notes)
}

async fn concurrent_prepare_unprepare(s: &mut Session) -> CaseResult {
    let claim = s.new_claim(None).await?;
    let kubelet = s.kubelet()?;
    let claims = [claim.reference.clone()];
    let uid = claim.reference.uid.as_str();
    let mut reference: Option<Vec<DeviceKey>> = None;
    for _ in 0..CONCURRENT_ROUNDS {
        let calls = (0..CONCURRENT_CALLS).map(|i| {
            let (kubelet, claims) = (&kubelet, &claims);
            async move {
                if i % 2 == 0 {
                    let mut answer = kubelet.prepare(claims).await?;
                    Ok::<_, KubeletError>(Call::Prepare(answer.remove(uid)))
                } else {
                    let mut answer = kubelet.unprepare(claims).await?;
                    Ok(Call::Unprepare(answer.remove(uid)))
                }
            }
        });
        for result in futures::future::join_all(calls).await {
            match result {
                Err(error) => fail!("a concurrent call failed: {error}"),
                Ok(Call::Prepare(None) | Call::Unprepare(None)) => {
                    fail!("a concurrent call did not answer for the claim")
                }
                Ok(Call::Prepare(Some(Err(error)))) => {
                    fail!("a concurrent prepare failed: {error}")
                }
                Ok(Call::Unprepare(Some(Err(error)))) => {
                    fail!("a concurrent unprepare failed: {error}")
                }
                Ok(Call::Unprepare(Some(Ok(())))) => {}
                Ok(Call::Prepare(Some(Ok(devices)))) => {
                    let key = normalized(&devices, true);
                    match &reference {
                        Some(first) if *first != key => {
                            fail!("concurrent prepares answered differently: {first:?} vs {key:?}")
                        }
                        Some(_) => {}
                        None => reference = Some(key),
                    }
                }
            }
        }
    }
    // The claim is consistent afterwards: it prepares, its CDI devices resolve, it unprepares.
    let devices = s.prepare_one(&claim.reference).await?;
    check_answer(&claim, &devices)?;
    if let Ok(root) = s.cdi_root() {
        let snapshot = Snapshot::take(root).map_err(Verdict::Fail)?;
        let problems = cdi_check::unresolved(&snapshot, &cdi_ids(&devices));
        ensure!(
            problems.is_empty(),
            "after concurrent calls: {}",
            problems.join("\n")
        );
    }
    s.unprepare(&claims).await?;
    Ok(vec![format!(
        "{CONCURRENT_ROUNDS} rounds of {CONCURRENT_CALLS} concurrent calls, half prepare, half unprepare"
    )])
}

/// One call of the concurrency case and the answer for its claim.
enum Call {
    Prepare(Option<crate::kubelet::PrepareOutcome>),
    Unprepare(Option<Result<(), String>>),
}

/// Prepares two claims (or one if only one device is free) for the CDI cases.
async fn two_prepared_claims(
    s: &mut Session,
) -> Result<Vec<(TestClaim, Vec<KubeletDevice>)>, Verdict> {
    s.cdi_root()?;
    let first = s.new_claim(None).await?;
    let second = match s.new_claim(None).await {
        Ok(claim) => Some(claim),
        Err(Verdict::Skip(_)) => None,
        Err(fail) => return Err(fail),
    };
    let mut prepared = Vec::new();
    for claim in std::iter::once(first).chain(second) {
        let devices = s.prepare_one(&claim.reference).await?;
        check_answer(&claim, &devices)?;
        prepared.push((claim, devices));
    }
    Ok(prepared)
}

async fn cdi_specs(s: &mut Session) -> CaseResult {
    let root = s.cdi_root()?.to_path_buf();
    let before = Snapshot::take(&root).map_err(Verdict::Fail)?;
    let prepared = two_prepared_claims(s).await?;
    let after = Snapshot::take(&root).map_err(Verdict::Fail)?;
    let changed = after.changed_since(&before);
    let invalid = after.invalid_among(&changed);
    ensure!(invalid.is_empty(), "{}", invalid.join("\n"));

    let ids: Vec<BTreeSet<String>> = prepared.iter().map(|(_, d)| cdi_ids(d)).collect();
    let all: BTreeSet<String> = ids.iter().flatten().cloned().collect();
    if all.is_empty() && changed.is_empty() {
        return Ok(vec![
            "the driver returned no CDI IDs and wrote no spec files".into(),
        ]);
    }
    let problems = cdi_check::unresolved(&after, &all);
    ensure!(
        problems.is_empty(),
        "after prepare: {}",
        problems.join("\n")
    );
    // IDs every claim got (a driver's "common" device) stay while any claim uses them.
    let shared: BTreeSet<String> = ids
        .iter()
        .skip(1)
        .fold(ids.first().cloned().unwrap_or_default(), |acc, set| {
            acc.intersection(set).cloned().collect()
        });
    let shared = if prepared.len() > 1 {
        shared
    } else {
        BTreeSet::new()
    };

    for (index, (claim, _)) in prepared.iter().enumerate() {
        s.unprepare(std::slice::from_ref(&claim.reference)).await?;
        let now = Snapshot::take(&root).map_err(Verdict::Fail)?;
        let own: BTreeSet<String> = ids[index].difference(&shared).cloned().collect();
        let left = cdi_check::still_defined(&now, &own);
        ensure!(
            left.is_empty(),
            "after unprepare of {}: {}",
            claim.reference.name,
            left.join("\n")
        );
        if index + 1 < prepared.len() {
            let lost = cdi_check::unresolved(&now, &shared);
            ensure!(
                lost.is_empty(),
                "unprepare of {} removed devices other claims still use: {}",
                claim.reference.name,
                lost.join("\n")
            );
        }
    }
    let end = Snapshot::take(&root).map_err(Verdict::Fail)?;
    let left_behind: Vec<String> = changed
        .iter()
        .filter(|path| !before.contains(path) && end.contains(path))
        .filter(|path| !end.devices_of(path).is_subset(&shared))
        .map(|path| path.display().to_string())
        .collect();
    ensure!(
        left_behind.is_empty(),
        "spec files written by prepare are still there after unprepare: {}",
        left_behind.join(", ")
    );
    Ok(vec![format!(
        "{} claims, {} spec files written or changed, {} CDI IDs ({} shared)",
        prepared.len(),
        changed.len(),
        all.len(),
        shared.len()
    )])
}

async fn cdi_ids_resolve(s: &mut Session) -> CaseResult {
    let root = s.cdi_root()?.to_path_buf();
    let prepared = two_prepared_claims(s).await?;
    let snapshot = Snapshot::take(&root).map_err(Verdict::Fail)?;
    let mut problems = Vec::new();
    let mut without_ids = 0;
    for (claim, devices) in &prepared {
        for device in devices {
            if device.cdi_device_ids.is_empty() {
                without_ids += 1;
            }
        }
        problems.extend(
            cdi_check::unresolved(&snapshot, &cdi_ids(devices))
                .into_iter()
                .map(|problem| format!("claim {}: {problem}", claim.reference.name)),
        );
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    let claims: Vec<ClaimRef> = prepared.iter().map(|(c, _)| c.reference.clone()).collect();
    s.unprepare(&claims).await?;
    let mut notes = Vec::new();
    if without_ids > 0 {
        notes.push(format!("{without_ids} devices came without CDI IDs"));
    }
    Ok(notes)
}

async fn health_stream(s: &mut Session) -> CaseResult {
    let kubelet = s.kubelet()?;
    let listed = |name: &str| kubelet.info.supported_versions.iter().any(|v| v == name);
    // Every advertised version is checked: a 1.37 kubelet uses v1, 1.34-1.36 use v1alpha1.
    let advertised: Vec<HealthApi> = [
        (HEALTH_V1_SERVICE, HealthApi::V1),
        (HEALTH_V1ALPHA1_SERVICE, HealthApi::V1alpha1),
    ]
    .into_iter()
    .filter(|(name, _)| listed(name))
    .map(|(_, api)| api)
    .collect();
    if advertised.is_empty() {
        return match kubelet.watch_health_via(HealthApi::V1alpha1).await {
            Err(KubeletError::Rpc { status, .. })
                if status.code() == tonic::Code::Unimplemented =>
            {
                Ok(vec![
                    "not advertised, and NodeWatchResources answers Unimplemented: kubelet 1.36 \
                     opens it anyway and retries every 5 s"
                        .into(),
                ])
            }
            Err(error) => Ok(vec![format!("not advertised; NodeWatchResources: {error}")]),
            Ok(_) => Ok(vec![
                "not advertised, served quietly for kubelet 1.36, which opens it anyway".into(),
            ]),
        };
    }
    let mut notes = Vec::new();
    let mut lists: Vec<(HealthApi, Vec<ObservedHealth>)> = Vec::new();
    for api in advertised {
        let name = health_api_name(api);
        let mut watch = kubelet
            .watch_health_via(api)
            .await
            .map_err(|error| Verdict::Fail(format!("{name} is advertised, but {error}")))?;
        let first = match tokio::time::timeout(FIRST_HEALTH_TIMEOUT, watch.next()).await {
            Err(_) => fail!(
                "{name}: no device list within {FIRST_HEALTH_TIMEOUT:?} of opening the health stream"
            ),
            Ok(None) => {
                fail!("{name}: the plugin ended the health stream before sending a device list")
            }
            Ok(Some(Err(error))) => fail!("{name}: health stream: {error}"),
            Ok(Some(Ok(devices))) => devices,
        };
        check_health_list(s, name, &first).await?;
        notes.push(format!("{name}: first list with {} devices", first.len()));
        lists.push((api, first));
    }
    if let [(_, first), (_, second)] = lists.as_slice() {
        let devices = |list: &[ObservedHealth]| -> BTreeSet<(String, String)> {
            list.iter()
                .map(|e| (e.pool.clone(), e.device.clone()))
                .collect()
        };
        ensure!(
            devices(first) == devices(second),
            "v1 and v1alpha1 report different devices: {:?} and {:?}",
            devices(first),
            devices(second)
        );
        let states = |list: &[ObservedHealth]| -> BTreeSet<(String, String, String, String)> {
            list.iter()
                .map(|e| {
                    let status = format!("{:?}", e.status);
                    (e.pool.clone(), e.device.clone(), status, e.message.clone())
                })
                .collect()
        };
        if states(first) == states(second) {
            notes.push("v1 and v1alpha1 report the same device states".into());
        } else {
            // The two streams were opened one after the other: a change in between is legal.
            notes.push(
                "v1 and v1alpha1 differed in a device's state (changed between the two reads?)"
                    .into(),
            );
        }
    }
    Ok(notes)
}

fn health_api_name(api: HealthApi) -> &'static str {
    match api {
        HealthApi::V1 => HEALTH_V1_SERVICE,
        HealthApi::V1alpha1 => HEALTH_V1ALPHA1_SERVICE,
    }
}

/// One health list as the kubelet checks it: named, unique entries of published devices.
async fn check_health_list(
    s: &mut Session,
    service: &str,
    first: &[ObservedHealth],
) -> Result<(), Verdict> {
    let mut seen = BTreeSet::new();
    for entry in first {
        ensure!(
            !entry.pool.is_empty() && !entry.device.is_empty(),
            "{service}: a health entry has an empty pool or device name: {entry:?}"
        );
        ensure!(
            seen.insert((entry.pool.clone(), entry.device.clone())),
            "{service}: device {}/{} appears twice in one health list",
            entry.pool,
            entry.device
        );
    }
    if let Ok(published) = s.published().await {
        let devices: BTreeSet<(String, String)> = published
            .slices
            .iter()
            .flat_map(|slice| {
                let pool = slice
                    .pointer("/spec/pool/name")
                    .and_then(|p| p.as_str())
                    .unwrap_or_default()
                    .to_owned();
                slice
                    .pointer("/spec/devices")
                    .and_then(|d| d.as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(move |d| {
                        d.get("name")
                            .and_then(|n| n.as_str())
                            .map(|n| (pool.clone(), n.to_owned()))
                    })
            })
            .collect();
        let unpublished: Vec<String> = seen
            .difference(&devices)
            .map(|(pool, device)| format!("{pool}/{device}"))
            .collect();
        ensure!(
            unpublished.is_empty(),
            "{service}: the health stream reports devices the driver does not publish: {}",
            unpublished.join(", ")
        );
    }
    Ok(())
}

async fn restart_keeps_claims(s: &mut Session) -> CaseResult {
    if !s.is_in_process() {
        return Err(Verdict::Skip(
            "restarting the plugin needs an in-process target".into(),
        ));
    }
    let kept = s.new_claim(None).await?;
    let deleted = s.new_claim(None).await?;
    let kept_before = s.prepare_one(&kept.reference).await?;
    let deleted_before = s.prepare_one(&deleted.reference).await?;
    // Unprepare after the restart must not need the ResourceClaim.
    s.delete_claim(&deleted.reference)
        .await
        .map_err(Verdict::Fail)?;

    let started = Instant::now();
    s.restart().await?;
    let restart_time = started.elapsed();

    let kept_after = s.prepare_one(&kept.reference).await?;
    ensure!(
        normalized(&kept_before, true) == normalized(&kept_after, true),
        "after the restart a prepared claim is answered {kept_after:?}, before it was {kept_before:?}"
    );
    let root = s.cdi_root().ok().map(PathBuf::from);
    let snapshot = |root: &Option<PathBuf>| root.as_deref().map(Snapshot::take).transpose();
    let both: BTreeSet<String> = cdi_ids(&kept_before)
        .union(&cdi_ids(&deleted_before))
        .cloned()
        .collect();
    if let Some(now) = snapshot(&root).map_err(Verdict::Fail)? {
        let problems = cdi_check::unresolved(&now, &both);
        ensure!(
            problems.is_empty(),
            "after the restart: {}",
            problems.join("\n")
        );
    }
    s.unprepare(std::slice::from_ref(&deleted.reference))
        .await
        .map_err(|verdict| match verdict {
            Verdict::Fail(message) => Verdict::Fail(format!(
                "after the restart, with the ResourceClaim deleted: {message}"
            )),
            other => other,
        })?;
    if let Some(now) = snapshot(&root).map_err(Verdict::Fail)? {
        let own: BTreeSet<String> = cdi_ids(&deleted_before)
            .difference(&cdi_ids(&kept_before))
            .cloned()
            .collect();
        let left = cdi_check::still_defined(&now, &own);
        ensure!(
            left.is_empty(),
            "after the restart, unprepare left CDI devices behind: {}",
            left.join("\n")
        );
    }
    s.unprepare(std::slice::from_ref(&kept.reference)).await?;
    Ok(vec![format!(
        "restarted and registered again in {:.0} ms",
        restart_time.as_secs_f64() * 1000.0
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(pool: &str, name: &str, requests: &[&str]) -> KubeletDevice {
        KubeletDevice {
            request_names: requests.iter().map(|r| r.to_string()).collect(),
            pool: pool.into(),
            device: name.into(),
            cdi_device_ids: vec![format!("example.com/gpu=uid-{name}")],
            share_id: None,
        }
    }

    fn claim(devices: &[(&str, &str)]) -> TestClaim {
        TestClaim {
            reference: ClaimRef {
                uid: "uid".into(),
                namespace: "default".into(),
                name: "c".into(),
            },
            devices: devices
                .iter()
                .map(|(p, d)| (p.to_string(), d.to_string()))
                .collect(),
        }
    }

    #[test]
    fn answers_must_match_the_allocation() {
        let c = claim(&[("node", "gpu-0")]);
        assert!(check_answer(&c, &[device("node", "gpu-0", &[REQUEST])]).is_ok());
        assert!(check_answer(&c, &[device("node", "gpu-0", &[])]).is_ok());
        assert!(check_answer(&c, &[device("node", "gpu-1", &[REQUEST])]).is_err());
        assert!(check_answer(&c, &[]).is_err());
        assert!(check_answer(&c, &[device("node", "gpu-0", &["device/sub"])]).is_err());
    }

    #[test]
    fn comparison_ignores_order() {
        let a = [device("p", "a", &["x", "y"]), device("p", "b", &[])];
        let b = [device("p", "b", &[]), device("p", "a", &["y", "x"])];
        assert_eq!(normalized(&a, true), normalized(&b, true));
    }
}
