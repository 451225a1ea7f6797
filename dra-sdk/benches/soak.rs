//! Soak: 10,000 prepare/unprepare cycles of mixed claims through the plugin's real Unix
//! socket, against the fake API server over loopback HTTP (the workload:
//! `dra_sdk_testing::faults::leaks::soak`: one, two and four devices, configs from the claim
//! and the class, a malformed config, a driver failure; every fourth cycle all five in one
//! batch). Resident memory, open file descriptors and tokio tasks of this process are sampled
//! along the way and printed as three curves; the run fails when they grow past the bounds
//! below.
//!
//! Not a criterion bench: criterion repeats a short step until its timing is stable and
//! reports a mean, where a soak runs one long sequence once and reports how the process
//! changed over it. `harness = false` with a plain report does that.
//!
//! Run: `cargo bench -p dra-sdk --bench soak` (`SOAK_CYCLES=<n>` for another length).

use std::process::ExitCode;
use std::time::Instant;

use dra_sdk_testing::faults::leaks::LeakProbe;
use dra_sdk_testing::faults::leaks::soak::{Curve, Soak};

/// Cycles when `SOAK_CYCLES` is not set.
const CYCLES: usize = 10_000;
/// Samples between the first and the last.
const POINTS: usize = 10;
/// Growth of resident memory allowed from the first sample (after a warm-up) to the last: a
/// leak of one small allocation per cycle (100 bytes) over 10,000 cycles is about 1 MiB, one
/// per claim read (a few KiB) tens of MiB; the allocator's own arenas settle within the
/// warm-up and the first cycles.
const RSS_GROWTH_KIB: u64 = 4 * 1024;
/// Resident memory may grow at most this much over the second half of the run, where a
/// steady state has no reason to grow at all.
const RSS_SECOND_HALF_KIB: u64 = 1024;

fn main() -> ExitCode {
    let cycles = std::env::var("SOAK_CYCLES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(CYCLES);
    // Criterion's arguments (`--bench`) are passed to every bench; none applies here.
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("soak: starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let outcome = runtime.block_on(async {
        // This process runs nothing else: every descriptor is the plugin's, the API server's or
        // the simulated kubelet's.
        let mut soak = Soak::start().await?.with_probe(LeakProbe::current());
        let curve = soak.run(cycles, POINTS).await?;
        soak.shutdown().await?;
        Ok::<Curve, Box<dyn std::error::Error>>(curve)
    });
    let curve = match outcome {
        Ok(curve) => curve,
        Err(error) => {
            eprintln!("soak: FAILED: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "soak: {cycles} prepare/unprepare cycles of mixed claims in {:.1?}",
        started.elapsed()
    );
    print!("{curve}");
    match check(&curve) {
        Ok(summary) => {
            println!("soak: {summary}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("soak: FAILED: {failure}");
            ExitCode::FAILURE
        }
    }
}

/// The bounds: descriptors and tasks back at the start (`Soak::run` already waited for
/// that), resident memory within [`RSS_GROWTH_KIB`] overall and [`RSS_SECOND_HALF_KIB`] over
/// the second half.
fn check(curve: &Curve) -> Result<String, String> {
    let (Some(start), Some(end)) = (curve.start(), curve.end()) else {
        return Err("no samples".into());
    };
    let middle = curve.points[curve.points.len() / 2].1;
    let mib = |kib: u64| kib as f64 / 1024.0;
    if !end.within(&start) {
        return Err(format!("descriptors or tasks grew: {start} -> {end}"));
    }
    let growth = end.rss_kib.saturating_sub(start.rss_kib);
    if growth > RSS_GROWTH_KIB {
        return Err(format!(
            "resident memory grew by {:.1} MiB (bound {:.1} MiB): {start} -> {end}",
            mib(growth),
            mib(RSS_GROWTH_KIB)
        ));
    }
    let second_half = end.rss_kib.saturating_sub(middle.rss_kib);
    if second_half > RSS_SECOND_HALF_KIB {
        return Err(format!(
            "resident memory grew by {:.1} MiB over the second half (bound {:.1} MiB): {middle} -> {end}",
            mib(second_half),
            mib(RSS_SECOND_HALF_KIB)
        ));
    }
    Ok(format!(
        "flat: start {start}; end {end} (resident memory +{:.1} MiB, bound {:.1} MiB; second half +{:.1} MiB, bound {:.1} MiB)",
        mib(growth),
        mib(RSS_GROWTH_KIB),
        mib(second_half),
        mib(RSS_SECOND_HALF_KIB)
    ))
}
