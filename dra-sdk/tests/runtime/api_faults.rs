//! Prepare against a misbehaving API server, over the real sockets and HTTP: the claim read is
//! bounded by the claim read timeout (a stalled server fails the claim in time, never the
//! kubelet's 45 s call), transient errors (5xx, 429 with `Retry-After`, connections reset
//! mid-body) are retried inside that bound, and a claim whose read keeps failing gets an error
//! that names it and what happened. After each fault clears, the next prepare succeeds without
//! a restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dra_sdk::claim::ClaimRef;
use dra_sdk_testing::apiserver::{Fault, Verb};
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::kubelet::{CALL_TIMEOUT, KubeletVersion, PrepareOutcome, RegisteredPlugin};
use dra_sdk_testing::sample_driver::{DRIVER, GpuDriver};

/// Short, so that the tests stay fast; the default is 10 s.
const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// A generous ceiling for "answered in time" on a loaded CI machine: far below the kubelet's
/// 45 s, far above the 1 s bound.
const ANSWERED_WITHIN: Duration = Duration::from_secs(10);

struct Setup {
    cluster: TestCluster,
    kubelet: RegisteredPlugin,
    _plugin: dra_sdk::plugin::KubeletPlugin,
}

async fn setup(read_timeout: Duration) -> Setup {
    let cluster = TestCluster::start().await.unwrap();
    let plugin = cluster
        .plugin(Arc::new(GpuDriver::default()), DRIVER)
        .claim_read_timeout(read_timeout)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    Setup {
        cluster,
        kubelet,
        _plugin: plugin,
    }
}

async fn claim(cluster: &TestCluster, name: &str) -> ClaimRef {
    let claim = AllocatedClaim::new("default", name)
        .device("gpu", DRIVER, NODE_NAME, "gpu-0")
        .create(&cluster.client())
        .await
        .unwrap();
    claim_ref(&claim).unwrap()
}

/// Prepares one claim; its outcome and how long the kubelet waited.
async fn prepare(s: &Setup, claim: &ClaimRef) -> (PrepareOutcome, Duration) {
    let started = Instant::now();
    let mut outcomes = s
        .kubelet
        .prepare(std::slice::from_ref(claim))
        .await
        .expect("the kubelet's call itself must succeed: faults fail the claim, not the call");
    let outcome = outcomes
        .remove(&claim.uid)
        .expect("an answer for the claim");
    (outcome, started.elapsed())
}

fn claim_gets(cluster: &TestCluster) -> u64 {
    cluster.api().stats().resource("resourceclaims").get
}

#[tokio::test]
async fn prepare_answers_within_the_claim_read_timeout_when_the_api_server_stalls() {
    let s = setup(READ_TIMEOUT).await;
    let stalled = claim(&s.cluster, "stalled").await;
    // Far longer than the kubelet's own deadline: without the bound the call would hang.
    s.cluster.api().faults().inject(
        Fault::delayed(CALL_TIMEOUT * 2)
            .verb(Verb::Get)
            .resource("resourceclaims")
            .always(),
    );
    let (outcome, waited) = prepare(&s, &stalled).await;
    let error = outcome.unwrap_err();
    assert_contains(
        &error,
        "reading ResourceClaim default/stalled: timed out after 1s",
    );
    assert!(waited >= READ_TIMEOUT, "answered after {waited:?}");
    assert!(waited < ANSWERED_WITHIN, "answered after {waited:?}");

    // The server recovers: the kubelet's retry succeeds, no restart needed.
    s.cluster.api().faults().clear();
    let (outcome, _) = prepare(&s, &stalled).await;
    assert!(outcome.is_ok(), "{outcome:?}");
}

