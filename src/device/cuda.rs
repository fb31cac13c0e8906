//! The CUDA driver and NCCL, loaded at run time.
//!
//! Neither library is linked: a CPU node without them runs every other command, and an
//! explicit `--allreduce nccl` that cannot work is an error that says which file was
//! looked for. Only the handful of entry points ddpbench uses are bound, each with
//! the prototype of `cuda.h` (CUDA 12/13) or `nccl.h` (2.x).
//!
//! Streams: libtorch issues its kernels on the legacy default stream unless told
//! otherwise (tch never tells it otherwise). NCCL runs on a stream of its own, created
//! non-blocking so that it does not serialise with the legacy stream (a blocking one
//! would make every later backward kernel wait for the all-reduce, killing overlap);
//! ordering is by events: the NCCL stream waits for an event recorded on the legacy
//! stream when a bucket is ready, and the legacy stream waits for the NCCL stream's
//! event before the optimizer reads the gradients.

use anyhow::{anyhow, bail, Context, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

type CuResult = c_int;
type CuEvent = *mut c_void;
type CuContext = *mut c_void;

/// A CUDA stream handle (`CUstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct Stream(*mut c_void);
// SAFETY: CUDA handles may be used from any thread once created.
unsafe impl Send for Stream {}

/// The legacy default stream (`CU_STREAM_LEGACY`, the handle value 1), where libtorch
/// runs its kernels.
#[allow(clippy::manual_dangling_ptr)] // a documented handle value, never dereferenced
pub const LEGACY_STREAM: Stream = Stream(0x1 as *mut c_void);
const CU_STREAM_NON_BLOCKING: c_uint = 1;
const CU_EVENT_DEFAULT: c_uint = 0;
const CU_EVENT_DISABLE_TIMING: c_uint = 2;

/// Entry points of libcuda.so.1 (the driver API).
pub struct Driver {
    _lib: Library,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, c_int) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut Stream, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(Stream) -> CuResult,
    stream_wait_event: unsafe extern "C" fn(Stream, CuEvent, c_uint) -> CuResult,
    event_create: unsafe extern "C" fn(*mut CuEvent, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(CuEvent, Stream) -> CuResult,
    event_synchronize: unsafe extern "C" fn(CuEvent) -> CuResult,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, CuEvent, CuEvent) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

/// Loads the first library of `candidates` that opens, naming every failure otherwise.
fn open_first(candidates: &[String], what: &str, hint: &str) -> Result<Library> {
    let mut errors = Vec::new();
    for name in candidates {
        // SAFETY: loading a shared library runs its initialisers; CUDA's and NCCL's are
        // safe to run in any process.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok(lib),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    bail!("{what} could not be loaded ({}). {hint}", errors.join("; "))
}

/// Resolves `name` in `lib` as a function pointer of type `T`.
///
/// SAFETY: `T` must be the C prototype of `name`.
unsafe fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T> {
    let s: libloading::Symbol<T> = lib
        .get(name.as_bytes())
        .with_context(|| format!("symbol {name} missing from the loaded library (too old a version?)"))?;
    Ok(*s)
}

impl Driver {
    fn load() -> Result<Driver> {
        let lib = open_first(
            &["libcuda.so.1".into(), "libcuda.so".into()],
            "The CUDA driver (libcuda.so.1)",
            "Is the NVIDIA driver installed on this node?",
        )?;
        // SAFETY: each prototype below is cuda.h's for that symbol.
        unsafe {
            let elapsed = sym(&lib, "cuEventElapsedTime_v2").or_else(|_| sym(&lib, "cuEventElapsedTime"))?;
            let d = Driver {
                init: sym(&lib, "cuInit")?,
                device_get: sym(&lib, "cuDeviceGet")?,
                device_get_pci_bus_id: sym(&lib, "cuDeviceGetPCIBusId")?,
                primary_ctx_retain: sym(&lib, "cuDevicePrimaryCtxRetain")?,
                ctx_set_current: sym(&lib, "cuCtxSetCurrent")?,
                stream_create: sym(&lib, "cuStreamCreate")?,
                stream_synchronize: sym(&lib, "cuStreamSynchronize")?,
                stream_wait_event: sym(&lib, "cuStreamWaitEvent")?,
                event_create: sym(&lib, "cuEventCreate")?,
                event_record: sym(&lib, "cuEventRecord")?,
                event_synchronize: sym(&lib, "cuEventSynchronize")?,
                event_elapsed_time: elapsed,
                get_error_string: sym(&lib, "cuGetErrorString")?,
                _lib: lib,
            };
            d.check((d.init)(0), "cuInit")?;
            Ok(d)
        }
    }

    fn check(&self, code: CuResult, call: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves null).
        let msg = unsafe {
            (self.get_error_string)(code, &mut text);
            if text.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            }
        };
        bail!("{call} failed: CUDA error {code} ({msg})")
    }

    /// Makes device `ordinal`'s primary context (the one libtorch uses) current on this thread.
    pub fn use_device(&self, ordinal: usize) -> Result<()> {
        let mut dev = 0;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: out-pointers to locals.
        unsafe {
            self.check((self.device_get)(&mut dev, ordinal as c_int), "cuDeviceGet")?;
            self.check((self.primary_ctx_retain)(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
            self.check((self.ctx_set_current)(ctx), "cuCtxSetCurrent")
        }
    }

    /// The PCI bus id of device `ordinal` (as CUDA numbers it here), e.g. `0000:3B:00.0`.
    pub fn pci_bus_id(&self, ordinal: usize) -> Result<String> {
        let mut dev = 0;
        let mut buf = [0 as c_char; 32];
        // SAFETY: the buffer's length is passed; CUDA NUL-terminates within it.
        unsafe {
            self.check((self.device_get)(&mut dev, ordinal as c_int), "cuDeviceGet")?;
            self.check(
                (self.device_get_pci_bus_id)(buf.as_mut_ptr(), buf.len() as c_int, dev),
                "cuDeviceGetPCIBusId",
            )?;
            Ok(CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned())
        }
    }

    /// A stream that does not synchronise implicitly with the legacy default stream.
    pub fn non_blocking_stream(&self) -> Result<Stream> {
        let mut s = Stream(std::ptr::null_mut());
        // SAFETY: out-pointer to a local; a context is current (use_device).
        unsafe { self.check((self.stream_create)(&mut s, CU_STREAM_NON_BLOCKING), "cuStreamCreate")? };
        Ok(s)
    }

    /// Waits for the work queued so far on `stream` (and only that stream).
    pub fn synchronize(&self, stream: Stream) -> Result<()> {
        // SAFETY: a valid stream handle.
        unsafe { self.check((self.stream_synchronize)(stream), "cuStreamSynchronize") }
    }

    pub fn event(&self, timing: bool) -> Result<Event> {
        let mut e: CuEvent = std::ptr::null_mut();
        let flags = if timing { CU_EVENT_DEFAULT } else { CU_EVENT_DISABLE_TIMING };
        // SAFETY: out-pointer to a local.
        unsafe { self.check((self.event_create)(&mut e, flags), "cuEventCreate")? };
        Ok(Event(e))
    }

    pub fn record(&self, event: &Event, stream: Stream) -> Result<()> {
        // SAFETY: valid event and stream handles.
        unsafe { self.check((self.event_record)(event.0, stream), "cuEventRecord") }
    }

    /// Makes `stream` wait (on the device, not the host) for `event`.
    pub fn wait(&self, stream: Stream, event: &Event) -> Result<()> {
        // SAFETY: valid handles.
        unsafe { self.check((self.stream_wait_event)(stream, event.0, 0), "cuStreamWaitEvent") }
    }

    pub fn event_synchronize(&self, event: &Event) -> Result<()> {
        // SAFETY: a valid event handle.
        unsafe { self.check((self.event_synchronize)(event.0), "cuEventSynchronize") }
    }

    /// Seconds between two completed timing events.
    pub fn elapsed_s(&self, start: &Event, end: &Event) -> Result<f64> {
        let mut ms = 0f32;
        // SAFETY: out-pointer to a local; both events were recorded with timing.
        unsafe { self.check((self.event_elapsed_time)(&mut ms, start.0, end.0), "cuEventElapsedTime")? };
        Ok(ms as f64 * 1e-3)
    }
}

/// A CUDA event handle. Events live as long as the run (a few per bucket).
pub struct Event(CuEvent);

// SAFETY: CUDA handles may be used from any thread once created.
unsafe impl Send for Event {}

/// The driver, loaded once per process.
pub fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| Driver::load().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// Makes libtorch's legacy default stream on the current device finish its queued work,
/// without waiting for NCCL's stream (cudaDeviceSynchronize would wait for both).
pub fn sync_torch_stream() -> Result<()> {
    let d = driver()?;
    d.synchronize(LEGACY_STREAM)
}

/// An NCCL communicator handle (`ncclComm_t`).
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct NcclComm(*mut c_void);
type NcclResult = c_int;

/// NCCL data types (nccl.h `ncclDataType_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub enum NcclDtype {
    Float16 = 6,
    Float32 = 7,
    Bfloat16 = 9,
}

const NCCL_SUM: c_int = 0;

/// `ncclUniqueId`: 128 opaque bytes that rank 0 makes and every rank must receive.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct NcclUniqueId {
    pub internal: [u8; 128],
}

