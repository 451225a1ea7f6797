//! Without `#[dra(crate = "...")]` generated code names `::dra_sdk`, which does not exist
//! when the dependency is renamed (here it is `sdk`).

#[derive(sdk::slices::DeviceAttributes)]
struct Gpu {
    index: i64,
}

fn main() {}
