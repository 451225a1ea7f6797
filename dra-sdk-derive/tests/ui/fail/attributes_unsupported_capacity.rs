use sdk::slices::DeviceAttributes;

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Gpu {
    #[dra(capacity)]
    memory: String,
    #[dra(capacity)]
    cores: i32,
}

fn main() {}
