/// The chart checks every driver's chart tests share (`test-support/chart.rs` at the root).
#[path = "../../../../test-support/chart.rs"]
pub mod shared;

pub mod chart;