/// Entry points of libnccl.so.2.
pub struct Nccl {
    _lib: Library,
    /// Where it was loaded from (recorded in the manifest).
    pub source: String,
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut NcclComm, c_int, NcclUniqueId, c_int) -> NcclResult,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, Stream) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(NcclComm) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

/// Where libnccl.so.2 is looked for, in order: `DDPBENCH_NCCL_LIB`; the soname, which
/// finds the copy libtorch_cuda already loaded (so ddpbench and libtorch share one NCCL);
/// the torch wheel's `nvidia/nccl/lib` beside libtorch.
pub fn nccl_candidates(env_override: Option<String>, libtorch_lib: Option<&str>) -> Vec<String> {
    let mut c = Vec::new();
    if let Some(path) = env_override.filter(|p| !p.is_empty()) {
        c.push(path);
    }
    c.push("libnccl.so.2".into());
    if let Some(dir) = libtorch_lib.filter(|d| !d.is_empty()) {
        // <site-packages>/torch/lib -> <site-packages>/nvidia/nccl/lib
        c.push(format!("{dir}/../../nvidia/nccl/lib/libnccl.so.2"));
    }
    c.push("libnccl.so".into());
    c
}

impl Nccl {
    fn load() -> Result<Nccl> {
        let candidates = nccl_candidates(std::env::var("DDPBENCH_NCCL_LIB").ok(), option_env!("DDPBENCH_LIBTORCH_LIB"));
        let lib = open_first(
            &candidates,
            "NCCL (libnccl.so.2)",
            "Install the nvidia-nccl wheel beside torch, set DDPBENCH_NCCL_LIB=/path/to/libnccl.so.2, or use --allreduce mpi",
        )?;
        // SAFETY: each prototype below is nccl.h's for that symbol.
        unsafe {
            Ok(Nccl {
                get_version: sym(&lib, "ncclGetVersion")?,
                get_unique_id: sym(&lib, "ncclGetUniqueId")?,
                comm_init_rank: sym(&lib, "ncclCommInitRank")?,
                all_reduce: sym(&lib, "ncclAllReduce")?,
                comm_destroy: sym(&lib, "ncclCommDestroy")?,
                get_error_string: sym(&lib, "ncclGetErrorString")?,
                source: candidates.join(" | "),
                _lib: lib,
            })
        }
    }

