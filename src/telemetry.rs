//! GPU telemetry: the node's GPU inventory and a background sampler writing one
//! CSV row per period (utilisation, memory, SM clock, power, temperature).
//!
//! NVIDIA's NVML (`libnvidia-ml.so.1`, installed with the driver) is loaded at run
//! time, never linked, so ddpbench builds and runs where there is no driver: there
//! [`gpu_inventory`] falls back to the driver's procfs or an empty list, and
//! [`GpuSampler::start`] returns an error saying telemetry is off. The sampler
//! reads through the small [`GpuSource`] trait, so its thread and CSV writing are
//! tested with a fake source. Every `unsafe` NVML call lives in the private `nvml` module.

use crate::record::{format_plain, rfc3339_utc, CsvLog};
use crate::topology::parse_pci_bus_id;
use anyhow::{anyhow, ensure, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// The NVML library looked for (the driver's soname; no development package needed).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// One GPU of this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    /// NVML's index (PCI bus id order; ignores `CUDA_VISIBLE_DEVICES`).
    pub index: usize,
    /// Canonical PCI bus id, e.g. `0000:3b:00.0`.
    pub bus_id: String,
    /// Model name as the driver reports it, e.g. `NVIDIA A40`.
    pub name: String,
    /// Total device memory; `None` when only procfs was available.
    pub memory_bytes: Option<u64>,
}

/// The node's GPUs: from NVML when it loads, else names and bus ids from the
/// driver's `/proc/driver/nvidia/gpus/*/information`, else none. Never fails.
pub fn gpu_inventory() -> Vec<GpuInfo> {
    match nvml::Nvml::load().and_then(|n| n.inventory()) {
        Ok(gpus) => gpus,
        Err(_) => inventory_from_procfs(Path::new("/proc/driver/nvidia/gpus")),
    }
}

/// GPUs listed under the driver's procfs folder (`<bus id>/information`), in bus id order.
fn inventory_from_procfs(root: &Path) -> Vec<GpuInfo> {
    let Ok(dir) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<(String, String)> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join("information")).ok()?;
            let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string());
            let name = field("Model:")?;
            let raw = field("Bus Location:").unwrap_or_else(|| e.file_name().to_string_lossy().into_owned());
            let bus_id = parse_pci_bus_id(&raw).map(|b| b.to_string()).unwrap_or(raw);
            Some((bus_id, name))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .enumerate()
        .map(|(index, (bus_id, name))| GpuInfo {
            index,
            bus_id,
            name,
            memory_bytes: None,
        })
        .collect()
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

/// Something that reads a GPU's counters: NVML ([`NvmlGpu`]) or a test's fake.
pub trait GpuSource: Send + 'static {
    fn read(&mut self) -> GpuReading;
}

/// One GPU opened through NVML by its PCI bus id.
pub struct NvmlGpu {
    nvml: nvml::Nvml,
    device: nvml::Device,
}

// SAFETY: NVML is thread-safe (documented: calls may be made concurrently from any
// thread), and `device` stays valid until nvmlShutdown, which runs only when the
// `nvml` owned by this same value drops.
unsafe impl Send for NvmlGpu {}

impl NvmlGpu {
    /// Loads NVML and opens the GPU at `bus_id` (any form [`parse_pci_bus_id`] accepts).
    pub fn open(bus_id: &str) -> Result<NvmlGpu> {
        let id = parse_pci_bus_id(bus_id)?;
        let nvml = nvml::Nvml::load()?;
        let device = nvml.device_by_bus_id(&id.to_string())?;
        Ok(NvmlGpu { nvml, device })
    }
}

impl GpuSource for NvmlGpu {
    fn read(&mut self) -> GpuReading {
        self.nvml.read(self.device)
    }
}

/// One telemetry row (`gpu-rank-NNNNN.csv` or wherever the caller writes it).
#[derive(Debug, Clone, Serialize)]
struct TelemetryRow {
    rank: usize,
    time_utc: String,
    /// Seconds from the sampler's origin to the reading.
    #[serde(serialize_with = "crate::record::plain_decimal")]
    elapsed_s: f64,
    gpu_util_pct: Option<u32>,
    mem_util_pct: Option<u32>,
    mem_used_bytes: Option<u64>,
    sm_clock_mhz: Option<u32>,
    #[serde(serialize_with = "optional_plain")]
    power_w: Option<f64>,
    temperature_c: Option<u32>,
}

/// `None` and non-finite values as an empty cell, others as a plain decimal.
fn optional_plain<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.map(format_plain).unwrap_or_default())
}

/// What a sampler saw, over the readings that succeeded.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TelemetrySummary {
    /// Rows written.
    pub samples: usize,
    /// Mean GPU utilisation, percent; `None` when no reading succeeded.
    pub mean_gpu_util_pct: Option<f64>,
    /// Highest device memory in use, bytes.
    pub max_mem_used_bytes: Option<u64>,
    /// Mean board power, watts.
    pub mean_power_w: Option<f64>,
}

