//! NVML's opaque handles, as the double hands them out: numbers that name what they point
//! at, never dereferenced by NVML's callers (nvml-wrapper and the NVML backend only pass them
//! back). A handle stays valid as long as what it names exists, like NVML's.
//!
//! Layout of the number: bits 28-31 the kind, 16-27 the GPU's NVML index, 8-15 the GPU
//! instance ID, 0-7 the compute instance ID (or an event set's number in bits 0-27).

use std::ffi::c_void;

const KIND_SHIFT: usize = 28;
const GPU_SHIFT: usize = 16;
const GI_SHIFT: usize = 8;

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handle {
    /// A physical GPU, by NVML index.
    Gpu(u32),
    /// A MIG device: GPU index, GPU instance, compute instance.
    MigDevice(u32, u32, u32),
    /// A GPU instance.
    GpuInstance(u32, u32),
    /// A compute instance.
    ComputeInstance(u32, u32, u32),
    /// An event set.
    EventSet(u32),
}

impl Handle {
    fn number(self) -> usize {
        let pack = |kind: usize, gpu: u32, gi: u32, ci: u32| {
            kind << KIND_SHIFT
                | (gpu as usize & 0xfff) << GPU_SHIFT
                | (gi as usize & 0xff) << GI_SHIFT
                | (ci as usize & 0xff)
        };
        match self {
            Handle::Gpu(gpu) => pack(1, gpu, 0, 0),
            Handle::MigDevice(gpu, gi, ci) => pack(2, gpu, gi, ci),
            Handle::GpuInstance(gpu, gi) => pack(3, gpu, gi, 0),
            Handle::ComputeInstance(gpu, gi, ci) => pack(4, gpu, gi, ci),
            Handle::EventSet(set) => 5 << KIND_SHIFT | (set as usize & 0xfff_ffff),
        }
    }

    /// The handle as NVML's pointer type.
    pub(crate) fn to_ptr<T>(self) -> *mut T {
        std::ptr::without_provenance_mut(self.number())
    }

    /// What a pointer a caller passed back names; `None` for anything the double did not hand
    /// out.
    pub(crate) fn from_ptr<T>(pointer: *mut T) -> Option<Handle> {
        let number = pointer.cast::<c_void>().addr();
        let gpu = ((number >> GPU_SHIFT) & 0xfff) as u32;
        let gi = ((number >> GI_SHIFT) & 0xff) as u32;
        let ci = (number & 0xff) as u32;
        Some(match number >> KIND_SHIFT {
            1 => Handle::Gpu(gpu),
            2 => Handle::MigDevice(gpu, gi, ci),
            3 => Handle::GpuInstance(gpu, gi),
            4 => Handle::ComputeInstance(gpu, gi, ci),
            5 => Handle::EventSet((number & 0xfff_ffff) as u32),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_pointers() {
        for handle in [
            Handle::Gpu(0),
            Handle::Gpu(7),
            Handle::MigDevice(3, 13, 0),
            Handle::GpuInstance(1, 14),
            Handle::ComputeInstance(2, 5, 1),
            Handle::EventSet(42),
        ] {
            assert_eq!(Handle::from_ptr(handle.to_ptr::<u8>()), Some(handle));
        }
        assert_eq!(Handle::from_ptr(std::ptr::null_mut::<u8>()), None);
    }
}
