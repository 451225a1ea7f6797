use std::collections::HashMap;

use sdk::slices::DeviceAttributes;

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Gpu {
    /// DRA integers are signed 64-bit.
    serial: u64,
    /// There is no float attribute.
    temperature: f64,
    labels: HashMap<String, String>,
    /// Lists do not nest.
    matrix: Vec<Vec<i64>>,
    /// A capacity needs `#[dra(capacity)]`.
    memory: sdk::slices::Quantity,
}

fn main() {}
