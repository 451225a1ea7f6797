//! The exported C functions: NVML's (the ones the NVML backend and nvml-wrapper call, with
//! nvml-wrapper-sys's signatures) and the double's control functions (`nvmlMock*`).
//!
//! Each function turns its handles and pointers into a call on the emulated driver, then writes
//! the answer through the caller's out-pointers. A null out-pointer is `INVALID_ARGUMENT`,
//! as in NVML.
//!
//! # Safety
//!
//! The contract of every function is NVML's: out-pointers are null or valid for one value
//! of their type (arrays: for the count the caller passes), strings are NUL-terminated, and
//! buffers are valid for the length passed.

#![allow(clippy::missing_safety_doc)] // NVML's contract, stated once above
#![allow(non_snake_case)] // NVML's names

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::path::PathBuf;
use std::time::Duration;

use dra_driver_nvidia::backend::MigPlacement;
use nvml_wrapper_sys::bindings::{
    nvmlBrandType_t, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_t, nvmlDevice_t,
    nvmlDeviceAttributes_t, nvmlEnableState_enum_NVML_FEATURE_DISABLED,
    nvmlEnableState_enum_NVML_FEATURE_ENABLED, nvmlEnableState_t, nvmlEventData_t, nvmlEventSet_t,
    nvmlFieldValue_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t, nvmlMemory_t,
    nvmlMemory_v2_t, nvmlPciInfo_t, nvmlReturn_t,
};

use crate::handle::Handle;
use crate::machine::{
    self, ARGUMENT_VERSION_MISMATCH, Code, Event, INSUFFICIENT_SIZE, INVALID_ARGUMENT, Machine,
    SUCCESS, UNINITIALIZED,
};

/// Runs `call` on the machine; `UNINITIALIZED` when none was ever configured.
fn with<T>(call: impl FnOnce(&mut Machine) -> Result<T, Code>) -> Result<T, Code> {
    match machine::lock().as_mut() {
        Some(machine) => call(machine),
        None => Err(UNINITIALIZED),
    }
}

/// Writes a result through an out-pointer.
unsafe fn put<T>(result: Result<T, Code>, out: *mut T) -> Code {
    match result {
        Ok(_) if out.is_null() => INVALID_ARGUMENT,
        Ok(value) => {
            // SAFETY: `out` is non-null and, by NVML's contract, valid for one `T`.
            unsafe { out.write(value) };
            SUCCESS
        }
        Err(code) => code,
    }
}

/// Copies `text` and its NUL into a caller's buffer of `length` bytes.
unsafe fn put_text(result: Result<String, Code>, buffer: *mut c_char, length: c_uint) -> Code {
    let text = match result {
        Ok(text) => text,
        Err(code) => return code,
    };
    if buffer.is_null() {
        return INVALID_ARGUMENT;
    }
    if text.len() + 1 > length as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the buffer is valid for `length` bytes (NVML's contract) and `length` leaves
    // room for the text and its NUL; the regions cannot overlap (ours is a fresh String).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buffer, text.len());
        buffer.add(text.len()).write(0);
    }
    SUCCESS
}

