use sdk::slices::DeviceAttributes;

#[derive(DeviceAttributes)]
#[dra(crate = "sdk", domain = "gpu.example.com")]
struct Gpu {
    #[dra(capactiy)]
    memory: u64,
    #[dra(name = 5)]
    index: i64,
}

fn main() {}