#[derive(Default)]
struct Totals {
    samples: usize,
    util_sum: f64,
    util_n: usize,
    mem_max: Option<u64>,
    power_sum: f64,
    power_n: usize,
}

impl Totals {
    fn add(&mut self, r: &GpuReading) {
        self.samples += 1;
        if let Some(u) = r.gpu_util_pct {
            self.util_sum += f64::from(u);
            self.util_n += 1;
        }
        if let Some(m) = r.mem_used_bytes {
            self.mem_max = Some(self.mem_max.map_or(m, |x| x.max(m)));
        }
        if let Some(p) = r.power_w.filter(|p| p.is_finite()) {
            self.power_sum += p;
            self.power_n += 1;
        }
    }
    fn summary(&self) -> TelemetrySummary {
        let mean = |sum: f64, n: usize| (n > 0).then(|| sum / n as f64);
        TelemetrySummary {
            samples: self.samples,
            mean_gpu_util_pct: mean(self.util_sum, self.util_n),
            max_mem_used_bytes: self.mem_max,
            mean_power_w: mean(self.power_sum, self.power_n),
        }
    }
}

/// A background thread reading one GPU every period into a CSV file.
///
/// Columns: `rank, time_utc, elapsed_s, gpu_util_pct, mem_util_pct, mem_used_bytes,
/// sm_clock_mhz, power_w, temperature_c`; a failed reading is an empty cell. Each
/// row is flushed as written, so a crash keeps what was sampled. [`GpuSampler::stop`]
/// wakes the thread at once (it never waits out a period); dropping the sampler
/// stops it too, discarding the summary.
pub struct GpuSampler {
    stop_tx: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<Result<TelemetrySummary>>>,
    path: PathBuf,
}

impl GpuSampler {
    /// Samples the GPU at `bus_id` through NVML every `period_ms` into `path`, from now.
    ///
    /// Fails before creating `path` when NVML is absent (the error names
    /// [`NVML_LIBRARY`] and says telemetry is off) or has no GPU at `bus_id`.
    pub fn start(bus_id: &str, rank: usize, path: &Path, period_ms: u64) -> Result<GpuSampler> {
        ensure!(period_ms > 0, "the GPU sampling period must be at least 1 ms");
        let gpu = NvmlGpu::open(bus_id)?;
        GpuSampler::start_with(gpu, rank, path, Duration::from_millis(period_ms), Instant::now())
    }

    /// Samples `source` every `period` into `path`; `elapsed_s` counts from `origin`
    /// (pass the run's common start to line rows up with the step CSVs).
    pub fn start_with<S: GpuSource>(source: S, rank: usize, path: &Path, period: Duration, origin: Instant) -> Result<GpuSampler> {
        ensure!(!period.is_zero(), "the GPU sampling period must be above zero");
        let log = CsvLog::<TelemetryRow>::create(path)?;
        let (stop_tx, stop_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("gpu-telemetry-{rank}"))
            .spawn(move || sample_loop(source, log, rank, period, origin, stop_rx))
            .context("cannot start the GPU telemetry thread")?;
        Ok(GpuSampler {
            stop_tx: Some(stop_tx),
            thread: Some(thread),
            path: path.to_path_buf(),
        })
    }

    /// Stops the thread (within one period: it is woken, not waited for) and
    /// returns what it saw, or the first write error.
    pub fn stop(mut self) -> Result<TelemetrySummary> {
        self.finish()
    }

    fn finish(&mut self) -> Result<TelemetrySummary> {
        // Dropping the sender wakes the thread's recv_timeout with Disconnected.
        drop(self.stop_tx.take());
        let Some(thread) = self.thread.take() else {
            return Ok(TelemetrySummary::default());
        };
        thread
            .join()
            .map_err(|_| anyhow!("the GPU telemetry thread writing {} panicked", self.path.display()))?
    }
}

