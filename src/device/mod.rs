//! Where a rank computes: the device choice, loading libtorch's CUDA backend, the
//! synchronisation that makes a phase's wall time cover its device work, and the GPU
//! libraries opened at run time ([`cuda`]: driver and NCCL; [`nvml`]: NVML), never
//! linked, so that CPU runs, `reduce` and `topo` start fast and work without a driver.

pub(crate) mod cuda;
pub(crate) mod nvml;

use anyhow::{bail, Result};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use std::path::Path;
use tch::Device;
use tracing::warn;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceChoice {
    /// CUDA if libtorch sees a GPU, else CPU.
    Auto,
    Cpu,
    Cuda,
}

/// True when this node has an NVIDIA driver, i.e. a GPU may be usable.
fn nvidia_driver_present() -> bool {
    Path::new("/proc/driver/nvidia/version").exists() || Path::new("/dev/nvidiactl").exists()
}

/// Loads libtorch's CUDA backend. The binary does not link it, so that CPU runs,
/// `reduce` and `topo` start fast; its static initialisers register CUDA with libtorch.
pub(crate) fn load_cuda_backend() -> Result<()> {
    let dir = option_env!("DDPBENCH_LIBTORCH_LIB").unwrap_or("");
    let candidates = [format!("{dir}/libtorch_cuda.so"), "libtorch_cuda.so".to_string()];
    let mut errors = Vec::new();
    for lib in candidates.iter().filter(|c| !c.starts_with('/') || Path::new(c).exists()) {
        let name = std::ffi::CString::new(lib.as_str())?;
        // SAFETY: dlopen with a valid C string; the handle is kept for the process' life.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if !handle.is_null() {
            return Ok(());
        }
        // SAFETY: dlerror returns a C string owned by libc, valid until the next dl call.
        let err = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        errors.push(format!("{lib}: {}", err.to_string_lossy()));
    }
    bail!(
        "libtorch's CUDA backend could not be loaded ({}). Is this a CUDA build of libtorch?",
        errors.join("; ")
    )
}

pub(crate) fn resolve_device(choice: DeviceChoice, local_rank: usize) -> Result<Device> {
    let gpus = match choice {
        DeviceChoice::Cpu => 0,
        DeviceChoice::Auto if !nvidia_driver_present() => 0,
        DeviceChoice::Auto => match load_cuda_backend() {
            Ok(()) => tch::Cuda::device_count(),
            Err(e) => {
                warn!("{e:#}; training on CPU");
                0
            }
        },
        DeviceChoice::Cuda => {
            load_cuda_backend()?;
            tch::Cuda::device_count()
        }
    };
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto if gpus == 0 => Ok(Device::Cpu),
        DeviceChoice::Cuda if gpus == 0 => bail!(
            "--device cuda: libtorch sees no GPU (CUDA_VISIBLE_DEVICES={:?}). Use --device cpu or check the node's driver",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
        ),
        _ => Ok(Device::Cuda(local_rank % gpus as usize)),
    }
}

/// Waits for the device work queued so far by libtorch, so a phase's wall time covers
/// its kernels. On CUDA this synchronises libtorch's stream only, not NCCL's (so an
/// overlapped all-reduce keeps running); that costs the CPU/GPU pipelining across
/// phase boundaries, a few kernel launches' worth per phase.
pub(crate) fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        if cuda::sync_torch_stream().is_err() {
            tch::Cuda::synchronize(i as i64);
        }
    }
}
