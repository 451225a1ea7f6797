use sdk::slices::DeviceAttributes;

struct NotAttributes {
    index: i64,
}

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Gpu {
    #[dra(flatten)]
    common: NotAttributes,
}

fn main() {}
