//! The soak bench's workload in short (`benches/soak.rs` runs 10,000 cycles): a few hundred
//! prepare/unprepare cycles of mixed claims (one, two and four devices, configs from the claim
//! and the class, a malformed config, a driver failure) through the plugin's socket, after
//! which the plugin's file descriptors and the runtime's tokio tasks are back at the baseline
//! taken before the first cycle, and no CDI spec is left.
//!
//! Descriptors are those under the test cluster's directory (the harness runs other tests in
//! this process); tasks those of this test's runtime. Resident memory is the bench's: here it
//! would be the whole test binary's.

use dra_sdk_testing::faults::leaks::soak::Soak;

#[tokio::test]
async fn prepare_unprepare_cycles_of_mixed_claims_return_fds_and_tasks_to_the_baseline() {
    let mut soak = Soak::start().await.unwrap();
    // `run` fails when descriptors or tasks stay above the baseline after the last cycle.
    let curve = soak.run(300, 3).await.unwrap();
    println!("{curve}");
    let (start, end) = (curve.start().unwrap(), curve.end().unwrap());
    assert!(end.within(&start), "{start} -> {end}");
    assert!(soak.driver_prepares() >= 300, "{}", soak.driver_prepares());
    soak.shutdown().await.unwrap();
}
