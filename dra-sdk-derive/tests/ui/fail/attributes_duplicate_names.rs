use sdk::slices::DeviceAttributes;

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Gpu {
    driver_version: String,
    #[dra(name = "driverVersion")]
    version: String,
    #[dra(capacity)]
    memory: u64,
    #[dra(capacity, name = "memory")]
    memory_bytes: u64,
}

fn main() {}
