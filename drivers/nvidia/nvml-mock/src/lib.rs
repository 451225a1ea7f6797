//! A libnvidia-ml double: the NVML C functions the NVIDIA driver's `nvml` backend (and
//! nvml-wrapper under it) calls, serving a mock hardware profile, so that the NVML code path
//! runs in CI on machines without a GPU.
//!
//! Built as `libnvml_mock.so` (a `cdylib`). The backend loads it like the real library:
//!
//! ```no_run
//! use dra_driver_nvidia::backend::GpuBackend;
//! use dra_driver_nvidia::backend::nvml::NvmlBackend;
//! use nvml_mock::NvmlDouble;
//!
//! let double = NvmlDouble::new("dgx-h100")?;
//! let backend = NvmlBackend::open(double.library())?;
//! assert_eq!(backend.gpus()?.len(), 8);
//! double.lose_gpu(&backend.gpus()?[3].uuid)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! * [`NvmlDouble`] loads a private copy of the library (its own machine: tests run in
//!   parallel) and drives its control functions: inject an XID, lose a GPU, keep a MIG mode
//!   change pending, refuse event registration …
//! * [`FakePersistenced`] stands in for `nvidia-persistenced` on the same root: its socket,
//!   its RPC, and its hold on the GPUs it keeps in persistence mode, as `/proc` shows it.
//! * A process that loads the library by path (the plugin binary) picks the machine with
//!   `NVML_MOCK_PROFILE` (a shipped profile's name or a profile file) and
//!   `NVML_MOCK_ROOT` (the mock machine's root: while a handle on a GPU is live and NVML is
//!   initialised, the library holds `<root>/dev/nvidia<minor>` open, as the real one does).
//!
//! The machine is the mock backend's: the same profile files, the same MIG model (GPU and
//! compute instances change the state both backends read). What it implements of NVML, and
//! what it does not, is in `drivers/nvidia/docs/nvml-double.md`.

pub mod abi;
mod control;
mod handle;
mod machine;
mod persistenced;

pub use control::{DoubleError, NvmlDouble, built_library};
pub use machine::{GPU_INSTANCE_PROFILE_COUNT, PROFILE_ENV, ROOT_ENV, nvml_profile_index};
pub use persistenced::{FakePersistenced, PersistencedRequest, SOCKET as PERSISTENCED_SOCKET};
