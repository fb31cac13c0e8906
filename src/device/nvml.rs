//! NVIDIA's NVML (`libnvidia-ml.so.1`, installed with the driver) through the
//! `nvml-wrapper` crate, which opens the library at run time: where there is no driver,
//! [`Nvml::load`] is an error saying telemetry is off, never a crash.

use crate::record::GpuClocks;
use anyhow::{anyhow, Result};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::error::NvmlError;

use std::ffi::OsStr;

/// The NVML library looked for (the driver's soname; no development package needed).
pub(crate) const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// One GPU as NVML lists it: its index, the bus id as NVML writes it, name and memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NvmlGpuEntry {
    pub index: usize,
    pub bus_id: String,
    pub name: String,
    pub memory_bytes: Option<u64>,
}

/// One reading of a GPU's counters; `None` where the reading failed or is unsupported.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GpuReading {
    /// Percent of the last sample period in which a kernel ran.
    pub gpu_util_pct: Option<u32>,
    /// Percent of the last sample period in which device memory was read or written.
    pub mem_util_pct: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub power_w: Option<f64>,
    pub temperature_c: Option<u32>,
}

/// An initialised NVML (`nvmlShutdown` when it drops).
pub(crate) struct Nvml {
    inner: nvml_wrapper::Nvml,
}

/// The reason telemetry is off, with what to do.
fn load_error(library: &str, e: NvmlError) -> anyhow::Error {
    match e {
        NvmlError::LibloadingError(e) => anyhow!(
            "GPU telemetry is off: cannot load {library} (NVIDIA's NVML, installed with the GPU driver): {e}. \
             Install the NVIDIA driver or add the folder holding {library} to LD_LIBRARY_PATH"
        ),
        NvmlError::FailedToLoadSymbol(s) => {
            anyhow!("GPU telemetry is off: {library} lacks a function NVML needs ({s}); is the driver too old?")
        }
        other => anyhow!("GPU telemetry is off: {library} loaded but nvmlInit failed: {other}; is the NVIDIA driver running?"),
    }
}

impl Nvml {
    /// Loads [`NVML_LIBRARY`] and initialises it.
    pub(crate) fn load() -> Result<Nvml> {
        Nvml::load_from(NVML_LIBRARY)
    }

    /// Loads NVML from `library` (a soname the loader searches for, or a path).
    pub(crate) fn load_from(library: &str) -> Result<Nvml> {
        let inner = nvml_wrapper::Nvml::builder()
            .lib_path(OsStr::new(library))
            .init()
            .map_err(|e| load_error(library, e))?;
        Ok(Nvml { inner })
    }

    /// The driver's version, e.g. `580.65.06`.
    pub(crate) fn driver_version(&self) -> Option<String> {
        self.inner.sys_driver_version().ok()
    }

    fn device(&self, bus_id: &str) -> Result<nvml_wrapper::Device<'_>> {
        self.inner
            .device_by_pci_bus_id(bus_id)
            .map_err(|e| anyhow!("NVML has no GPU at PCI bus id {bus_id}: {e}"))
    }

    /// Every GPU NVML sees, in its index order.
    pub(crate) fn inventory(&self) -> Result<Vec<NvmlGpuEntry>> {
        let count = self.inner.device_count().map_err(|e| anyhow!("NVML device count: {e}"))?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let dev = self.inner.device_by_index(index).map_err(|e| anyhow!("NVML GPU {index}: {e}"))?;
            out.push(NvmlGpuEntry {
                index: index as usize,
                bus_id: dev.pci_info().map_err(|e| anyhow!("NVML GPU {index} PCI info: {e}"))?.bus_id,
                name: dev.name().map_err(|e| anyhow!("NVML GPU {index} name: {e}"))?,
                memory_bytes: dev.memory_info().ok().map(|m| m.total),
            });
        }
        Ok(out)
    }

    /// One reading of the GPU at `bus_id`; each counter that fails is `None`.
    pub(crate) fn read(&self, bus_id: &str) -> GpuReading {
        let Ok(dev) = self.device(bus_id) else {
            return GpuReading::default();
        };
        let util = dev.utilization_rates().ok();
        GpuReading {
            gpu_util_pct: util.as_ref().map(|u| u.gpu),
            mem_util_pct: util.as_ref().map(|u| u.memory),
            mem_used_bytes: dev.memory_info().ok().map(|m| m.used),
            sm_clock_mhz: dev.clock_info(Clock::SM).ok(),
            power_w: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
        }
    }

    /// Clocks and throttle reasons of the GPU at `bus_id`.
    pub(crate) fn clocks(&self, bus_id: &str) -> Result<GpuClocks> {
        let dev = self.device(bus_id)?;
        Ok(GpuClocks {
            bus_id: bus_id.to_string(),
            sm_clock_mhz: dev.clock_info(Clock::SM).ok(),
            mem_clock_mhz: dev.clock_info(Clock::Memory).ok(),
            max_sm_clock_mhz: dev.max_clock_info(Clock::SM).ok(),
            temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
            throttle_reasons: dev.current_throttle_reasons().ok().map(throttle_names),
        })
    }
}

/// The names of the active throttle reasons, `GPU_IDLE` and the rest as NVML's flags name them.
pub(crate) fn throttle_names(reasons: ThrottleReasons) -> Vec<String> {
    reasons.iter_names().map(|(name, _)| name.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_reasons_are_named() {
        assert!(throttle_names(ThrottleReasons::empty()).is_empty());
        let names = throttle_names(ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_SLOWDOWN);
        assert_eq!(names, vec!["SW_POWER_CAP".to_string(), "HW_SLOWDOWN".to_string()]);
    }

    #[test]
    fn an_absent_library_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libnvidia-ml.so.1");
        let e = Nvml::load_from(path.to_str().unwrap())
            .err()
            .expect("no library in an empty folder");
        let e = format!("{e:#}");
        assert!(e.contains("GPU telemetry is off") && e.contains("LD_LIBRARY_PATH"), "{e}");
    }
}
