use sdk::slices::DeviceAttributes;

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Common {
    index: i64,
}

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Gpu {
    #[dra(skip, capacity)]
    skipped_capacity: u64,
    #[dra(skip, name = "x")]
    skipped_named: u64,
    #[dra(flatten, capacity)]
    flattened_capacity: Common,
    #[dra(flatten, name = "common")]
    flattened_named: Common,
}

fn main() {}
