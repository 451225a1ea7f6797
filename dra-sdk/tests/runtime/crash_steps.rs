//! SIGKILL of the plugin process at every named step of prepare and unprepare, many times
//! over, each followed by a restart: the claim is then either fully prepared (completed
//! record, valid CDI specs, device metadata, the driver's markers; a repeated prepare answers
//! from the checkpoint without calling the driver) or fully cleaned up (no record, spec,
//! metadata, marker or device status; a repeated prepare prepares it anew), and which of the
//! two is fixed by the step. The plugin is this test binary run again as a child
//! (`plugin_child`), killed by its own fault hook (`dra_sdk_testing::faults::process`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dra_sdk::claim::ClaimRef;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::faults::process::{
    CRASH_DRIVER, CrashHarness, PluginProcess, Step, Verdict, killed_by_sigkill, run_child_if_asked,
};
use dra_sdk_testing::kubelet::RegisteredPlugin;

/// Rounds over all steps: 15 x 14 steps = 210 kills.
const ROUNDS: u32 = 15;
/// Generous: a start takes tens of milliseconds, but the machine may be loaded.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The plugin child: does nothing unless started by the harness.
#[test]
fn plugin_child() {
    run_child_if_asked();
}

/// Which of the two states a kill at `step` must leave after the restart: a prepare killed
/// before its claims are recorded completed is rolled back, one killed after is served; an
/// unprepare killed before it changed anything leaves the claim prepared, one killed after it
/// recorded its start is finished by the restart.
fn expected(step: Step) -> Verdict {
    match step {
        Step::PrepareCompletedRecorded | Step::DeviceStatusWritten | Step::UnprepareLocked => {
            Verdict::FullyPrepared
        }
        _ => Verdict::FullyCleaned,
    }
}

/// Steps reached once per claim of a batch (the others once per batch).
fn per_claim(step: Step) -> bool {
    matches!(
        step,
        Step::DriverPrepared
            | Step::CdiSpecWritten
            | Step::MetadataWritten
            | Step::DeviceStatusWritten
            | Step::DriverUnprepared
            | Step::CdiSpecRemoved
            | Step::MetadataRemoved
            | Step::DeviceStatusCleared
    )
}

struct TestClaim {
    claim: ClaimRef,
    devices: Vec<&'static str>,
}

async fn new_claims(cluster: &TestCluster, prefix: &str, count: usize) -> Vec<TestClaim> {
    let mut claims = Vec::with_capacity(count);
    for i in 0..count {
        // One or two devices per claim.
        let devices: Vec<&'static str> = if i % 2 == 0 {
            vec!["dev-0"]
        } else {
            vec!["dev-0", "dev-1"]
        };
        let mut new = AllocatedClaim::new("default", format!("{prefix}-{i}"));
        for (index, device) in devices.iter().enumerate() {
            new = new.device(&format!("req-{index}"), CRASH_DRIVER, NODE_NAME, device);
        }
        let created = new.create(&cluster.client()).await.unwrap();
        claims.push(TestClaim {
            claim: claim_ref(&created).unwrap(),
            devices,
        });
    }
    claims
}