impl Drop for GpuSampler {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

fn sample_loop<S: GpuSource>(
    mut source: S,
    mut log: CsvLog<TelemetryRow>,
    rank: usize,
    period: Duration,
    origin: Instant,
    stop: mpsc::Receiver<()>,
) -> Result<TelemetrySummary> {
    let mut totals = Totals::default();
    let mut next = Instant::now();
    loop {
        let at = Instant::now();
        let wall = SystemTime::now();
        let r = source.read();
        log.write(&TelemetryRow {
            rank,
            time_utc: rfc3339_utc(wall),
            elapsed_s: at.saturating_duration_since(origin).as_secs_f64(),
            gpu_util_pct: r.gpu_util_pct,
            mem_util_pct: r.mem_util_pct,
            mem_used_bytes: r.mem_used_bytes,
            sm_clock_mhz: r.sm_clock_mhz,
            power_w: r.power_w,
            temperature_c: r.temperature_c,
        })?;
        log.flush()?;
        totals.add(&r);
        // Keep a fixed grid (no drift); skip ticks missed while a reading was slow.
        let now = Instant::now();
        while next <= now {
            next += period;
        }
        match stop.recv_timeout(next - now) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    log.flush()?;
    Ok(totals.summary())
}

/// NVML through `dlopen`: prototypes from NVIDIA's `nvml.h`, minimal structs, and
/// the only `unsafe` code of telemetry.
mod nvml {
    use super::{GpuInfo, GpuReading, NVML_LIBRARY};
    use crate::topology::parse_pci_bus_id;
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

        pub(super) fn load_from(library: &str) -> Result<Nvml> {
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
                    *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                        anyhow!(
                            "GPU telemetry is off: {library} has no {} (driver too old?): {e}",
                            $name
                        )
                    })?
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
        pub fn inventory(&self) -> Result<Vec<GpuInfo>> {
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
                let raw = c_array_str(&pci.bus_id);
                out.push(GpuInfo {
                    index: index as usize,
                    bus_id: parse_pci_bus_id(&raw).map(|b| b.to_string()).unwrap_or(raw),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Cycles through fixed readings and counts calls.
    struct Fake {
        readings: Vec<GpuReading>,
        calls: Arc<AtomicUsize>,
    }

    impl GpuSource for Fake {
        fn read(&mut self) -> GpuReading {
            let i = self.calls.fetch_add(1, Ordering::SeqCst);
            self.readings[i % self.readings.len()].clone()
        }
    }

    fn readings() -> Vec<GpuReading> {
        vec![
            GpuReading {
                gpu_util_pct: Some(90),
                mem_util_pct: Some(40),
                mem_used_bytes: Some(10_000_000_000),
                sm_clock_mhz: Some(1740),
                power_w: Some(250.125),
                temperature_c: Some(61),
            },
            // A reading where every counter failed (e.g. NVML_ERROR_NOT_SUPPORTED).
            GpuReading::default(),
            GpuReading {
                gpu_util_pct: Some(70),
                mem_used_bytes: Some(12_000_000_000),
                power_w: Some(f64::NAN),
                ..GpuReading::default()
            },
        ]
    }

    fn wait_for(calls: &AtomicUsize, n: usize) {
        let t = Instant::now();
        while calls.load(Ordering::SeqCst) < n {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "sampler made only {} readings",
                calls.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn writes_csv_rows_with_empty_cells_and_summarises() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu-rank-00003.csv");
        let calls = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            readings: readings(),
            calls: calls.clone(),
        };
        let s = GpuSampler::start_with(fake, 3, &path, Duration::from_millis(5), Instant::now()).unwrap();
        wait_for(&calls, 6);
        let summary = s.stop().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "rank,time_utc,elapsed_s,gpu_util_pct,mem_util_pct,mem_used_bytes,sm_clock_mhz,power_w,temperature_c"
        );
        let rows = &lines[1..];
        assert_eq!(rows.len(), summary.samples);
        assert!(summary.samples >= 6);
        assert!(!text.contains("NaN") && !text.contains("e-"), "{text}");
        let mut last_elapsed = -1.0;
        for (i, row) in rows.iter().enumerate() {
            let cells: Vec<&str> = row.split(',').collect();
            assert_eq!(cells.len(), 9, "{row}");
            assert_eq!(cells[0], "3");
            assert!(cells[1].ends_with('Z') && cells[1].len() == 27, "{}", cells[1]);
            let elapsed: f64 = cells[2].parse().unwrap();
            assert!(elapsed >= last_elapsed, "elapsed_s goes forward");
            last_elapsed = elapsed;
            let want = match i % 3 {
                0 => "90,40,10000000000,1740,250.125,61",
                1 => ",,,,,",
                _ => "70,,12000000000,,,",
            };
            assert_eq!(cells[3..].join(","), want, "row {i}");
        }
        // Means over the readings that succeeded only.
        let n = summary.samples;
        let utils: Vec<f64> = (0..n).filter_map(|i| [Some(90.0), None, Some(70.0)][i % 3]).collect();
        let mean_util = utils.iter().sum::<f64>() / utils.len() as f64;
        assert!((summary.mean_gpu_util_pct.unwrap() - mean_util).abs() < 1e-9);
        assert_eq!(summary.max_mem_used_bytes, Some(12_000_000_000));
        assert_eq!(summary.mean_power_w, Some(250.125), "NaN power is left out");
    }

    #[test]
    fn stop_returns_within_one_period() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        let calls = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            readings: readings(),
            calls: calls.clone(),
        };
        let period = Duration::from_secs(5);
        let s = GpuSampler::start_with(fake, 0, &path, period, Instant::now()).unwrap();
        wait_for(&calls, 1);
        let t = Instant::now();
        let summary = s.stop().unwrap();
        let took = t.elapsed();
        assert!(took < period / 10, "stop took {took:?} with a {period:?} period");
        assert_eq!(summary.samples, 1, "one reading at start, none while waiting");
        // Dropping without stop also ends the thread promptly and keeps the rows.
        let calls2 = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            readings: readings(),
            calls: calls2.clone(),
        };
        let s = GpuSampler::start_with(fake, 0, &path, period, Instant::now()).unwrap();
        wait_for(&calls2, 1);
        let t = Instant::now();
        drop(s);
        assert!(t.elapsed() < period / 10);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    }