/// A caller's NUL-terminated string.
unsafe fn text<'a>(pointer: *const c_char) -> Result<&'a str, Code> {
    if pointer.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated by NVML's contract.
    unsafe { CStr::from_ptr(pointer) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

fn handle<T>(pointer: *mut T) -> Result<Handle, Code> {
    Handle::from_ptr(pointer).ok_or(INVALID_ARGUMENT)
}

/// The GPU a physical-GPU handle names.
fn gpu<T>(pointer: *mut T) -> Result<u32, Code> {
    match handle(pointer)? {
        Handle::Gpu(gpu) => Ok(gpu),
        _ => Err(INVALID_ARGUMENT),
    }
}

fn gpu_instance(pointer: nvmlGpuInstance_t) -> Result<(u32, u32), Code> {
    match handle(pointer)? {
        Handle::GpuInstance(gpu, gi) => Ok((gpu, gi)),
        _ => Err(INVALID_ARGUMENT),
    }
}

fn compute_instance(pointer: nvmlComputeInstance_t) -> Result<(u32, u32, u32), Code> {
    match handle(pointer)? {
        Handle::ComputeInstance(gpu, gi, ci) => Ok((gpu, gi, ci)),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// NVML's versioned-struct check: `size | version << 24`.
fn versioned<T>(version: c_uint, expected: u32) -> Result<(), Code> {
    if version == (std::mem::size_of::<T>() as u32) | (expected << 24) {
        Ok(())
    } else {
        Err(ARGUMENT_VERSION_MISMATCH)
    }
}

// ---- initialisation ------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    nvmlInitWithFlags(0)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    Machine::init(&mut machine::lock(), flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    with(|machine| Ok(machine.shutdown())).unwrap_or_else(|code| code)
}

/// NVML's text for the codes the double returns.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let text = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        19 => c"In use by another client",
        23 => c"Insufficient resources",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

// ---- system ---------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on `version` and `length`.
    unsafe { put_text(with(|machine| machine.driver_version()), version, length) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: NVML's contract on `version`.
    unsafe { put(with(|machine| machine.cuda_driver_version()), version) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    // SAFETY: as above.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    // SAFETY: NVML's contract on `count`.
    unsafe { put(with(|machine| machine.gpu_count()), count) }
}

// ---- handles --------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let result = with(|machine| machine.gpu_by_index(index)).map(|gpu| Handle::Gpu(gpu).to_ptr());
    // SAFETY: NVML's contract on `device`.
    unsafe { put(result, device) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on `uuid`.
    let result = unsafe { text(uuid) }
        .and_then(|uuid| with(|machine| machine.gpu_by_uuid(uuid)))
        .map(Handle::to_ptr);
    // SAFETY: NVML's contract on `device`.
    unsafe { put(result, device) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on `bus_id`.
    let result = unsafe { text(bus_id) }
        .and_then(|bus_id| with(|machine| machine.gpu_by_pci_bus_id(bus_id)))
        .map(|gpu| Handle::Gpu(gpu).to_ptr());
    // SAFETY: NVML's contract on `device`.
    unsafe { put(result, device) }
}

// ---- device queries -------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    let result = handle(device).and_then(|handle| {
        with(|machine| match handle {
            Handle::Gpu(gpu) => Ok(machine.gpu(gpu)?.uuid.clone()),
            Handle::MigDevice(..) => Ok(machine.mig_device(handle)?.uuid),
            _ => Err(INVALID_ARGUMENT),
        })
    });
    // SAFETY: NVML's contract on `uuid` and `length`.
    unsafe { put_text(result, uuid, length) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| with(|machine| machine.index_of(gpu)));
    // SAFETY: NVML's contract on `index`.
    unsafe { put(result, index) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| with(|machine| Ok(machine.gpu(gpu)?.minor)));
    // SAFETY: NVML's contract on `minor`.
    unsafe { put(result, minor) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    let result =
        gpu(device).and_then(|gpu| with(|machine| Ok(machine.gpu(gpu)?.product_name.clone())));
    // SAFETY: NVML's contract on `name` and `length`.
    unsafe { put_text(result, name, length) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    brand: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| with(|machine| machine.brand(gpu)));
    // SAFETY: NVML's contract on `brand`.
    unsafe { put(result, brand) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    let result =
        gpu(device).and_then(|gpu| with(|machine| Ok(machine.gpu(gpu)?.cuda_compute_capability)));
    match result {
        Ok(capability) => {
            // SAFETY: NVML's contract on `major` and `minor`.
            let code = unsafe { put(Ok(capability.major as c_int), major) };
            if code != SUCCESS {
                return code;
            }
            // SAFETY: as above.
            unsafe { put(Ok(capability.minor as c_int), minor) }
        }
        Err(code) => code,
    }
}

fn memory_bytes(device: nvmlDevice_t) -> Result<u64, Code> {
    handle(device).and_then(|handle| with(|machine| machine.memory(handle)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    let result = memory_bytes(device).map(|total| nvmlMemory_t {
        total,
        free: total,
        used: 0,
    });
    // SAFETY: NVML's contract on `memory`.
    unsafe { put(result, memory) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    if memory.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid for one struct (NVML's contract); the caller set `version`.
    let version = unsafe { (*memory).version };
    let result = versioned::<nvmlMemory_v2_t>(version, 2)
        .and_then(|()| memory_bytes(device))
        .map(|total| nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total,
            used: 0,
        });
    // SAFETY: as above.
    unsafe { put(result, memory) }
}

/// Fills a fixed C char array with `text` and a NUL (truncated to fit).
fn fill<const N: usize>(text: &str) -> [c_char; N] {
    let mut array = [0 as c_char; N];
    for (slot, byte) in array.iter_mut().zip(text.bytes().take(N - 1)) {
        *slot = byte as c_char;
    }
    array
}

/// NVML's PCI info for a bus ID in the sysfs form (`0000:1b:00.0`, as profiles write it):
/// NVML prints an 8-digit domain, upper case (`00000000:1B:00.0`), and the legacy form with 4.
fn pci_info(
    bus_id: &str,
    pci_device_id: u32,
    pci_sub_system_id: u32,
) -> Result<nvmlPciInfo_t, Code> {
    let number = |at: usize, len: usize| {
        bus_id
            .get(at..at + len)
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .ok_or(INVALID_ARGUMENT)
    };
    let (domain, bus, slot) = (number(0, 4)?, number(5, 2)?, number(8, 2)?);
    let function = number(11, 1)?;
    Ok(nvmlPciInfo_t {
        busIdLegacy: fill(&format!("{domain:04X}:{bus:02X}:{slot:02X}.{function:X}")),
        domain,
        bus,
        device: slot,
        pciDeviceId: pci_device_id,
        pciSubSystemId: pci_sub_system_id,
        busId: fill(&format!("{domain:08X}:{bus:02X}:{slot:02X}.{function:X}")),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| {
        with(|machine| {
            let info = &machine.gpu(gpu)?.pci;
            pci_info(
                &info.bus_id,
                u32::from(info.device_id) << 16 | u32::from(info.vendor_id),
                info.subsystem_id.unwrap_or(0),
            )
        })
    });
    // SAFETY: NVML's contract on `pci`.
    unsafe { put(result, pci) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: nvmlDevice_t,
    node: *mut c_uint,
) -> nvmlReturn_t {
    let result = gpu(device)
        .and_then(|gpu| with(|machine| machine.gpu(gpu)?.numa_node.ok_or(machine::NOT_SUPPORTED)));
    // SAFETY: NVML's contract on `node`.
    unsafe { put(result, node) }
}

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: the one field the double answers.
const RECOVERY_ACTION_FIELD: c_uint = 230;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    let Ok(count) = usize::try_from(count) else {
        return INVALID_ARGUMENT;
    };
    if values.is_null() {
        return INVALID_ARGUMENT;
    }
    let gpu = match gpu(device) {
        Ok(gpu) => gpu,
        Err(code) => return code,
    };
    for at in 0..count {
        // SAFETY: the array holds `count` values (NVML's contract) and `at < count`.
        let value = unsafe { &mut *values.add(at) };
        let answer = if value.fieldId == RECOVERY_ACTION_FIELD {
            with(|machine| machine.recovery_action(gpu))
        } else {
            Err(machine::NOT_SUPPORTED)
        };
        match answer {
            Ok(action) => {
                value.nvmlReturn = SUCCESS;
                value.valueType =
                    nvml_wrapper_sys::bindings::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                value.value.uiVal = action;
            }
            Err(code) => value.nvmlReturn = code,
        }
    }
    SUCCESS
}

/// `nvmlDeviceAddressingMode_v1_t` (NVML 580), not in nvml-wrapper-sys 0.9.
#[repr(C)]
pub struct AddressingMode {
    /// `size | 1 << 24`.
    pub version: c_uint,
    /// 0 none, 1 HMM, 2 ATS.
    pub value: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAddressingMode(
    device: nvmlDevice_t,
    mode: *mut AddressingMode,
) -> nvmlReturn_t {
    if mode.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid for one struct (NVML's contract); the caller set `version`.
    let version = unsafe { (*mode).version };
    let result = versioned::<AddressingMode>(version, 1)
        .and_then(|()| gpu(device))
        .and_then(|gpu| with(|machine| machine.addressing_mode(gpu)))
        .map(|value| AddressingMode { version, value });
    // SAFETY: as above.
    unsafe { put(result, mode) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    let result = handle(device).and_then(|handle| with(|machine| machine.mig_attributes(handle)));
    // SAFETY: NVML's contract on `attributes`.
    unsafe { put(result, attributes) }
}

// ---- persistence mode ------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    let result = gpu(device)
        .and_then(|gpu| with(|machine| machine.persistence_mode(gpu)))
        .map(nvmlEnableState_t::from);
    // SAFETY: NVML's contract on `mode`.
    unsafe { put(result, mode) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetPersistenceMode(
    device: nvmlDevice_t,
    mode: nvmlEnableState_t,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| {
        if mode > 1 {
            return Err(INVALID_ARGUMENT);
        }
        with(|machine| machine.set_persistence_mode(gpu, mode == 1))
    });
    result.err().unwrap_or(SUCCESS)
}

// ---- NVLink ----------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    let result = handle(device)
        .and_then(|handle| with(|machine| machine.nvlink_state(handle, link)))
        .map(|active| {
            if active {
                nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                nvmlEnableState_enum_NVML_FEATURE_DISABLED
            }
        });
    // SAFETY: NVML's contract on `is_active`.
    unsafe { put(result, is_active) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    let result = handle(device)
        .and_then(|handle| with(|machine| machine.nvlink_remote_bus_id(handle, link)))
        // The real call also reports the far end's PCI device and subsystem IDs (an
        // NVSwitch's or a GPU's); the driver reads only the bus ID, and the profile has no IDs
        // for NVSwitches, so they stay 0.
        .and_then(|bus_id| pci_info(&bus_id, 0, 0));
    // SAFETY: NVML's contract on `pci`.
    unsafe { put(result, pci) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    p2p_index: nvmlGpuP2PCapsIndex_t,
    p2p_status: *mut nvmlGpuP2PStatus_t,
) -> nvmlReturn_t {
    let result = handle(device1).and_then(|first| {
        let second = handle(device2)?;
        with(|machine| machine.p2p_status(first, second, p2p_index))
    });
    // SAFETY: NVML's contract on `p2p_status`.
    unsafe { put(result, p2p_status) }
}

// ---- MIG: mode, profiles, devices ------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| with(|machine| machine.mig_mode(gpu)));
    match result {
        Ok(mode) => {
            // SAFETY: NVML's contract on `current` and `pending`.
            let code = unsafe { put(Ok(c_uint::from(mode.current)), current) };
            if code != SUCCESS {
                return code;
            }
            // SAFETY: as above.
            unsafe { put(Ok(c_uint::from(mode.pending)), pending) }
        }
        Err(code) => code,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activation: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| {
        if mode > 1 {
            return Err(INVALID_ARGUMENT);
        }
        with(|machine| machine.set_mig_mode(gpu, mode == 1))
    });
    // SAFETY: NVML's contract on `activation`.
    unsafe { put(result, activation) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    if info.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid for one struct (NVML's contract); the caller set `version`.
    let version = unsafe { (*info).version };
    let result = versioned::<nvmlGpuInstanceProfileInfo_v2_t>(version, 2)
        .and_then(|()| gpu(device))
        .and_then(|gpu| {
            with(|machine| {
                let row = machine.profile_by_index(gpu, profile)?;
                let profile = row.info;
                Ok(nvmlGpuInstanceProfileInfo_v2_t {
                    version,
                    id: profile.id,
                    isP2pSupported: 0,
                    sliceCount: profile.slice_count,
                    instanceCount: profile.max_instances,
                    multiprocessorCount: profile.engines.multiprocessors,
                    copyEngineCount: profile.engines.copy_engines,
                    decoderCount: profile.engines.decoders,
                    encoderCount: profile.engines.encoders,
                    jpegCount: profile.engines.jpeg_engines,
                    ofaCount: profile.engines.ofa_engines,
                    memorySizeMB: profile.memory_mib,
                    name: fill(&format!("MIG {}", profile.name)),
                })
            })
        });
    // SAFETY: as above.
    unsafe { put(result, info) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| with(|machine| machine.placements(gpu, profile_id)));
    // SAFETY: NVML's contract on `placements` (room for `*count` entries) and `count`.
    unsafe {
        put_array(
            result.map(|found| {
                found
                    .into_iter()
                    .map(|placement| nvmlGpuInstancePlacement_t {
                        start: placement.start,
                        size: placement.size,
                    })
                    .collect()
            }),
            placements,
            count,
        )
    }
}

/// NVML's array convention: a null array asks for the count; otherwise `*count` is the
/// room, and too little is `INSUFFICIENT_SIZE` with the count needed.
unsafe fn put_array<T>(result: Result<Vec<T>, Code>, array: *mut T, count: *mut c_uint) -> Code {
    let values = match result {
        Ok(values) => values,
        Err(code) => return code,
    };
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: `count` is non-null and valid (NVML's contract).
    let room = unsafe { count.read() } as usize;
    // SAFETY: as above.
    unsafe { count.write(values.len() as c_uint) };
    if array.is_null() {
        return SUCCESS;
    }
    if values.len() > room {
        return INSUFFICIENT_SIZE;
    }
    for (at, value) in values.into_iter().enumerate() {
        // SAFETY: the array has room for `room` entries and `at < room`.
        unsafe { array.add(at).write(value) };
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| with(|machine| machine.max_mig_devices(gpu)));
    // SAFETY: NVML's contract on `count`.
    unsafe { put(result, count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let result = gpu(device)
        .and_then(|gpu| with(|machine| machine.mig_device_by_index(gpu, index)))
        .map(Handle::to_ptr);
    // SAFETY: NVML's contract on `mig`.
    unsafe { put(result, mig) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    let result = handle(device).map(|handle| c_uint::from(matches!(handle, Handle::MigDevice(..))));
    // SAFETY: NVML's contract on `is_mig`.
    unsafe { put(result, is_mig) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    let result = match handle(mig) {
        Ok(Handle::MigDevice(gpu, ..)) => Ok(Handle::Gpu(gpu).to_ptr()),
        Ok(_) => Err(INVALID_ARGUMENT),
        Err(code) => Err(code),
    };
    // SAFETY: NVML's contract on `device`.
    unsafe { put(result, device) }
}

fn mig_ids(device: nvmlDevice_t) -> Result<(u32, u32), Code> {
    let handle = handle(device)?;
    with(|machine| {
        let found = machine.mig_device(handle)?;
        Ok((found.gpu_instance_id, found.compute_instance_id))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on `id`.
    unsafe { put(mig_ids(device).map(|(gi, _)| gi), id) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on `id`.
    unsafe { put(mig_ids(device).map(|(_, ci)| ci), id) }
}

// ---- MIG: GPU and compute instances ----------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    let result = gpu(device)
        .and_then(|gpu| with(|machine| machine.gpu_instance(gpu, id).map(|_| gpu)))
        .map(|gpu| Handle::GpuInstance(gpu, id).to_ptr());
    // SAFETY: NVML's contract on `instance`.
    unsafe { put(result, instance) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    let result = gpu_instance(instance).and_then(|(gpu, gi)| {
        with(|machine| {
            let instance = machine.gpu_instance(gpu, gi)?;
            Ok(nvmlGpuInstanceInfo_t {
                device: Handle::Gpu(gpu).to_ptr(),
                id: gi,
                profileId: instance.profile_id,
                placement: nvmlGpuInstancePlacement_t {
                    start: instance.placement.start,
                    size: instance.placement.size,
                },
            })
        })
    });
    // SAFETY: NVML's contract on `info`.
    unsafe { put(result, info) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| {
        with(|machine| {
            Ok(machine
                .gpu_instances_of(gpu, profile_id)?
                .into_iter()
                .map(|gi| Handle::GpuInstance(gpu, gi).to_ptr())
                .collect())
        })
    });
    // SAFETY: NVML's contract on `instances` and `count`.
    unsafe { put_array(result, instances, count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    if placement.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid for one struct (NVML's contract).
    let placement = unsafe { placement.read() };
    let result = gpu(device).and_then(|gpu| {
        with(|machine| {
            let placement = MigPlacement::new(placement.start, placement.size);
            machine
                .create_gpu_instance(gpu, profile_id, placement)
                .map(|gi| Handle::GpuInstance(gpu, gi).to_ptr())
        })
    });
    // SAFETY: NVML's contract on `instance`.
    unsafe { put(result, instance) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(instance: nvmlGpuInstance_t) -> nvmlReturn_t {
    gpu_instance(instance)
        .and_then(|(gpu, gi)| with(|machine| machine.destroy_gpu_instance(gpu, gi)))
        .err()
        .unwrap_or(SUCCESS)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    instance: nvmlGpuInstance_t,
    profile: c_uint,
    engine_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    let result = gpu_instance(instance).and_then(|(gpu, gi)| {
        if engine_profile != 0 {
            return Err(machine::NOT_SUPPORTED);
        }
        with(|machine| {
            let (slices, _) = machine.compute_profile(gpu, gi, profile)?;
            Ok(nvmlComputeInstanceProfileInfo_t {
                id: profile,
                sliceCount: slices,
                instanceCount: 1,
                multiprocessorCount: 0,
                sharedCopyEngineCount: 0,
                sharedDecoderCount: 0,
                sharedEncoderCount: 0,
                sharedJpegCount: 0,
                sharedOfaCount: 0,
            })
        })
    });
    // SAFETY: NVML's contract on `info`.
    unsafe { put(result, info) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    instance: nvmlGpuInstance_t,
    profile: c_uint,
    compute: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    let result = gpu_instance(instance).and_then(|(gpu, gi)| {
        with(|machine| {
            machine
                .create_compute_instance(gpu, gi, profile)
                .map(|ci| Handle::ComputeInstance(gpu, gi, ci).to_ptr())
        })
    });
    // SAFETY: NVML's contract on `compute`.
    unsafe { put(result, compute) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    instance: nvmlGpuInstance_t,
    id: c_uint,
    compute: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    let result = gpu_instance(instance).and_then(|(gpu, gi)| {
        with(|machine| {
            if machine
                .gpu_instance(gpu, gi)?
                .compute_instance_ids
                .contains(&id)
            {
                Ok(Handle::ComputeInstance(gpu, gi, id).to_ptr())
            } else {
                Err(machine::NOT_FOUND)
            }
        })
    });
    // SAFETY: NVML's contract on `compute`.
    unsafe { put(result, compute) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    instance: nvmlGpuInstance_t,
    profile: c_uint,
    computes: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    let result = gpu_instance(instance).and_then(|(gpu, gi)| {
        with(|machine| {
            let (_, spans) = machine.compute_profile(gpu, gi, profile)?;
            let cis = machine.gpu_instance(gpu, gi)?.compute_instance_ids;
            Ok(if spans {
                cis.into_iter()
                    .map(|ci| Handle::ComputeInstance(gpu, gi, ci).to_ptr())
                    .collect()
            } else {
                Vec::new()
            })
        })
    });
    // SAFETY: NVML's contract on `computes` and `count`.
    unsafe { put_array(result, computes, count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    let result = compute_instance(compute).and_then(|(gpu, gi, ci)| {
        with(|machine| {
            if !machine
                .gpu_instance(gpu, gi)?
                .compute_instance_ids
                .contains(&ci)
            {
                return Err(INVALID_ARGUMENT);
            }
            let profile = machine.spanning_compute_profile(gpu, gi)?;
            let (slices, _) = machine.compute_profile(gpu, gi, profile)?;
            Ok(nvmlComputeInstanceInfo_t {
                device: Handle::Gpu(gpu).to_ptr(),
                gpuInstance: Handle::GpuInstance(gpu, gi).to_ptr(),
                id: ci,
                profileId: profile,
                placement: nvmlComputeInstancePlacement_t {
                    start: 0,
                    size: slices,
                },
            })
        })
    });
    // SAFETY: NVML's contract on `info`.
    unsafe { put(result, info) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(compute: nvmlComputeInstance_t) -> nvmlReturn_t {
    compute_instance(compute)
        .and_then(|(gpu, gi, ci)| with(|machine| machine.destroy_compute_instance(gpu, gi, ci)))
        .err()
        .unwrap_or(SUCCESS)
}

// ---- events ---------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    let result = with(|machine| machine.create_event_set()).map(|id| Handle::EventSet(id).to_ptr());
    // SAFETY: NVML's contract on `set`.
    unsafe { put(result, set) }
}

fn event_set(set: nvmlEventSet_t) -> Result<u32, Code> {
    match handle(set)? {
        Handle::EventSet(id) => Ok(id),
        _ => Err(INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    event_set(set)
        .and_then(|id| with(|machine| machine.free_event_set(id)))
        .err()
        .unwrap_or(SUCCESS)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    let result = gpu(device).and_then(|gpu| with(|machine| machine.supported_events(gpu)));
    // SAFETY: NVML's contract on `types`.
    unsafe { put(result, types) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    gpu(device)
        .and_then(|gpu| {
            let set = event_set(set)?;
            with(|machine| machine.register_events(gpu, types, set))
        })
        .err()
        .unwrap_or(SUCCESS)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    let result = event_set(set).and_then(|set| {
        Machine::wait(
            machine::lock(),
            set,
            Duration::from_millis(u64::from(timeout_ms)),
        )
    });
    let result = result.map(|event| nvmlEventData_t {
        device: Handle::Gpu(event.gpu).to_ptr(),
        eventType: event.kind,
        eventData: event.data,
        gpuInstanceId: event.gpu_instance,
        computeInstanceId: event.compute_instance,
    });
    // SAFETY: NVML's contract on `data`.
    unsafe { put(result, data) }
}

// ---- control --------------------------------------------------------------------------------

/// Loads the machine of `profile` (a shipped profile's name or a file), with device nodes
/// under `root` (null: none are opened). `IN_USE` while NVML is initialised.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockConfigure(
    profile: *const c_char,
    root: *const c_char,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings, for the double's own functions too.
    let profile = match unsafe { text(profile) } {
        Ok(profile) => profile,
        Err(code) => return code,
    };
    let root = if root.is_null() {
        None
    } else {
        // SAFETY: as above.
        match unsafe { text(root) } {
            Ok(root) => Some(PathBuf::from(root)),
            Err(code) => return code,
        }
    };
    machine::configure(profile, root).err().unwrap_or(SUCCESS)
}

/// Runs a control call on the GPU with this UUID.
unsafe fn control(uuid: *const c_char, call: impl FnOnce(&mut Machine, u32)) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    let result = unsafe { text(uuid) }.and_then(|uuid| {
        with(|machine| {
            let gpu = machine.gpu_position(uuid)?;
            call(machine, gpu);
            Ok(())
        })
    });
    result.err().unwrap_or(SUCCESS)
}

/// Queues an event of `kind` (NVML's event type bits) with `data` (the XID) on every event
/// set that registered it for this GPU; `gpu_instance` / `compute_instance` are
/// `0xFFFFFFFF` when the event is not inside a MIG device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockInjectEvent(
    uuid: *const c_char,
    kind: c_ulonglong,
    data: c_ulonglong,
    gpu_instance: c_uint,
    compute_instance: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe {
        control(uuid, |machine, gpu| {
            machine.inject(Event {
                gpu,
                kind,
                data,
                gpu_instance,
                compute_instance,
            })
        })
    }
}

/// The GPU falls off the bus.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockLoseGpu(uuid: *const c_char) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe { control(uuid, Machine::lose) }
}

/// A process holds the GPU (`busy` non-zero) or lets go: MIG mode changes stay pending.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockSetBusy(uuid: *const c_char, busy: c_int) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe { control(uuid, |machine, gpu| machine.set_busy(gpu, busy != 0)) }
}

/// The GPU is bound to another driver (`detached` non-zero), or back to nvidia.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockSetDetached(uuid: *const c_char, detached: c_int) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe {
        control(uuid, |machine, gpu| {
            machine.set_detached(gpu, detached != 0)
        })
    }
}

/// Event registration on the GPU fails with `NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockRefuseEvents(uuid: *const c_char) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe { control(uuid, Machine::refuse_events) }
}

/// Memory queries on the GPU return `NOT_SUPPORTED` (as on integrated-memory GPUs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockMemoryNotSupported(uuid: *const c_char) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe { control(uuid, Machine::memory_not_supported) }
}

/// The GPU reports this raw brand value (one a newer driver defines).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockSetRawBrand(uuid: *const c_char, brand: c_uint) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe { control(uuid, |machine, gpu| machine.set_raw_brand(gpu, brand)) }
}

/// Placement queries of this profile ID on the GPU fail with `NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockRefusePlacements(
    uuid: *const c_char,
    profile_id: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe {
        control(uuid, |machine, gpu| {
            machine.refuse_placements(gpu, profile_id)
        })
    }
}

/// The GPU reports `action` as its recovery action (field 230: 0 none, 1 GPU reset, 2 node
/// reboot, 3 drain P2P, 4 drain and reset).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockSetRecoveryAction(
    uuid: *const c_char,
    action: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe {
        control(uuid, |machine, gpu| {
            machine.set_recovery_action(gpu, action)
        })
    }
}

/// MIG mode set outside NVML (an operator, a reset): `enabled` non-zero on, else off.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockSetMigMode(uuid: *const c_char, enabled: c_uint) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe {
        control(uuid, |machine, gpu| {
            machine.set_mig_mode_outside(gpu, enabled != 0)
        })
    }
}

/// Persistence mode set outside NVML (`nvidia-smi -pm`): `enabled` non-zero on, else off.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockSetPersistence(
    uuid: *const c_char,
    enabled: c_uint,
) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe {
        control(uuid, |machine, gpu| {
            machine.set_persistence_outside(gpu, enabled != 0)
        })
    }
}

/// Changes of the GPU's persistence mode fail with `NO_PERMISSION` (as without root).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlMockRefusePersistence(uuid: *const c_char) -> nvmlReturn_t {
    // SAFETY: NVML's contract on strings.
    unsafe { control(uuid, Machine::refuse_persistence) }
}

/// How many `nvmlInit` calls are not yet matched by `nvmlShutdown`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlMockInitCount() -> c_uint {
    machine::lock().as_ref().map_or(0, Machine::init_count)
}

/// How many GPU device nodes the library holds open.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlMockOpenNodeCount() -> c_uint {
    machine::lock()
        .as_ref()
        .map_or(0, |machine| machine.open_node_count() as c_uint)
}

#[cfg(test)]
mod tests {
    //! The C functions called in process, on this test binary's own machine (one at a time:
    //! NVML's state is one per process).

    use std::sync::{Mutex, MutexGuard};

    use nvml_wrapper_sys::bindings::{
        nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK,
        nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_READ,
        nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED,
        nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK,
    };

    use super::*;
    use crate::machine::{GPU_IS_LOST, NOT_SUPPORTED};

    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// NVML initialised on `profile`'s machine until dropped.
    struct Session {
        _turn: MutexGuard<'static, ()>,
    }

    impl Session {
        fn new(profile: &str) -> Self {
            let turn = ONE_AT_A_TIME
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            machine::configure(profile, None).unwrap();
            assert_eq!(nvmlInit_v2(), SUCCESS);
            Self { _turn: turn }
        }

        fn device(&self, index: u32) -> nvmlDevice_t {
            let mut device = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let code = unsafe { nvmlDeviceGetHandleByIndex_v2(index, &mut device) };
            assert_eq!(code, SUCCESS);
            device
        }
    }

    impl Drop for Session {
        fn drop(&mut self) {
            while nvmlShutdown() == SUCCESS {}
        }
    }

    fn state(device: nvmlDevice_t, link: u32) -> Result<nvmlEnableState_t, Code> {
        let mut state = 7;
        // SAFETY: a valid out-pointer.
        match unsafe { nvmlDeviceGetNvLinkState(device, link, &mut state) } {
            SUCCESS => Ok(state),
            code => Err(code),
        }
    }

    fn remote(device: nvmlDevice_t, link: u32) -> Result<nvmlPciInfo_t, Code> {
        // SAFETY: a plain C struct of integers and char arrays; all zero is valid.
        let mut pci: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer.
        match unsafe { nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, &mut pci) } {
            SUCCESS => Ok(pci),
            code => Err(code),
        }
    }

    fn p2p(first: nvmlDevice_t, second: nvmlDevice_t, index: u32) -> Result<u32, Code> {
        let mut status = 99;
        // SAFETY: a valid out-pointer.
        match unsafe { nvmlDeviceGetP2PStatus(first, second, index, &mut status) } {
            SUCCESS => Ok(status),
            code => Err(code),
        }
    }

    fn c_text(array: &[c_char]) -> String {
        let bytes: Vec<u8> = array
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn nvlink_states_and_far_ends_come_from_the_profile() {
        let nvml = Session::new("dgx-a100");
        let gpu = nvml.device(0);
        for link in 0..12 {
            assert_eq!(
                state(gpu, link),
                Ok(nvmlEnableState_enum_NVML_FEATURE_ENABLED)
            );
        }
        // An A100 has 12 links: link 12 is a number past them.
        assert_eq!(state(gpu, 12), Err(INVALID_ARGUMENT));
        assert_eq!(remote(gpu, 12).err(), Some(INVALID_ARGUMENT));
        assert_eq!(state(gpu, u32::MAX), Err(INVALID_ARGUMENT));
        // Links 2 and 3 go to the second NVSwitch, in NVML's spelling of a bus ID.
        let pci = remote(gpu, 2).unwrap();
        assert_eq!(c_text(&pci.busId), "00000000:C5:00.0");
        assert_eq!(c_text(&pci.busIdLegacy), "0000:C5:00.0");
        assert_eq!((pci.domain, pci.bus, pci.device), (0, 0xc5, 0));
        assert_eq!((pci.pciDeviceId, pci.pciSubSystemId), (0, 0));
        // Null out-pointers.
        // SAFETY: null is what is being tested; the functions check it.
        unsafe {
            assert_eq!(
                nvmlDeviceGetNvLinkState(gpu, 0, std::ptr::null_mut()),
                INVALID_ARGUMENT
            );
            assert_eq!(
                nvmlDeviceGetNvLinkRemotePciInfo_v2(gpu, 0, std::ptr::null_mut()),
                INVALID_ARGUMENT
            );
        }
        // Handles the double did not hand out.
        assert_eq!(state(std::ptr::null_mut(), 0), Err(INVALID_ARGUMENT));
        assert_eq!(
            remote(std::ptr::null_mut(), 0).err(),
            Some(INVALID_ARGUMENT)
        );
        // A MIG device of the GPU (GPU instance 7): links belong to the GPU.
        let mig: nvmlDevice_t = Handle::MigDevice(0, 7, 0).to_ptr();
        assert_eq!(state(mig, 0), Err(NOT_SUPPORTED));
        assert_eq!(remote(mig, 0).err(), Some(NOT_SUPPORTED));
    }

    #[test]
    fn a_gpu_without_nvlink_is_not_supported() {
        let nvml = Session::new("workstation");
        let t4 = nvml.device(0);
        assert_eq!(state(t4, 0), Err(NOT_SUPPORTED));
        assert_eq!(remote(t4, 0).err(), Some(NOT_SUPPORTED));
        assert_eq!(state(t4, 5), Err(NOT_SUPPORTED));
    }

    #[test]
    fn links_down_and_far_ends_unknown_have_no_remote_info() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("links.yaml");
        std::fs::write(
            &path,
            r#"
name: links
driverVersion: "580.126.20"
cudaDriverVersion: "13.0"
models:
  a100:
    productName: NVIDIA A100 80GB PCIe
    brand: Nvidia
    architecture: Ampere
    computeCapability: "8.0"
    memoryMiB: 81920
    pciDeviceId: "0x20b5"
gpus:
  - { model: a100, pciBusId: "0000:17:00.0", nvlinks: ["0000:31:00.0", unknown, null] }
  - { model: a100, pciBusId: "0000:31:00.0", nvlinks: ["0000:17:00.0"] }
  - { model: a100, pciBusId: "0000:b1:00.0", nvlinks: [unknown], nvlinkPeers: ["0000:17:00.0"] }
"#,
        )
        .unwrap();
        let nvml = Session::new(path.to_str().unwrap());
        let (first, second, third) = (nvml.device(0), nvml.device(1), nvml.device(2));
        assert_eq!(
            state(first, 1),
            Ok(nvmlEnableState_enum_NVML_FEATURE_ENABLED)
        );
        assert_eq!(
            state(first, 2),
            Ok(nvmlEnableState_enum_NVML_FEATURE_DISABLED)
        );
        assert_eq!(state(first, 3), Err(INVALID_ARGUMENT));
        assert_eq!(c_text(&remote(first, 0).unwrap().busId), "00000000:31:00.0");
        assert_eq!(
            remote(first, 1).err(),
            Some(NOT_SUPPORTED),
            "far end unknown"
        );
        assert_eq!(remote(first, 2).err(), Some(NOT_SUPPORTED), "link down");

        let nvlink = nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK;
        let (ok, no) = (
            nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK,
            nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED,
        );
        // The bridge: both ways.
        assert_eq!(p2p(first, second, nvlink), Ok(ok));
        assert_eq!(p2p(second, first, nvlink), Ok(ok));
        // Listed as a peer by the third GPU's nvlinkPeers, its far end unknown.
        assert_eq!(p2p(third, first, nvlink), Ok(ok));
        assert_eq!(p2p(third, second, nvlink), Ok(no));
        // Only NVLink is modelled.
        assert_eq!(
            p2p(
                first,
                second,
                nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_READ
            ),
            Ok(no)
        );
        assert_eq!(p2p(first, first, nvlink), Err(INVALID_ARGUMENT));
        assert_eq!(
            p2p(first, std::ptr::null_mut(), nvlink),
            Err(INVALID_ARGUMENT)
        );
        // SAFETY: null is what is being tested; the function checks it.
        let code = unsafe { nvmlDeviceGetP2PStatus(first, second, nvlink, std::ptr::null_mut()) };
        assert_eq!(code, INVALID_ARGUMENT);

        // A lost GPU answers nothing.
        with(|machine| {
            machine.lose(1);
            Ok(())
        })
        .unwrap();
        assert_eq!(state(second, 0), Err(GPU_IS_LOST));
        assert_eq!(remote(second, 0).err(), Some(GPU_IS_LOST));
        assert_eq!(p2p(first, second, nvlink), Err(GPU_IS_LOST));
        // And nothing is answered outside nvmlInit / nvmlShutdown.
        drop(nvml);
        let _turn = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        assert_eq!(state(first, 0), Err(UNINITIALIZED));
        assert_eq!(remote(first, 0).err(), Some(UNINITIALIZED));
        assert_eq!(p2p(first, third, nvlink), Err(UNINITIALIZED));
    }
}