async fn start(
    harness: &CrashHarness,
    kill_at: Option<(Step, u32)>,
) -> (PluginProcess, RegisteredPlugin) {
    let mut process = harness.spawn(kill_at).unwrap();
    let kubelet = process.register(START_TIMEOUT).await.unwrap();
    (process, kubelet)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_at_every_step_of_prepare_and_unprepare_ends_fully_prepared_or_fully_cleaned() {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client();
    let harness = CrashHarness::new(&cluster, "crash_steps::plugin_child").unwrap();
    let began = Instant::now();

    // The kill plan, in order: every step in every round; batches of 1, 2 or 3 claims, and
    // for steps reached once per claim, the kill after the first, second or third claim.
    let mut plan = Vec::new();
    for round in 0..ROUNDS {
        for (index, step) in Step::ALL.into_iter().enumerate() {
            let batch = [1, 2, 1, 3, 1][(round as usize + index) % 5];
            let hit = if per_claim(step) {
                1 + round % batch as u32
            } else {
                1
            };
            plan.push((round, step, batch, hit));
        }
    }

    let mut kills = 0;
    let mut restarts = Duration::ZERO;
    let mut outcomes: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    let (mut process, mut kubelet) = start(&harness, Some((plan[0].1, plan[0].3))).await;
    for (at, &(round, step, batch, hit)) in plan.iter().enumerate() {
        let what = format!("round {round}, kill at {step} (hit {hit}, batch of {batch})");
        let claims = new_claims(
            &cluster,
            &format!("r{round}-{step}").replace('_', "-"),
            batch,
        )
        .await;
        let refs: Vec<ClaimRef> = claims.iter().map(|c| c.claim.clone()).collect();

        if step.is_prepare() {
            harness.arm(true).unwrap();
            assert!(
                kubelet.prepare(&refs).await.is_err(),
                "{what}: the prepare was answered; the plugin should have died"
            );
        } else {
            let prepared = kubelet.prepare(&refs).await.unwrap();
            assert!(prepared.values().all(Result::is_ok), "{what}: {prepared:?}");
            harness.arm(true).unwrap();
            assert!(
                kubelet.unprepare(&refs).await.is_err(),
                "{what}: the unprepare was answered; the plugin should have died"
            );
        }
        let status = process.wait_exit(START_TIMEOUT).await.unwrap();
        assert!(
            killed_by_sigkill(&status),
            "{what}: the child ended with {status}"
        );
        kills += 1;
        harness.arm(false).unwrap();

        // The restart (its recovery runs before it registers), armed for the next kill.
        let restart = Instant::now();
        let next = plan.get(at + 1).map(|&(_, step, _, hit)| (step, hit));
        (process, kubelet) = start(&harness, next).await;
        restarts += restart.elapsed();

        let want = expected(step);
        for claim in &claims {
            let uid = &claim.claim.uid;
            let on_disk = harness
                .claim_on_disk(&client, "default", &claim.claim.name, uid)
                .await;
            let verdict = on_disk.verdict(&claim.devices);
            assert_eq!(verdict, want, "{what}: claim {uid} after the restart");
            let counts = outcomes.entry(step.as_str()).or_default();
            match verdict {
                Verdict::FullyPrepared => counts.0 += 1,
                _ => counts.1 += 1,
            }
        }

        // The kubelet's retry of the call that failed, then (after a prepare) the claim's
        // unprepare, which must leave it fully cleaned up.
        if step.is_prepare() {
            let driver_calls: Vec<usize> = claims
                .iter()
                .map(|c| harness.calls("prepare", &c.claim.uid))
                .collect();
            let answered = kubelet.prepare(&refs).await.unwrap();
            for (claim, calls_before) in claims.iter().zip(driver_calls) {
                let uid = &claim.claim.uid;
                let devices = answered[uid].as_ref().unwrap_or_else(|error| {
                    panic!("{what}: retried prepare of {uid} failed: {error}")
                });
                let mut names: Vec<&str> = devices.iter().map(|d| d.device.as_str()).collect();
                names.sort_unstable();
                assert_eq!(names, claim.devices, "{what}: devices of {uid}");
                assert!(
                    devices.iter().all(|d| !d.cdi_device_ids.is_empty()),
                    "{what}: {devices:?}"
                );
                let calls = harness.calls("prepare", uid) - calls_before;
                match want {
                    // Served from the checkpoint: the driver is not asked again.
                    Verdict::FullyPrepared => assert_eq!(calls, 0, "{what}: {uid}"),
                    _ => assert_eq!(calls, 1, "{what}: {uid} is prepared anew"),
                }
                let on_disk = harness
                    .claim_on_disk(&client, "default", &claim.claim.name, uid)
                    .await;
                assert_eq!(
                    on_disk.verdict(&claim.devices),
                    Verdict::FullyPrepared,
                    "{what}: {uid} after the retried prepare"
                );
            }
        }
        let unprepared = kubelet.unprepare(&refs).await.unwrap();
        assert!(
            unprepared.values().all(Result::is_ok),
            "{what}: {unprepared:?}"
        );
        for claim in &claims {
            let uid = &claim.claim.uid;
            let on_disk = harness
                .claim_on_disk(&client, "default", &claim.claim.name, uid)
                .await;
            assert_eq!(
                on_disk.verdict(&claim.devices),
                Verdict::FullyCleaned,
                "{what}: {uid} after its unprepare"
            );
        }
    }
    drop(process);

    assert!(kills >= 200, "only {kills} kills");
    eprintln!(
        "{kills} kills in {:?}; restart to registration: {:?} on average; \
         (fully prepared, fully cleaned) per step: {outcomes:?}",
        began.elapsed(),
        restarts / kills
    );
}