    #[test]
    fn samples_on_a_fixed_grid() {
        let dir = tempfile::tempdir().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            readings: readings(),
            calls: calls.clone(),
        };
        let s = GpuSampler::start_with(fake, 0, &dir.path().join("g.csv"), Duration::from_millis(50), Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(520));
        let n = s.stop().unwrap().samples;
        // 11 ticks in 520 ms; loose bounds for a loaded 2-core machine.
        assert!((3..=12).contains(&n), "{n} samples");
    }

    #[test]
    fn bad_path_or_period_fails_at_start() {
        let fake = || Fake {
            readings: readings(),
            calls: Arc::new(AtomicUsize::new(0)),
        };
        let missing = Path::new("/nonexistent-ddpbench-dir/gpu.csv");
        let e = GpuSampler::start_with(fake(), 0, missing, Duration::from_millis(10), Instant::now())
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("/nonexistent-ddpbench-dir/gpu.csv"), "{e:#}");
        let dir = tempfile::tempdir().unwrap();
        let e = GpuSampler::start_with(fake(), 0, &dir.path().join("x.csv"), Duration::ZERO, Instant::now())
            .err()
            .unwrap();
        assert!(e.to_string().contains("period"), "{e}");
        let e = GpuSampler::start("0000:3b:00.0", 0, &dir.path().join("y.csv"), 0).err().unwrap();
        assert!(e.to_string().contains("period"), "{e}");
    }

    #[test]
    fn missing_nvml_is_an_error_not_a_panic() {
        let e = nvml::Nvml::load_from("libnvidia-ml-ddpbench-absent.so.1")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("libnvidia-ml-ddpbench-absent.so.1") && e.contains("telemetry is off"),
            "{e}"
        );
        // The real library: where it is absent (this CI machine), start says so and writes nothing.
        let nvml_here = nvml::Nvml::load().is_ok();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.csv");
        match GpuSampler::start("0000:3b:00.0", 0, &path, 100) {
            Err(e) if !nvml_here => {
                let e = format!("{e:#}");
                assert!(e.contains(NVML_LIBRARY) && e.contains("telemetry is off"), "{e}");
                assert!(!path.exists(), "no file when telemetry is off");
            }
            Err(e) => assert!(format!("{e:#}").contains("0000:3b:00.0"), "{e:#}"),
            Ok(s) => drop(s.stop()),
        }
        let e = GpuSampler::start("not-a-bus-id", 0, &path, 100).err().unwrap();
        assert!(e.to_string().contains("not a PCI bus id"), "{e}");
    }

    #[test]
    fn inventory_reads_the_driver_procfs() {
        let dir = tempfile::tempdir().unwrap();
        for (bus, model) in [("0000:af:00.0", "NVIDIA A40"), ("0000:3b:00.0", "NVIDIA A40")] {
            let d = dir.path().join(bus);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!("Model: \t\t {model}\nIRQ:   \t\t 130\nBus Type: \t PCIe\nBus Location: \t {bus}\nDevice Minor: \t 0\n"),
            )
            .unwrap();
        }
        std::fs::create_dir(dir.path().join("junk")).unwrap();
        let gpus = inventory_from_procfs(dir.path());
        assert_eq!(
            gpus,
            vec![
                GpuInfo {
                    index: 0,
                    bus_id: "0000:3b:00.0".into(),
                    name: "NVIDIA A40".into(),
                    memory_bytes: None
                },
                GpuInfo {
                    index: 1,
                    bus_id: "0000:af:00.0".into(),
                    name: "NVIDIA A40".into(),
                    memory_bytes: None
                },
            ]
        );
        assert!(inventory_from_procfs(&dir.path().join("absent")).is_empty());
        // On this machine: whatever is there, no panic; nothing when there is no driver.
        let here = gpu_inventory();
        if nvml::Nvml::load().is_err() && !Path::new("/proc/driver/nvidia/gpus").exists() {
            assert!(here.is_empty());
        }
    }
}