    fn check(&self, code: NcclResult, call: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string.
        let msg = unsafe { CStr::from_ptr((self.get_error_string)(code)).to_string_lossy().into_owned() };
        bail!("{call} failed: NCCL error {code} ({msg}). NCCL_DEBUG=WARN shows NCCL's own account")
    }

    /// NCCL's version as `major.minor.patch`.
    pub fn version(&self) -> String {
        let mut v = 0;
        // SAFETY: out-pointer to a local.
        if unsafe { (self.get_version)(&mut v) } != 0 {
            return "unknown".into();
        }
        let (major, rest) = if v >= 10000 { (v / 10000, v % 10000) } else { (v / 1000, v % 1000) };
        format!("{major}.{}.{}", rest / 100, rest % 100)
    }

    pub fn unique_id(&self) -> Result<NcclUniqueId> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: out-pointer to a local of nccl.h's layout.
        unsafe { self.check((self.get_unique_id)(&mut id), "ncclGetUniqueId")? };
        Ok(id)
    }

    /// Joins the communicator of `ranks` ranks named by `id` (a collective: every rank calls it).
    pub fn init_rank(&self, ranks: usize, id: NcclUniqueId, rank: usize) -> Result<NcclComm> {
        let mut comm = NcclComm(std::ptr::null_mut());
        // SAFETY: out-pointer to a local; the device is current on this thread.
        unsafe {
            self.check(
                (self.comm_init_rank)(&mut comm, ranks as c_int, id, rank as c_int),
                "ncclCommInitRank",
            )?
        };
        Ok(comm)
    }

    /// Queues a sum all-reduce of `count` elements on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must be device pointers to `count` elements of `dtype`
    /// that stay allocated until the stream has run the operation.
    pub unsafe fn all_reduce_sum(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: NcclDtype,
        comm: NcclComm,
        stream: Stream,
    ) -> Result<()> {
        self.check(
            (self.all_reduce)(send, recv, count, dtype as c_int, NCCL_SUM, comm, stream),
            "ncclAllReduce",
        )
    }

    pub fn destroy(&self, comm: NcclComm) {
        // SAFETY: a communicator made by init_rank, destroyed once.
        unsafe {
            let _ = (self.comm_destroy)(comm);
        }
    }
}

