//! The NVML backend (feature `nvml`): being written.
