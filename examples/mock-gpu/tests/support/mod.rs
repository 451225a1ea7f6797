/// The chart checks every driver's chart tests share.
pub(crate) use dra_sdk_testing::deliverables::chart as shared;

pub mod chart;
