use sdk::config::OpaqueConfig;

#[derive(serde::Deserialize, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", kind = "GpuConfig", hooks = false)]
struct GpuConfig {
    api_version: String,
    #[serde(rename = "kind")]
    sort: String,
}

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", kind = "Plain", hooks = false)]
struct Plain {
    kind: String,
    #[serde(alias = "apiVersion")]
    version: String,
}

#[derive(serde::Deserialize, OpaqueConfig)]
#[serde(tag = "kind")]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", kind = "Tagged", hooks = false)]
enum Tagged {
    A {},
}

fn main() {}
