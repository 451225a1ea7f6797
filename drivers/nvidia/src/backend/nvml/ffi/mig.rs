//! The raw NVML calls that change MIG state (dynamic MIG): GPU and compute instances, MIG
//! mode. Compiled in CI; not yet run on a GPU.
//!
//! Every call checks that the driver exports its symbol first, as the rest of `ffi` does.

use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE, nvmlComputeInstance_t,
    nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
    nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};

use super::MigLib;
use crate::backend::mig::{GpuInstanceInfo, MigError};
use crate::backend::{MigMode, MigPlacement};

/// Most GPU instances one GPU holds (7 on A100/H100); room for more.
const MAX_INSTANCES: usize = 32;

fn failed(operation: &str, gpu: &str, code: nvmlReturn_t) -> MigError {
    MigError::Failed {
        operation: operation.to_owned(),
        gpu: gpu.to_owned(),
        reason: super::describe(code),
    }
}

fn missing(function: &str) -> MigError {
    MigError::Unsupported {
        backend: "nvml".to_owned(),
        what: format!("{function} is not exported by this NVIDIA driver"),
    }
}

impl MigLib {
    fn gpu_instance(
        &self,
        handle: nvmlDevice_t,
        gpu: &str,
        id: u32,
    ) -> Result<Option<nvmlGpuInstance_t>, MigError> {
        if self.lib.nvmlDeviceGetGpuInstanceById.is_err() {
            return Err(missing("nvmlDeviceGetGpuInstanceById"));
        }
        let mut instance: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: symbol checked; a live device handle; `instance` a valid out-pointer.
        let code = unsafe {
            self.lib
                .nvmlDeviceGetGpuInstanceById(handle, id, &mut instance)
        };
        match code {
            c if c == nvmlReturn_enum_NVML_SUCCESS => Ok(Some(instance)),
            // NOT_SUPPORTED: MIG mode is off, so every GPU instance is gone (MIG switched off
            // outside the plugin): what was to be destroyed already is.
            c if c == nvmlReturn_enum_NVML_ERROR_NOT_FOUND
                || c == nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
                || c == nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED =>
            {
                Ok(None)
            }
            c => Err(failed(&format!("looking up GPU instance {id}"), gpu, c)),
        }
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`; returns the GPU instance ID.
    pub(in crate::backend::nvml) fn create_gpu_instance(
        &self,
        device: &Device<'_>,
        gpu: &str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<u32, MigError> {
        if self.lib.nvmlDeviceCreateGpuInstanceWithPlacement.is_err() {
            return Err(missing("nvmlDeviceCreateGpuInstanceWithPlacement"));
        }
        if self.lib.nvmlGpuInstanceGetInfo.is_err() {
            return Err(missing("nvmlGpuInstanceGetInfo"));
        }
        // SAFETY: a live device handle of the same NVML instance.
        let handle: nvmlDevice_t = unsafe { device.handle() };
        let raw = nvmlGpuInstancePlacement_t {
            start: placement.start,
            size: placement.size,
        };
        let mut instance: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: symbol checked; `raw` lives across the call; `instance` a valid out-pointer.
        let code = unsafe {
            self.lib.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle,
                profile_id,
                &raw,
                &mut instance,
            )
        };
        if code != nvmlReturn_enum_NVML_SUCCESS {
            return Err(failed(
                &format!("creating a GPU instance of profile {profile_id} at {placement}"),
                gpu,
                code,
            ));
        }
        // SAFETY: a plain C struct; all zero (null pointers) is valid.
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `instance` is the handle NVML just returned; `info` a valid out-struct.
        let code = unsafe { self.lib.nvmlGpuInstanceGetInfo(instance, &mut info) };
        if code != nvmlReturn_enum_NVML_SUCCESS {
            return Err(failed("reading the new GPU instance", gpu, code));
        }
        Ok(info.id)
    }

    /// Creates the compute instance spanning the whole GPU instance: the compute-instance
    /// profile with the most slices the GPU instance accepts (upstream #1480 asked for one
    /// that does not exist on some GPUs).
    pub(in crate::backend::nvml) fn create_compute_instance(
        &self,
        device: &Device<'_>,
        gpu: &str,
        gpu_instance_id: u32,
    ) -> Result<u32, MigError> {
        for (present, name) in [
            (
                self.lib
                    .nvmlGpuInstanceGetComputeInstanceProfileInfo
                    .is_ok(),
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            ),
            (
                self.lib.nvmlGpuInstanceCreateComputeInstance.is_ok(),
                "nvmlGpuInstanceCreateComputeInstance",
            ),
            (
                self.lib.nvmlComputeInstanceGetInfo_v2.is_ok(),
                "nvmlComputeInstanceGetInfo_v2",
            ),
        ] {
            if !present {
                return Err(missing(name));
            }
        }
        // SAFETY: a live device handle of the same NVML instance.
        let handle: nvmlDevice_t = unsafe { device.handle() };
        let operation = format!("creating the compute instance of GPU instance {gpu_instance_id}");
        let Some(instance) = self.gpu_instance(handle, gpu, gpu_instance_id)? else {
            return Err(MigError::Failed {
                operation,
                gpu: gpu.to_owned(),
                reason: "no such GPU instance".to_owned(),
            });
        };
        let mut best: Option<nvmlComputeInstanceProfileInfo_t> = None;
        for profile in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: a plain C struct of integers; all zero is valid.
            let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: symbol checked; `instance` a live GPU instance handle; `info` valid.
            let code = unsafe {
                self.lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    instance,
                    profile,
                    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut info,
                )
            };
            if code == nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
                || code == nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
            {
                continue;
            }
            if code != nvmlReturn_enum_NVML_SUCCESS {
                return Err(failed(&operation, gpu, code));
            }
            if best.is_none_or(|best| info.sliceCount > best.sliceCount) {
                best = Some(info);
            }
        }
        let Some(profile) = best else {
            return Err(MigError::Failed {
                operation,
                gpu: gpu.to_owned(),
                reason: "the GPU instance offers no compute-instance profile".to_owned(),
            });
        };
        let mut compute: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: symbol checked; live GPU instance handle; valid out-pointer.
        let code = unsafe {
            self.lib
                .nvmlGpuInstanceCreateComputeInstance(instance, profile.id, &mut compute)
        };
        if code != nvmlReturn_enum_NVML_SUCCESS {
            return Err(failed(&operation, gpu, code));
        }
        // SAFETY: a plain C struct; all zero (null pointers) is valid.
        let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `compute` is the handle NVML just returned; `info` a valid out-struct.
        let code = unsafe { self.lib.nvmlComputeInstanceGetInfo_v2(compute, &mut info) };
        if code != nvmlReturn_enum_NVML_SUCCESS {
            return Err(failed("reading the new compute instance", gpu, code));
        }
        Ok(info.id)
    }

    /// `nvmlComputeInstanceDestroy`; a missing instance is not an error.
    pub(in crate::backend::nvml) fn destroy_compute_instance(
        &self,
        device: &Device<'_>,
        gpu: &str,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), MigError> {
        if self.lib.nvmlGpuInstanceGetComputeInstanceById.is_err() {
            return Err(missing("nvmlGpuInstanceGetComputeInstanceById"));
        }
        if self.lib.nvmlComputeInstanceDestroy.is_err() {
            return Err(missing("nvmlComputeInstanceDestroy"));
        }
        // SAFETY: a live device handle of the same NVML instance.
        let handle: nvmlDevice_t = unsafe { device.handle() };
        let Some(instance) = self.gpu_instance(handle, gpu, gpu_instance_id)? else {
            return Ok(());
        };
        let mut compute: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: symbol checked; live GPU instance handle; valid out-pointer.
        let code = unsafe {
            self.lib.nvmlGpuInstanceGetComputeInstanceById(
                instance,
                compute_instance_id,
                &mut compute,
            )
        };
        if code == nvmlReturn_enum_NVML_ERROR_NOT_FOUND
            || code == nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
        {
            return Ok(());
        }
        let operation = format!(
            "destroying compute instance {compute_instance_id} of GPU instance {gpu_instance_id}"
        );
        if code != nvmlReturn_enum_NVML_SUCCESS {
            return Err(failed(&operation, gpu, code));
        }
        // SAFETY: symbol checked; `compute` the handle NVML just returned.
        let code = unsafe { self.lib.nvmlComputeInstanceDestroy(compute) };
        if code != nvmlReturn_enum_NVML_SUCCESS {
            return Err(failed(&operation, gpu, code));
        }
        Ok(())
    }

    /// `nvmlGpuInstanceDestroy`; a missing instance is not an error.
    pub(in crate::backend::nvml) fn destroy_gpu_instance(
        &self,
        device: &Device<'_>,
        gpu: &str,
        gpu_instance_id: u32,
    ) -> Result<(), MigError> {
        if self.lib.nvmlGpuInstanceDestroy.is_err() {
            return Err(missing("nvmlGpuInstanceDestroy"));
        }
        // SAFETY: a live device handle of the same NVML instance.
        let handle: nvmlDevice_t = unsafe { device.handle() };
        let Some(instance) = self.gpu_instance(handle, gpu, gpu_instance_id)? else {
            return Ok(());
        };
        // SAFETY: symbol checked; `instance` the handle NVML just returned.
        let code = unsafe { self.lib.nvmlGpuInstanceDestroy(instance) };
        if code != nvmlReturn_enum_NVML_SUCCESS {
            return Err(failed(
                &format!("destroying GPU instance {gpu_instance_id}"),
                gpu,
                code,
            ));
        }
        Ok(())
    }

    /// Every GPU instance of the GPU (per GPU-instance profile), with its compute instances
    /// (per compute-instance profile).
    pub(in crate::backend::nvml) fn gpu_instances(
        &self,
        device: &Device<'_>,
        gpu: &str,
        profile_ids: &[u32],
    ) -> Result<Vec<GpuInstanceInfo>, MigError> {
        for (present, name) in [
            (
                self.lib.nvmlDeviceGetGpuInstances.is_ok(),
                "nvmlDeviceGetGpuInstances",
            ),
            (
                self.lib.nvmlGpuInstanceGetInfo.is_ok(),
                "nvmlGpuInstanceGetInfo",
            ),
            (
                self.lib.nvmlGpuInstanceGetComputeInstances.is_ok(),
                "nvmlGpuInstanceGetComputeInstances",
            ),
            (
                self.lib.nvmlComputeInstanceGetInfo_v2.is_ok(),
                "nvmlComputeInstanceGetInfo_v2",
            ),
        ] {
            if !present {
                return Err(missing(name));
            }
        }
        // SAFETY: a live device handle of the same NVML instance.
        let handle: nvmlDevice_t = unsafe { device.handle() };
        let mut found = Vec::new();
        for &profile_id in profile_ids {
            let mut instances: [nvmlGpuInstance_t; MAX_INSTANCES] =
                [std::ptr::null_mut(); MAX_INSTANCES];
            let mut count = MAX_INSTANCES as u32;
            // SAFETY: symbol checked; the array has room for `count` handles.
            let code = unsafe {
                self.lib.nvmlDeviceGetGpuInstances(
                    handle,
                    profile_id,
                    instances.as_mut_ptr(),
                    &mut count,
                )
            };
            if code != nvmlReturn_enum_NVML_SUCCESS {
                return Err(failed(
                    &format!("listing the GPU instances of profile {profile_id}"),
                    gpu,
                    code,
                ));
            }
            for &instance in instances.iter().take(count as usize) {
                // SAFETY: a plain C struct; all zero is valid.
                let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: `instance` a handle NVML returned; `info` a valid out-struct.
                let code = unsafe { self.lib.nvmlGpuInstanceGetInfo(instance, &mut info) };
                if code != nvmlReturn_enum_NVML_SUCCESS {
                    return Err(failed("reading a GPU instance", gpu, code));
                }
                let mut compute_instance_ids = Vec::new();
                for ci_profile in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
                    let mut computes: [nvmlComputeInstance_t; MAX_INSTANCES] =
                        [std::ptr::null_mut(); MAX_INSTANCES];
                    let mut ci_count = MAX_INSTANCES as u32;
                    // SAFETY: symbol checked; the array has room for `ci_count` handles.
                    let code = unsafe {
                        self.lib.nvmlGpuInstanceGetComputeInstances(
                            instance,
                            ci_profile,
                            computes.as_mut_ptr(),
                            &mut ci_count,
                        )
                    };
                    if code == nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
                        || code == nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
                    {
                        continue;
                    }
                    if code != nvmlReturn_enum_NVML_SUCCESS {
                        return Err(failed(
                            &format!("listing the compute instances of GPU instance {}", info.id),
                            gpu,
                            code,
                        ));
                    }
                    for &compute in computes.iter().take(ci_count as usize) {
                        // SAFETY: a plain C struct; all zero is valid.
                        let mut ci_info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
                        // SAFETY: `compute` a handle NVML returned; valid out-struct.
                        let code = unsafe {
                            self.lib
                                .nvmlComputeInstanceGetInfo_v2(compute, &mut ci_info)
                        };
                        if code != nvmlReturn_enum_NVML_SUCCESS {
                            return Err(failed("reading a compute instance", gpu, code));
                        }
                        compute_instance_ids.push(ci_info.id);
                    }
                }
                found.push(GpuInstanceInfo::new(
                    info.id,
                    info.profileId,
                    MigPlacement::new(info.placement.start, info.placement.size),
                    compute_instance_ids,
                ));
            }
        }
        Ok(found)
    }

    /// `nvmlDeviceSetMigMode`, then reads the mode back.
    pub(in crate::backend::nvml) fn set_mig_mode(
        &self,
        device: &Device<'_>,
        gpu: &str,
        enabled: bool,
    ) -> Result<MigMode, MigError> {
        if self.lib.nvmlDeviceSetMigMode.is_err() {
            return Err(missing("nvmlDeviceSetMigMode"));
        }
        // SAFETY: a live device handle of the same NVML instance.
        let handle: nvmlDevice_t = unsafe { device.handle() };
        let mode = if enabled {
            NVML_DEVICE_MIG_ENABLE
        } else {
            NVML_DEVICE_MIG_DISABLE
        };
        let mut activation: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
        // SAFETY: symbol checked; `activation` a valid out-pointer.
        let code = unsafe { self.lib.nvmlDeviceSetMigMode(handle, mode, &mut activation) };
        let operation = format!("setting MIG mode {}", if enabled { "on" } else { "off" });
        if code != nvmlReturn_enum_NVML_SUCCESS {
            return Err(failed(&operation, gpu, code));
        }
        let now = device.mig_mode().map_err(|error| MigError::Failed {
            operation: format!("{operation}: reading the mode back"),
            gpu: gpu.to_owned(),
            reason: error.to_string(),
        })?;
        Ok(MigMode {
            current: now.current == 1,
            pending: now.pending == 1,
        })
    }
}
