//! NVIDIA's NVML (`libnvidia-ml.so.1`, installed with the driver) through `dlopen`:
//! prototypes from NVIDIA's `nvml.h`, minimal structs, and every `unsafe` NVML call.
//! Loaded at run time, never linked, so ddpbench runs where there is no driver.

/// The NVML library looked for (the driver's soname; no development package needed).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// One GPU as NVML lists it: its index, the bus id as NVML writes it, name and memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlGpuEntry {
    pub index: usize,
    pub bus_id: String,
    pub name: String,
    pub memory_bytes: Option<u64>,
}

/// One reading of a GPU's counters; `None` where the reading failed or is unsupported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    /// Percent of the last sample period in which a kernel ran.
    pub gpu_util_pct: Option<u32>,
    /// Percent of the last sample period in which device memory was read or written.
    pub mem_util_pct: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub power_w: Option<f64>,
    pub temperature_c: Option<u32>,
}

use anyhow::{anyhow, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

/// `nvmlReturn_t` (an enum: `int`-sized); 0 is `NVML_SUCCESS`.
type Return = c_int;
/// `nvmlDevice_t`, an opaque handle.
pub type Device = *mut c_void;

const NVML_SUCCESS: Return = 0;
/// `nvmlClockType_t::NVML_CLOCK_SM`.
const NVML_CLOCK_SM: c_int = 1;
/// `nvmlTemperatureSensors_t::NVML_TEMPERATURE_GPU`.
const NVML_TEMPERATURE_GPU: c_int = 0;
/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE` (the larger of the two name buffers).
const NAME_BUFFER: usize = 96;

/// `nvmlPciInfo_t`, the layout `nvmlDeviceGetPciInfo_v2` and `_v3` fill.
#[repr(C)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    /// NUL-terminated, e.g. `00000000:3B:00.0`.
    pub bus_id: [c_char; 32],
}

/// `nvmlMemory_t` (v1), bytes.
#[repr(C)]
#[derive(Default)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlUtilization_t`, percent.
#[repr(C)]
#[derive(Default)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// The entry points used, copied out of the library (which `Nvml` keeps loaded).
struct Api {
    init: unsafe extern "C" fn() -> Return,
    shutdown: unsafe extern "C" fn() -> Return,
    error_string: unsafe extern "C" fn(Return) -> *const c_char,
    device_count: unsafe extern "C" fn(*mut c_uint) -> Return,
    handle_by_index: unsafe extern "C" fn(c_uint, *mut Device) -> Return,
    handle_by_pci_bus_id: unsafe extern "C" fn(*const c_char, *mut Device) -> Return,
    name: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Return,
    pci_info: unsafe extern "C" fn(Device, *mut PciInfo) -> Return,
    memory_info: unsafe extern "C" fn(Device, *mut Memory) -> Return,
    utilization: unsafe extern "C" fn(Device, *mut Utilization) -> Return,
    clock_info: unsafe extern "C" fn(Device, c_int, *mut c_uint) -> Return,
    power_usage_mw: unsafe extern "C" fn(Device, *mut c_uint) -> Return,
    temperature: unsafe extern "C" fn(Device, c_int, *mut c_uint) -> Return,
}

/// An initialised NVML; `nvmlShutdown` on drop (NVML counts inits, so several coexist).
pub struct Nvml {
    api: Api,
    // Declared after `api` and dropped after Drop::drop ran nvmlShutdown.
    _lib: libloading::Library,
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: paired with the successful nvmlInit_v2 in `load_from`; handles
        // obtained from this Nvml are not used after it drops (their owners hold it).
        unsafe { (self.api.shutdown)() };
    }
}

impl Nvml {
    /// Loads [`NVML_LIBRARY`] and initialises it.
    pub fn load() -> Result<Nvml> {
        Nvml::load_from(NVML_LIBRARY)
    }

