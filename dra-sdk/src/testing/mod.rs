//! Test doubles for driver authors: a fake API server and a kubelet simulator.

pub mod apiserver;
