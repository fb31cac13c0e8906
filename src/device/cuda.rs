//! The CUDA driver and NCCL through `cudarc`, which opens both at run time (its
//! `dynamic-loading`): a CPU node without them runs every other command. cudarc
//! panics when a call reaches a library it could not open, so every entry here first
//! checks the library is present and turns its absence into an error that says what
//! was looked for and what to do.
//!
//! Streams: libtorch issues its kernels on the legacy default stream unless told
//! otherwise (tch never tells it otherwise). NCCL runs on a stream of its own, created
//! non-blocking so that it does not serialise with the legacy stream (a blocking one
//! would make every later backward kernel wait for the all-reduce, killing overlap);
//! ordering is by events: the NCCL stream waits for an event recorded on the legacy
//! stream when a bucket is ready, and the legacy stream waits for the NCCL stream's
//! event before the optimizer reads the gradients.

use anyhow::{anyhow, bail, Result};
use cudarc::driver::result as cu;
use cudarc::driver::sys as cusys;
use cudarc::nccl::result as nc;
use cudarc::nccl::sys as ncsys;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// A CUDA stream handle (`CUstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct Stream(cusys::CUstream);
// SAFETY: CUDA handles may be used from any thread once created.
unsafe impl Send for Stream {}

/// The legacy default stream (`CU_STREAM_LEGACY`, the handle value 1), where libtorch
/// runs its kernels.
#[allow(clippy::manual_dangling_ptr)] // a documented handle value, never dereferenced
pub(crate) const LEGACY_STREAM: Stream = Stream(0x1 as cusys::CUstream);

/// A CUDA event handle. Events live as long as the run (a few per bucket).
pub(crate) struct Event(cusys::CUevent);
// SAFETY: CUDA handles may be used from any thread once created.
unsafe impl Send for Event {}

fn driver_error(call: &str, e: cu::DriverError) -> anyhow::Error {
    anyhow!("{call} failed: {e:?}")
}

/// The CUDA driver, initialised.
pub(crate) struct Driver {
    _initialised: (),
}

impl Driver {
    fn load() -> Result<Driver> {
        // SAFETY: only tries to open the library.
        if !unsafe { cusys::is_culib_present() } {
            bail!("The CUDA driver (libcuda.so, libcuda.so.1) could not be loaded. Is the NVIDIA driver installed on this node?");
        }
        cu::init().map_err(|e| driver_error("cuInit", e))?;
        Ok(Driver { _initialised: () })
    }

    /// The driver's CUDA version, e.g. `13.0`.
    pub(crate) fn version(&self) -> String {
        let mut v: c_int = 0;
        // SAFETY: an out-pointer to a local; the library is present (load).
        let rc = unsafe { cusys::cuDriverGetVersion(&mut v) };
        if rc != cusys::CUresult::CUDA_SUCCESS {
            return "unknown".into();
        }
        format!("{}.{}", v / 1000, v % 1000 / 10)
    }

    /// Makes device `ordinal`'s primary context (the one libtorch uses) current on this thread.
    pub(crate) fn use_device(&self, ordinal: usize) -> Result<()> {
        let dev = cu::device::get(ordinal as c_int).map_err(|e| driver_error("cuDeviceGet", e))?;
        // SAFETY: a valid device; the retained context is the one libtorch also uses.
        unsafe {
            let ctx = cu::primary_ctx::retain(dev).map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
            cu::ctx::set_current(ctx).map_err(|e| driver_error("cuCtxSetCurrent", e))
        }
    }