    pub fn load_from(library: &str) -> Result<Nvml> {
        // SAFETY: loading runs the library's initialisers; NVML's have no
        // preconditions. The library stays loaded as long as `_lib`.
        let lib = unsafe { libloading::Library::new(library) }.map_err(|e| {
            anyhow!(
                "GPU telemetry is off: cannot load {library} (NVIDIA's NVML, installed with the GPU driver): {e}. \
                 Install the NVIDIA driver or add the folder holding {library} to LD_LIBRARY_PATH"
            )
        })?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the function type written at each use below is the prototype in
                // NVIDIA's nvml.h for that exported name; the pointer is used only while
                // `lib` is loaded (it moves into the returned Nvml with the pointers).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| anyhow!("GPU telemetry is off: {library} has no {} (driver too old?): {e}", $name))?
            };
        }
        // SAFETY for the optional symbol: same prototype as nvmlDeviceGetPciInfo_v3.
        let pci_info = match unsafe { lib.get(b"nvmlDeviceGetPciInfo_v3\0") } {
            Ok(f) => *f,
            Err(_) => sym!("nvmlDeviceGetPciInfo_v2"),
        };
        let api = Api {
            init: sym!("nvmlInit_v2"),
            shutdown: sym!("nvmlShutdown"),
            error_string: sym!("nvmlErrorString"),
            device_count: sym!("nvmlDeviceGetCount_v2"),
            handle_by_index: sym!("nvmlDeviceGetHandleByIndex_v2"),
            handle_by_pci_bus_id: sym!("nvmlDeviceGetHandleByPciBusId_v2"),
            name: sym!("nvmlDeviceGetName"),
            pci_info,
            memory_info: sym!("nvmlDeviceGetMemoryInfo"),
            utilization: sym!("nvmlDeviceGetUtilizationRates"),
            clock_info: sym!("nvmlDeviceGetClockInfo"),
            power_usage_mw: sym!("nvmlDeviceGetPowerUsage"),
            temperature: sym!("nvmlDeviceGetTemperature"),
        };
        // SAFETY: nvmlInit_v2 takes no arguments; it may be called from any thread.
        let rc = unsafe { (api.init)() };
        if rc != NVML_SUCCESS {
            // No Nvml value exists yet, so no shutdown will run for this failed init.
            // SAFETY: nvmlErrorString accepts any return code and gives a static string.
            let why = describe(unsafe { (api.error_string)(rc) });
            return Err(anyhow!(
                "GPU telemetry is off: {library} loaded but nvmlInit failed: {why} (NVML error {rc}); is the NVIDIA driver running?"
            ));
        }
        Ok(Nvml { api, _lib: lib })
    }

    fn check(&self, rc: Return, what: &str) -> Result<()> {
        if rc == NVML_SUCCESS {
            return Ok(());
        }
        // SAFETY: as in load_from.
        let why = describe(unsafe { (self.api.error_string)(rc) });
        Err(anyhow!("NVML {what}: {why} (NVML error {rc})"))
    }

    /// The GPU at a PCI bus id (NVML accepts `domain:bus:device.function` in hex).
    pub fn device_by_bus_id(&self, bus_id: &str) -> Result<Device> {
        let c = CString::new(bus_id).map_err(|_| anyhow!("PCI bus id {bus_id:?} contains NUL"))?;
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and a valid out-pointer.
        let rc = unsafe { (self.api.handle_by_pci_bus_id)(c.as_ptr(), &mut dev) };
        self.check(rc, &format!("has no GPU at PCI bus id {bus_id}"))?;
        Ok(dev)
    }

    /// Every GPU NVML sees, in its index order.
    pub fn inventory(&self) -> Result<Vec<NvmlGpuEntry>> {
        let mut count: c_uint = 0;
        // SAFETY: valid out-pointer.
        self.check(unsafe { (self.api.device_count)(&mut count) }, "device count")?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let mut dev: Device = std::ptr::null_mut();
            // SAFETY: index < count; valid out-pointer.
            self.check(unsafe { (self.api.handle_by_index)(index, &mut dev) }, &format!("GPU {index}"))?;
            let mut name = [0 as c_char; NAME_BUFFER];
            // SAFETY: the buffer holds NAME_BUFFER bytes, the length passed; NVML NUL-terminates.
            self.check(
                unsafe { (self.api.name)(dev, name.as_mut_ptr(), NAME_BUFFER as c_uint) },
                &format!("GPU {index} name"),
            )?;
            // SAFETY: a zeroed plain-old-data struct is a valid PciInfo; NVML fills it.
            let mut pci: PciInfo = unsafe { std::mem::zeroed() };
            // SAFETY: valid device handle and out-pointer of nvmlPciInfo_t's layout.
            self.check(unsafe { (self.api.pci_info)(dev, &mut pci) }, &format!("GPU {index} PCI info"))?;
            let mut mem = Memory::default();
            // SAFETY: valid device handle and out-pointer.
            let mem_rc = unsafe { (self.api.memory_info)(dev, &mut mem) };
            out.push(NvmlGpuEntry {
                index: index as usize,
                bus_id: c_array_str(&pci.bus_id),
                name: c_array_str(&name),
                memory_bytes: (mem_rc == NVML_SUCCESS).then_some(mem.total),
            });
        }
        Ok(out)
    }

    /// One reading of `dev`; each counter that fails is `None`.
    pub fn read(&self, dev: Device) -> GpuReading {
        let mut util = Utilization::default();
        let mut mem = Memory::default();
        let (mut sm, mut mw, mut temp): (c_uint, c_uint, c_uint) = (0, 0, 0);
        // SAFETY: `dev` came from this Nvml (see NvmlGpu); every out-pointer is valid
        // and of the type nvml.h declares.
        let (util_ok, mem_ok, sm_ok, mw_ok, temp_ok) = unsafe {
            (
                (self.api.utilization)(dev, &mut util) == NVML_SUCCESS,
                (self.api.memory_info)(dev, &mut mem) == NVML_SUCCESS,
                (self.api.clock_info)(dev, NVML_CLOCK_SM, &mut sm) == NVML_SUCCESS,
                (self.api.power_usage_mw)(dev, &mut mw) == NVML_SUCCESS,
                (self.api.temperature)(dev, NVML_TEMPERATURE_GPU, &mut temp) == NVML_SUCCESS,
            )
        };
        GpuReading {
            gpu_util_pct: util_ok.then_some(util.gpu),
            mem_util_pct: util_ok.then_some(util.memory),
            mem_used_bytes: mem_ok.then_some(mem.used),
            sm_clock_mhz: sm_ok.then_some(sm),
            power_w: mw_ok.then_some(f64::from(mw) / 1000.0),
            temperature_c: temp_ok.then_some(temp),
        }
    }
}

/// NVML's static error text, or a placeholder for NULL.
fn describe(p: *const c_char) -> String {
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-NULL pointers from nvmlErrorString are static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A C string in a fixed buffer, up to its first NUL (or the buffer's end).
fn c_array_str(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn structs_match_nvml_h() {
        // nvml.h: char[16], five unsigned ints, char[32] -> 68 bytes, busId at 36.
        assert_eq!(size_of::<PciInfo>(), 68);
        assert_eq!(offset_of!(PciInfo, domain), 16);
        assert_eq!(offset_of!(PciInfo, bus_id), 36);
        assert_eq!(size_of::<Memory>(), 24);
        assert_eq!(size_of::<Utilization>(), 8);
    }

    #[test]
    fn c_strings_stop_at_nul_or_end() {
        let mut b = [0 as c_char; 8];
        for (i, c) in b"A40\0xx".iter().enumerate() {
            b[i] = *c as c_char;
        }
        assert_eq!(c_array_str(&b), "A40");
        let full = [b'x' as c_char; 4];
        assert_eq!(c_array_str(&full), "xxxx");
    }
}
