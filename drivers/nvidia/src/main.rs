//! `gpu-kubelet-plugin`: the NVIDIA DRA kubelet plugin.

fn main() {
    eprintln!("gpu-kubelet-plugin: not implemented yet");
    std::process::exit(2);
}
