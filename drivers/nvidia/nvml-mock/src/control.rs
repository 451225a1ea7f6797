//! [`NvmlDouble`]: a test's handle on a private copy of the double.

use std::ffi::{CString, c_char, c_uint, c_ulonglong};
use std::path::{Path, PathBuf};

use nvml_wrapper_sys::bindings as sys;

/// The library's file name.
const LIBRARY: &str = "libnvml_mock.so";

/// Overrides where the built library is looked for.
const LIBRARY_ENV: &str = "NVML_MOCK_LIBRARY";

/// Why the double could not be set up or driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DoubleError {
    /// The built library is not where a test build leaves it.
    #[error(
        "{LIBRARY} not found (looked in {looked}); build it with `cargo build -p nvml-mock` or \
         point {LIBRARY_ENV} at it"
    )]
    NotBuilt {
        /// The folders searched.
        looked: String,
    },
    /// Copying or loading the library failed.
    #[error("loading {path}: {reason}")]
    Load {
        /// The copy.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A control call returned an NVML error code.
    #[error("{call} returned NVML error {code}")]
    Control {
        /// The control function.
        call: &'static str,
        /// NVML's code.
        code: u32,
    },
}

/// A private copy of the double, configured with a profile. The NVML backend opens
/// [`NvmlDouble::library`]; the control methods change what that library reports.
///
/// Each copy is its own file, so the dynamic loader gives it its own state: tests that each
/// hold a double do not see each other's machines.
pub struct NvmlDouble {
    library: PathBuf,
    lib: libloading::Library,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for NvmlDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlDouble")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

/// The built library: `NVML_MOCK_LIBRARY`, else beside the running test executable
/// (`target/<profile>/deps`) or one folder up (`target/<profile>`).
pub fn built_library() -> Result<PathBuf, DoubleError> {
    if let Some(path) = std::env::var_os(LIBRARY_ENV) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|error| DoubleError::NotBuilt {
        looked: format!("the test executable's folder ({error})"),
    })?;
    let folders: Vec<&Path> = exe.ancestors().skip(1).take(2).collect();
    folders
        .iter()
        .map(|folder| folder.join(LIBRARY))
        .find(|path| path.is_file())
        .ok_or_else(|| DoubleError::NotBuilt {
            looked: folders
                .iter()
                .map(|folder| folder.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

impl NvmlDouble {
    /// A double serving `profile` (a shipped profile's name or a profile file), opening no
    /// device nodes.
    pub fn new(profile: &str) -> Result<Self, DoubleError> {
        Self::load(profile, None)
    }

    /// A double serving `profile` whose GPUs' device nodes are `<root>/dev/nvidia<minor>`
    /// (a mock host tree), held open while NVML holds a handle on them.
    pub fn with_root(profile: &str, root: &Path) -> Result<Self, DoubleError> {
        Self::load(profile, Some(root))
    }

    fn load(profile: &str, root: Option<&Path>) -> Result<Self, DoubleError> {
        let built = built_library()?;
        let dir = tempfile::Builder::new()
            .prefix("nvml-mock-")
            .tempdir()
            .map_err(|error| DoubleError::Load {
                path: built.clone(),
                reason: error.to_string(),
            })?;
        let library = dir.path().join(LIBRARY);
        let load_error = |error: &dyn std::fmt::Display| DoubleError::Load {
            path: library.clone(),
            reason: error.to_string(),
        };
        std::fs::copy(&built, &library).map_err(|error| load_error(&error))?;
        // SAFETY: the double's initialisers are Rust statics with const initialisers; loading
        // it runs no code of ours.
        let lib =
            unsafe { libloading::Library::new(&library) }.map_err(|error| load_error(&error))?;
        let double = Self {
            library,
            lib,
            _dir: dir,
        };
        let profile = cstring(profile)?;
        let root = root
            .map(|root| cstring(&root.display().to_string()))
            .transpose()?;
        let root_ptr = root.as_ref().map_or(std::ptr::null(), |root| root.as_ptr());
        // SAFETY: the symbol has this signature (abi.rs); both strings outlive the call.
        double.call("nvmlMockConfigure", |lib| unsafe {
            let configure = lib.get::<unsafe extern "C" fn(*const c_char, *const c_char) -> u32>(
                b"nvmlMockConfigure\0",
            )?;
            Ok(configure(profile.as_ptr(), root_ptr))
        })?;
        Ok(double)
    }

    /// The library file to open with `NvmlBackend::open`.
    pub fn library(&self) -> &Path {
        &self.library
    }

    fn call(
        &self,
        name: &'static str,
        call: impl FnOnce(&libloading::Library) -> Result<u32, libloading::Error>,
    ) -> Result<(), DoubleError> {
        let code = call(&self.lib).map_err(|error| DoubleError::Load {
            path: self.library.clone(),
            reason: error.to_string(),
        })?;
        if code == sys::nvmlReturn_enum_NVML_SUCCESS {
            Ok(())
        } else {
            Err(DoubleError::Control { call: name, code })
        }
    }

    fn on_gpu(
        &self,
        name: &'static str,
        uuid: &str,
        call: impl FnOnce(&libloading::Library, *const c_char) -> Result<u32, libloading::Error>,
    ) -> Result<(), DoubleError> {
        let uuid = cstring(uuid)?;
        self.call(name, |lib| call(lib, uuid.as_ptr()))
    }

    /// A critical XID on a GPU, or inside one of its MIG devices (`Some((gi, ci))`).
    pub fn inject_xid(
        &self,
        gpu_uuid: &str,
        xid: u64,
        mig: Option<(u32, u32)>,
    ) -> Result<(), DoubleError> {
        let (gi, ci) = mig.unwrap_or((u32::MAX, u32::MAX));
        self.inject(
            gpu_uuid,
            sys::nvmlEventTypeXidCriticalError.into(),
            xid,
            gi,
            ci,
        )
    }

    /// A double-bit ECC error on a GPU.
    pub fn inject_double_bit_ecc(&self, gpu_uuid: &str) -> Result<(), DoubleError> {
        self.inject(
            gpu_uuid,
            sys::nvmlEventTypeDoubleBitEccError.into(),
            0,
            u32::MAX,
            u32::MAX,
        )
    }

    fn inject(
        &self,
        uuid: &str,
        kind: u64,
        data: u64,
        gi: u32,
        ci: u32,
    ) -> Result<(), DoubleError> {
        type Inject =
            unsafe extern "C" fn(*const c_char, c_ulonglong, c_ulonglong, c_uint, c_uint) -> u32;
        // SAFETY: the symbol has this signature (abi.rs); the string outlives the call.
        self.on_gpu("nvmlMockInjectEvent", uuid, |lib, uuid| unsafe {
            Ok(lib.get::<Inject>(b"nvmlMockInjectEvent\0")?(
                uuid, kind, data, gi, ci,
            ))
        })
    }

    /// The GPU falls off the bus: every NVML call on it returns `GPU_IS_LOST`.
    pub fn lose_gpu(&self, gpu_uuid: &str) -> Result<(), DoubleError> {
        self.uuid_only("nvmlMockLoseGpu", gpu_uuid)
    }

    /// Event registration on this GPU fails (`NOT_SUPPORTED`).
    pub fn refuse_events(&self, gpu_uuid: &str) -> Result<(), DoubleError> {
        self.uuid_only("nvmlMockRefuseEvents", gpu_uuid)
    }

    /// Memory queries on this GPU return `NOT_SUPPORTED`.
    pub fn memory_not_supported(&self, gpu_uuid: &str) -> Result<(), DoubleError> {
        self.uuid_only("nvmlMockMemoryNotSupported", gpu_uuid)
    }

    fn uuid_only(&self, name: &'static str, uuid: &str) -> Result<(), DoubleError> {
        let symbol = format!("{name}\0");
        // SAFETY: every control function named here takes one string (abi.rs); the string
        // outlives the call.
        self.on_gpu(name, uuid, |lib, uuid| unsafe {
            Ok(lib.get::<unsafe extern "C" fn(*const c_char) -> u32>(
                symbol.as_bytes(),
            )?(uuid))
        })
    }

    fn uuid_and_int(&self, name: &'static str, uuid: &str, value: u32) -> Result<(), DoubleError> {
        let symbol = format!("{name}\0");
        // SAFETY: every control function named here takes a string and a 32-bit integer
        // (abi.rs: `c_int` and `c_uint` have one ABI); the string outlives the call.
        self.on_gpu(name, uuid, |lib, uuid| unsafe {
            Ok(lib
                .get::<unsafe extern "C" fn(*const c_char, c_uint) -> u32>(
                    symbol.as_bytes(),
                )?(uuid, value))
        })
    }

    /// A process holds the GPU (or lets go): MIG mode changes stay pending, with activation
    /// status `IN_USE`.
    pub fn set_busy(&self, gpu_uuid: &str, busy: bool) -> Result<(), DoubleError> {
        self.uuid_and_int("nvmlMockSetBusy", gpu_uuid, u32::from(busy))
    }

    /// The GPU is bound to vfio-pci (or back to nvidia): NVML no longer enumerates it.
    pub fn set_detached(&self, gpu_uuid: &str, detached: bool) -> Result<(), DoubleError> {
        self.uuid_and_int("nvmlMockSetDetached", gpu_uuid, u32::from(detached))
    }

    /// The GPU reports a raw brand value nvml-wrapper does not know.
    pub fn set_raw_brand(&self, gpu_uuid: &str, brand: u32) -> Result<(), DoubleError> {
        self.uuid_and_int("nvmlMockSetRawBrand", gpu_uuid, brand)
    }

    /// Placement queries for this GPU-instance profile ID fail (`NOT_SUPPORTED`).
    pub fn refuse_placements(&self, gpu_uuid: &str, profile_id: u32) -> Result<(), DoubleError> {
        self.uuid_and_int("nvmlMockRefusePlacements", gpu_uuid, profile_id)
    }

    /// Sets the GPU's MIG mode outside NVML, as an operator or a reset would: with MIG off,
    /// its GPU instances are gone.
    pub fn set_mig_mode_outside(&self, gpu_uuid: &str, enabled: bool) -> Result<(), DoubleError> {
        self.uuid_and_int("nvmlMockSetMigMode", gpu_uuid, u32::from(enabled))
    }

    /// The GPU reports this NVML recovery action (field 230: 0 none, 1 GPU reset, 2 node
    /// reboot, 3 drain P2P, 4 drain and reset).
    pub fn set_recovery_action(&self, gpu_uuid: &str, action: u32) -> Result<(), DoubleError> {
        self.uuid_and_int("nvmlMockSetRecoveryAction", gpu_uuid, action)
    }

    /// Sets the GPU's persistence mode (the driver's own setting) outside NVML, as
    /// `nvidia-smi -pm` or a boot script would.
    pub fn set_persistence(&self, gpu_uuid: &str, enabled: bool) -> Result<(), DoubleError> {
        self.uuid_and_int("nvmlMockSetPersistence", gpu_uuid, u32::from(enabled))
    }

    /// Changes of the GPU's persistence mode through NVML fail with `NO_PERMISSION`.
    pub fn refuse_persistence(&self, gpu_uuid: &str) -> Result<(), DoubleError> {
        self.uuid_only("nvmlMockRefusePersistence", gpu_uuid)
    }

    /// `nvmlInit` calls not yet matched by `nvmlShutdown`.
    pub fn init_count(&self) -> Result<u32, DoubleError> {
        self.counter(b"nvmlMockInitCount\0")
    }

    /// GPU device nodes the library holds open.
    pub fn open_node_count(&self) -> Result<u32, DoubleError> {
        self.counter(b"nvmlMockOpenNodeCount\0")
    }

    fn counter(&self, symbol: &[u8]) -> Result<u32, DoubleError> {
        // SAFETY: both counters take nothing and return an unsigned int (abi.rs).
        unsafe { self.lib.get::<unsafe extern "C" fn() -> c_uint>(symbol) }
            .map(|counter| {
                // SAFETY: as above.
                unsafe { counter() }
            })
            .map_err(|error| DoubleError::Load {
                path: self.library.clone(),
                reason: error.to_string(),
            })
    }
}

fn cstring(text: &str) -> Result<CString, DoubleError> {
    CString::new(text).map_err(|_| DoubleError::Control {
        call: "a string argument with a NUL byte",
        code: sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    })
}
