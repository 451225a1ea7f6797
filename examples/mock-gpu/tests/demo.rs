//! The README's main command: the demo against the embedded cluster.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_allocates_prepares_and_cleans_up() {
    let report = mock_gpu::demo::run("gpu.example.com", 8).await.unwrap();
    assert!(report.contains("published 8 GPUs"), "{report}");
    assert!(
        report.contains("GPU_DEVICE_1_TIMESLICE_INTERVAL=Long"),
        "{report}"
    );
    assert!(
        report.contains("GPU_DEVICE_6_PARTITION_COUNT=4"),
        "{report}"
    );
    assert!(
        report.contains("unknown field `sharing.timeSlicingConfig.intervall`"),
        "{report}"
    );
    assert!(
        report.contains("4 claims allocated, 3 prepared, 1 failed (the bad config), 4 unprepared, 0 CDI spec files left"),
        "{report}"
    );
}