#[tokio::test]
async fn prepare_answers_a_seconds_slow_api_server_inside_the_timeout() {
    let s = setup(Duration::from_secs(5)).await;
    let slow = claim(&s.cluster, "slow").await;
    s.cluster.api().faults().inject(
        Fault::delayed(Duration::from_secs(1))
            .verb(Verb::Get)
            .resource("resourceclaims"),
    );
    let (outcome, waited) = prepare(&s, &slow).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(
        waited >= Duration::from_secs(1),
        "answered after {waited:?}"
    );
}

#[tokio::test]
async fn prepare_retries_5xx_and_resets_and_names_the_claim_when_they_persist() {
    // Room for a burst of retries (50 ms doubling, jittered) on a loaded machine.
    let s = setup(Duration::from_secs(3)).await;
    let faults = s.cluster.api().faults();
    let claim_reads = |f: Fault| f.verb(Verb::Get).resource("resourceclaims");

    // A burst of 500s and connections cut mid-body is retried inside the bound.
    let flaky = claim(&s.cluster, "flaky").await;
    faults.inject(claim_reads(Fault::status(500)));
    faults.inject(claim_reads(Fault::reset_mid_body()).times(2));
    faults.inject(claim_reads(Fault::status(502)));
    let (outcome, _) = prepare(&s, &flaky).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(faults.injected(), 4);

    // A server that keeps answering 500: the claim fails in time with the status.
    let failing = claim(&s.cluster, "failing").await;
    faults.inject(claim_reads(Fault::status(500)).always());
    let (outcome, waited) = prepare(&s, &failing).await;
    let error = outcome.unwrap_err();
    assert_contains(&error, "reading ResourceClaim default/failing");
    assert_contains(&error, "500");
    assert!(waited < ANSWERED_WITHIN, "answered after {waited:?}");

    // A connection that keeps dropping mid-body: the same, with the transport error.
    let cut = claim(&s.cluster, "cut").await;
    faults.clear();
    faults.inject(claim_reads(Fault::reset_mid_body()).always());
    let (outcome, waited) = prepare(&s, &cut).await;
    let error = outcome.unwrap_err();
    assert_contains(&error, "reading ResourceClaim default/cut");
    assert_contains(&error, "body");
    assert!(waited < ANSWERED_WITHIN, "answered after {waited:?}");

    // Recovered: both claims prepare on the kubelet's retry.
    faults.clear();
    for claim in [&failing, &cut] {
        let (outcome, _) = prepare(&s, claim).await;
        assert!(outcome.is_ok(), "{outcome:?}");
    }
}

#[tokio::test]
async fn prepare_honours_429_retry_after_within_the_claim_read_timeout() {
    let s = setup(Duration::from_secs(5)).await;
    let faults = s.cluster.api().faults();

    // Throttled once, asked to come back in 1 s: the read waits and succeeds.
    let throttled = claim(&s.cluster, "throttled").await;
    faults.inject(
        Fault::status(429)
            .retry_after(1)
            .verb(Verb::Get)
            .resource("resourceclaims"),
    );
    let (outcome, waited) = prepare(&s, &throttled).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(
        waited >= Duration::from_millis(900),
        "Retry-After ignored: answered after {waited:?}"
    );

    // Asked to come back in 30 s, past the bound: the claim fails in time, and the server saw
    // no stream of retries meanwhile.
    let told_to_wait = claim(&s.cluster, "told-to-wait").await;
    faults.inject(
        Fault::status(429)
            .retry_after(30)
            .verb(Verb::Get)
            .resource("resourceclaims")
            .always(),
    );
    let before = claim_gets(&s.cluster);
    let (outcome, waited) = prepare(&s, &told_to_wait).await;
    let error = outcome.unwrap_err();
    assert_contains(&error, "reading ResourceClaim default/told-to-wait");
    assert!(waited < ANSWERED_WITHIN, "answered after {waited:?}");
    let gets = claim_gets(&s.cluster) - before;
    assert!(gets <= 2, "{gets} GETs while told to wait 30 s");

    faults.clear();
    let (outcome, _) = prepare(&s, &told_to_wait).await;
    assert!(outcome.is_ok(), "{outcome:?}");
}
