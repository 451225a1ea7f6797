use sdk::slices::DeviceAttributes;

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
enum Device {
    Gpu { index: i64 },
}

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Tuple(i64);

#[derive(DeviceAttributes)]
#[dra(crate = "sdk")]
struct Unit;

fn main() {}