    /// The PCI bus id of device `ordinal` (as CUDA numbers it here), e.g. `0000:3B:00.0`.
    pub(crate) fn pci_bus_id(&self, ordinal: usize) -> Result<String> {
        let dev = cu::device::get(ordinal as c_int).map_err(|e| driver_error("cuDeviceGet", e))?;
        let mut buf = [0 as c_char; 32];
        // SAFETY: the buffer's length is passed; CUDA NUL-terminates within it.
        unsafe {
            let rc = cusys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev);
            if rc != cusys::CUresult::CUDA_SUCCESS {
                bail!("cuDeviceGetPCIBusId failed: {rc:?}");
            }
            Ok(CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned())
        }
    }

    /// A stream that does not synchronise implicitly with the legacy default stream.
    pub(crate) fn non_blocking_stream(&self) -> Result<Stream> {
        let s = cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(|e| driver_error("cuStreamCreate", e))?;
        Ok(Stream(s))
    }

    /// Waits for the work queued so far on `stream` (and only that stream).
    pub(crate) fn synchronize(&self, stream: Stream) -> Result<()> {
        // SAFETY: a valid stream handle.
        unsafe { cu::stream::synchronize(stream.0) }.map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    pub(crate) fn event(&self, timing: bool) -> Result<Event> {
        let flags = if timing {
            cusys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            cusys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        Ok(Event(cu::event::create(flags).map_err(|e| driver_error("cuEventCreate", e))?))
    }

    pub(crate) fn record(&self, event: &Event, stream: Stream) -> Result<()> {
        // SAFETY: valid event and stream handles.
        unsafe { cu::event::record(event.0, stream.0) }.map_err(|e| driver_error("cuEventRecord", e))
    }

    /// Makes `stream` wait (on the device, not the host) for `event`.
    pub(crate) fn wait(&self, stream: Stream, event: &Event) -> Result<()> {
        // SAFETY: valid handles.
        unsafe { cu::stream::wait_event(stream.0, event.0, cusys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(|e| driver_error("cuStreamWaitEvent", e))
    }

    pub(crate) fn event_synchronize(&self, event: &Event) -> Result<()> {
        // SAFETY: a valid event handle.
        unsafe { cu::event::synchronize(event.0) }.map_err(|e| driver_error("cuEventSynchronize", e))
    }

    /// Seconds between two completed timing events.
    pub(crate) fn elapsed_s(&self, start: &Event, end: &Event) -> Result<f64> {
        // SAFETY: both events were created with timing and recorded.
        let ms = unsafe { cu::event::elapsed(start.0, end.0) }.map_err(|e| driver_error("cuEventElapsedTime", e))?;
        Ok(ms as f64 * 1e-3)
    }
}

/// The driver, loaded once per process.
pub(crate) fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| Driver::load().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// Makes libtorch's legacy default stream on the current device finish its queued work,
/// without waiting for NCCL's stream (cudaDeviceSynchronize would wait for both).
pub(crate) fn sync_torch_stream() -> Result<()> {
    driver()?.synchronize(LEGACY_STREAM)
}

/// An NCCL communicator handle (`ncclComm_t`).
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub(crate) struct NcclComm(ncsys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread of its process.
unsafe impl Send for NcclComm {}

/// NCCL data types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NcclDtype {
    Float16,
    Float32,
    Float64,
    Bfloat16,
}

impl NcclDtype {
    fn sys(self) -> ncsys::ncclDataType_t {
        match self {
            NcclDtype::Float16 => ncsys::ncclDataType_t::ncclFloat16,
            NcclDtype::Float32 => ncsys::ncclDataType_t::ncclFloat32,
            NcclDtype::Float64 => ncsys::ncclDataType_t::ncclFloat64,
            NcclDtype::Bfloat16 => ncsys::ncclDataType_t::ncclBfloat16,
        }
    }
}

/// `ncclUniqueId`: 128 opaque bytes that rank 0 makes and every rank must receive.
#[derive(Clone, Copy)]
pub(crate) struct NcclUniqueId {
    pub internal: [u8; 128],
}

/// Where a `libnccl.so.2` is looked for when the loader finds no `libnccl.so` (the name
/// cudarc opens): `DDPBENCH_NCCL_LIB`, then the torch wheel's `nvidia/nccl/lib` beside
/// libtorch. Used to say what to link where.
pub(crate) fn nccl_candidates(env_override: Option<String>, libtorch_lib: Option<&str>) -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Some(path) = env_override.filter(|p| !p.is_empty()) {
        c.push(PathBuf::from(path));
    }
    if let Some(dir) = libtorch_lib.filter(|d| !d.is_empty()) {
        // <site-packages>/torch/lib -> <site-packages>/nvidia/nccl/lib
        c.push(Path::new(dir).join("../../nvidia/nccl/lib/libnccl.so.2"));
    }
    c
}

fn nccl_error(call: &str, e: nc::NcclError) -> anyhow::Error {
    anyhow!("{call} failed: {e:?}. NCCL_DEBUG=WARN shows NCCL's own account")
}

/// NCCL, opened (through cudarc).
pub(crate) struct Nccl {
    _present: (),
}

impl Nccl {
    fn load() -> Result<Nccl> {
        // SAFETY: only tries to open the library.
        if unsafe { ncsys::is_culib_present() } {
            return Ok(Nccl { _present: () });
        }
        let found = nccl_candidates(std::env::var("DDPBENCH_NCCL_LIB").ok(), option_env!("DDPBENCH_LIBTORCH_LIB"))
            .into_iter()
            .find(|p| p.is_file());
        match found {
            Some(p) => bail!(
                "NCCL is at {} but the loader looks for libnccl.so on the library path: \
                 `source job-scripts/setup.sh` (it links one and exports LD_LIBRARY_PATH), or link \
                 libnccl.so to it in a folder on LD_LIBRARY_PATH; or use --allreduce mpi",
                p.display()
            ),
            None => bail!(
                "NCCL (libnccl.so) is not on the library path. Install NCCL (or the nvidia-nccl wheel \
                 beside torch and `source job-scripts/setup.sh`), or use --allreduce mpi"
            ),
        }
    }

    /// NCCL's version as `major.minor.patch`.
    pub(crate) fn version(&self) -> String {
        match nc::get_nccl_version() {
            Ok(v) => {
                let (major, rest) = if v >= 10000 { (v / 10000, v % 10000) } else { (v / 1000, v % 1000) };
                format!("{major}.{}.{}", rest / 100, rest % 100)
            }
            Err(_) => "unknown".into(),
        }
    }

    pub(crate) fn unique_id(&self) -> Result<NcclUniqueId> {
        let id = nc::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
        Ok(NcclUniqueId {
            internal: id.internal.map(|c| c as u8),
        })
    }

    /// Joins the communicator of `ranks` ranks named by `id` (a collective: every rank calls it).
    pub(crate) fn init_rank(&self, ranks: usize, id: NcclUniqueId, rank: usize) -> Result<NcclComm> {
        let sys_id = ncsys::ncclUniqueId {
            internal: id.internal.map(|b| b as c_char),
        };
        let mut comm: ncsys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the device is current on this thread.
        unsafe { nc::comm_init_rank(&mut comm, ranks as c_int, sys_id, rank as c_int) }.map_err(|e| nccl_error("ncclCommInitRank", e))?;
        register(comm);
        Ok(NcclComm(comm))
    }

    /// Queues a sum all-reduce of `count` elements on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must be device pointers to `count` elements of `dtype`
    /// that stay allocated until the stream has run the operation.
    pub(crate) unsafe fn all_reduce_sum(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: NcclDtype,
        comm: NcclComm,
        stream: Stream,
    ) -> Result<()> {
        nc::all_reduce(
            send,
            recv,
            count,
            dtype.sys(),
            ncsys::ncclRedOp_t::ncclSum,
            comm.0,
            stream.0 as ncsys::cudaStream_t,
        )
        .map(|_| ())
        .map_err(|e| nccl_error("ncclAllReduce", e))
    }

    pub(crate) fn destroy(&self, comm: NcclComm) {
        unregister(comm.0);
        // SAFETY: a communicator made by init_rank, destroyed once.
        unsafe {
            let _ = nc::comm_destroy(comm.0);
        }
    }
}

/// NCCL, checked for once per process.
pub(crate) fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(|| Nccl::load().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// The communicators alive in this process, for the watchdog to abort (as addresses).
fn live_comms() -> &'static Mutex<Vec<usize>> {
    static LIVE: OnceLock<Mutex<Vec<usize>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new()))
}

