//! The example driver passes the SDK's conformance suite: every case, in process, with a
//! restart in the middle.

use dra_sdk_testing::cluster::NODE_NAME;
use dra_sdk_testing::conformance::Conformance;
use mock_gpu::{DEFAULT_DRIVER_NAME, MockGpuDriver};

#[tokio::test]
async fn the_mock_gpu_driver_is_conformant() {
    let driver = MockGpuDriver::new(DEFAULT_DRIVER_NAME, NODE_NAME, 4);
    let resources = driver.resources();
    let report = Conformance::in_process(DEFAULT_DRIVER_NAME, resources, move || driver.clone())
        .run()
        .await
        .expect("the conformance suite could not start");
    println!("{report}");
    // Every case runs and passes: a skipped case fails too.
    report.assert_all_passed();
}