/// NCCL, loaded once per process.
pub fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(|| Nccl::load().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_is_looked_for_by_override_then_soname_then_beside_torch() {
        let c = nccl_candidates(Some("/opt/nccl/libnccl.so.2".into()), Some("/v/site-packages/torch/lib"));
        assert_eq!(
            c,
            vec![
                "/opt/nccl/libnccl.so.2",
                "libnccl.so.2",
                "/v/site-packages/torch/lib/../../nvidia/nccl/lib/libnccl.so.2",
                "libnccl.so"
            ]
        );
        assert_eq!(nccl_candidates(Some(String::new()), None), vec!["libnccl.so.2", "libnccl.so"]);
    }

    #[test]
    fn unique_id_has_nccls_size() {
        // nccl.h: typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId; with 128 bytes.
        assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
    }

    #[test]
    fn missing_driver_is_an_error_not_a_panic() {
        // This machine has no NVIDIA driver: the error must say what was looked for.
        if std::path::Path::new("/proc/driver/nvidia/version").exists() {
            return; // a GPU node: nothing to prove here
        }
        let err = driver().err().expect("no driver on this machine");
        assert!(format!("{err}").contains("libcuda.so.1"), "{err}");
        assert!(sync_torch_stream().is_err());
    }

    #[test]
    fn nccl_from_the_torch_wheel_loads_and_fails_cleanly_without_a_gpu() {
        // The torch wheel ships libnccl.so.2, so NCCL loads even on this GPU-less machine.
        let nccl = match nccl() {
            Ok(n) => n,
            Err(e) => panic!("the torch wheel's NCCL should load here: {e}"),
        };
        assert!(nccl.version().starts_with("2."), "{}", nccl.version());
        if std::path::Path::new("/proc/driver/nvidia/version").exists() {
            return;
        }
        // Joining a communicator needs a device: an error with NCCL's words, not a crash.
        let joined = nccl.unique_id().and_then(|id| nccl.init_rank(1, id, 0));
        let err = joined.expect_err("no GPU here");
        assert!(format!("{err}").contains("NCCL error"), "{err}");
    }
}