fn register(comm: ncsys::ncclComm_t) {
    live_comms().lock().unwrap_or_else(|p| p.into_inner()).push(comm as usize);
}

fn unregister(comm: ncsys::ncclComm_t) {
    live_comms()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|&c| c != comm as usize);
}

/// The first asynchronous error NCCL reports on a live communicator (a peer gone, a
/// network failure), for the watchdog to poll.
pub(crate) fn async_error() -> Option<String> {
    let live = live_comms().lock().unwrap_or_else(|p| p.into_inner()).clone();
    if live.is_empty() || nccl().is_err() {
        return None;
    }
    for c in live {
        let mut err = ncsys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator of this process and an out-pointer to a local.
        let rc = unsafe { ncsys::ncclCommGetAsyncError(c as ncsys::ncclComm_t, &mut err) };
        if rc == ncsys::ncclResult_t::ncclSuccess && err != ncsys::ncclResult_t::ncclSuccess && err != ncsys::ncclResult_t::ncclInProgress {
            return Some(format!("NCCL reported an asynchronous error: {err:?}"));
        }
    }
    None
}

/// Aborts every live communicator, so a rank blocked in NCCL returns (the watchdog's
/// last step before ending the job).
pub(crate) fn abort_all() {
    let live = std::mem::take(&mut *live_comms().lock().unwrap_or_else(|p| p.into_inner()));
    if live.is_empty() || nccl().is_err() {
        return;
    }
    for c in live {
        // SAFETY: a live communicator of this process, aborted once.
        unsafe {
            let _ = nc::comm_abort(c as ncsys::ncclComm_t);
        }
    }
}

/// Every `NCCL_*` variable of this process's environment, for the manifest.
pub(crate) fn nccl_env() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k.starts_with("NCCL_")).collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libnccl_so_2_is_looked_for_by_override_then_beside_torch() {
        let c = nccl_candidates(Some("/opt/nccl/libnccl.so.2".into()), Some("/v/site-packages/torch/lib"));
        assert_eq!(
            c,
            vec![
                PathBuf::from("/opt/nccl/libnccl.so.2"),
                PathBuf::from("/v/site-packages/torch/lib/../../nvidia/nccl/lib/libnccl.so.2")
            ]
        );
        assert!(nccl_candidates(Some(String::new()), None).is_empty());
    }

    #[test]
    fn unique_id_has_nccls_size() {
        // nccl.h: typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId; with 128 bytes.
        assert_eq!(std::mem::size_of::<ncsys::ncclUniqueId>(), 128);
    }

    #[test]
    fn missing_driver_is_an_error_not_a_panic() {
        // This machine has no NVIDIA driver: the error must say what was looked for.
        if Path::new("/proc/driver/nvidia/version").exists() {
            return; // a GPU node: nothing to prove here
        }
        let err = driver().err().expect("no driver on this machine");
        assert!(format!("{err}").contains("libcuda.so.1"), "{err}");
        assert!(sync_torch_stream().is_err());
    }

    /// Run by [`nccl_absent_from_the_library_path_is_a_clear_error`] in a child process
    /// whose library path holds only an empty folder and libtorch.
    #[test]
    #[ignore = "run by nccl_absent_from_the_library_path_is_a_clear_error"]
    fn child_sees_no_nccl() {
        let e = format!("{:#}", nccl().err().expect("no libnccl.so on this child's library path"));
        assert!(e.contains("libnccl.so") && e.contains("--allreduce mpi"), "{e}");
        assert!(async_error().is_none());
        abort_all(); // nothing live: returns without touching NCCL
    }

    #[test]
    fn nccl_absent_from_the_library_path_is_a_clear_error() {
        let empty = tempfile::tempdir().unwrap();
        let torch_lib = option_env!("DDPBENCH_LIBTORCH_LIB").unwrap_or("");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "device::cuda::tests::child_sees_no_nccl", "--nocapture"])
            .env("LD_LIBRARY_PATH", format!("{}:{torch_lib}", empty.path().display()))
            .env_remove("DDPBENCH_NCCL_LIB")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    #[test]
    fn nccl_loads_through_the_library_path_and_fails_cleanly_without_a_gpu() {
        // job-scripts/setup.sh links the torch wheel's libnccl.so.2 as libnccl.so and
        // puts it on LD_LIBRARY_PATH; without that the error says so.
        let nccl = match nccl() {
            Ok(n) => n,
            Err(e) => {
                let e = format!("{e:#}");
                assert!(e.contains("libnccl.so") && e.contains("--allreduce mpi"), "{e}");
                return;
            }
        };
        assert!(nccl.version().starts_with("2."), "{}", nccl.version());
        eprintln!("NCCL {} loaded", nccl.version());
        if Path::new("/proc/driver/nvidia/version").exists() {
            return;
        }
        // Joining a communicator needs a device: an error with NCCL's words, not a crash.
        let joined = nccl.unique_id().and_then(|id| nccl.init_rank(1, id, 0));
        let err = joined.expect_err("no GPU here");
        assert!(format!("{err}").contains("ncclCommInitRank failed"), "{err}");
    }
}
