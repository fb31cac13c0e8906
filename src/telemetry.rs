//! GPU telemetry: a background sampler writing one CSV row per period (utilisation,
//! memory, SM clock, power, temperature) of the rank's GPU.
//!
//! NVML is loaded at run time ([`crate::device::nvml`]), so where there is no driver
//! [`NvmlGpu::open`] returns an error saying telemetry is off. The sampler reads
//! through the small [`GpuSource`] trait, so its thread and CSV writing are tested
//! with a fake source.

use crate::device::nvml::{self, GpuReading};
use crate::record::{format_plain, rfc3339_utc, CsvLog};
use crate::topology::parse_pci_bus_id;
use anyhow::{anyhow, ensure, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Something that reads a GPU's counters: NVML ([`NvmlGpu`]) or a test's fake.
pub(crate) trait GpuSource: Send + 'static {
    fn read(&mut self) -> GpuReading;
}

/// One GPU opened through NVML by its PCI bus id.
pub(crate) struct NvmlGpu {
    nvml: nvml::Nvml,
    bus_id: String,
}

impl NvmlGpu {
    /// Loads NVML and opens the GPU at `bus_id` (any form [`parse_pci_bus_id`] accepts).
    pub(crate) fn open(bus_id: &str) -> Result<NvmlGpu> {
        let id = parse_pci_bus_id(bus_id)?.to_string();
        let nvml = nvml::Nvml::load()?;
        nvml.clocks(&id)?; // fails now, with the bus id, when NVML has no such GPU
        Ok(NvmlGpu { nvml, bus_id: id })
    }
}

impl GpuSource for NvmlGpu {
    fn read(&mut self) -> GpuReading {
        self.nvml.read(&self.bus_id)
    }
}

/// One telemetry row (`gpu-rank-NNNNN.csv` or wherever the caller writes it).
#[derive(Debug, Clone, Serialize)]
struct TelemetryRow {
    rank: usize,
    time_utc: String,
    /// Seconds from the sampler's origin to the reading.
    sample_at_s: f64,
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
pub(crate) struct TelemetrySummary {
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
/// Columns: `rank, time_utc, sample_at_s, gpu_util_pct, mem_util_pct, mem_used_bytes,
/// sm_clock_mhz, power_w, temperature_c`; a failed reading is an empty cell. Each
/// row is flushed as written, so a crash keeps what was sampled. [`GpuSampler::stop`]
/// wakes the thread at once (it never waits out a period); dropping the sampler
/// stops it too, discarding the summary.
pub(crate) struct GpuSampler {
    stop_tx: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<Result<TelemetrySummary>>>,
    path: PathBuf,
}

impl GpuSampler {
    /// Samples `source` every `period` into `path`; `sample_at_s` counts from `origin`
    /// (pass the run's common start to line rows up with the step CSVs).
    pub(crate) fn start_with<S: GpuSource>(source: S, rank: usize, path: &Path, period: Duration, origin: Instant) -> Result<GpuSampler> {
        ensure!(!period.is_zero(), "the GPU sampling period must be above zero");
        let log = CsvLog::<TelemetryRow>::create_new(path)?;
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
    pub(crate) fn stop(mut self) -> Result<TelemetrySummary> {
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
            sample_at_s: at.saturating_duration_since(origin).as_secs_f64(),
            gpu_util_pct: r.gpu_util_pct,
            mem_util_pct: r.mem_util_pct,
            mem_used_bytes: r.mem_used_bytes,
            sm_clock_mhz: r.sm_clock_mhz,
            power_w: r.power_w,
            temperature_c: r.temperature_c,
        })?;
        log.flush()?;
        totals.add(&r);
        let now = Instant::now();
        next = next_tick(next, now, period);
        match stop.recv_timeout(next - now) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    log.flush()?;
    Ok(totals.summary())
}

/// The first tick of the grid `next + k·period` after `now`: a fixed grid (no drift),
/// and the ticks missed while a reading was slow are skipped, not made up in a burst.
fn next_tick(mut next: Instant, now: Instant, period: Duration) -> Instant {
    while next <= now {
        next += period;
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::nvml::NVML_LIBRARY;
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
            "rank,time_utc,sample_at_s,gpu_util_pct,mem_util_pct,mem_used_bytes,sm_clock_mhz,power_w,temperature_c"
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
            assert!(elapsed >= last_elapsed, "sample_at_s goes forward");
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

    /// Runs `f` on another thread; fails when it has not returned in 60 s.
    fn returns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("it waited out the sampling period (an hour)")
    }

    /// With a period of an hour, `stop` (and a drop) must wake the thread: waiting out the
    /// period would take an hour, not the 60 s `returns` allows on a busy machine.
    #[test]
    fn stop_does_not_wait_out_the_period() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        let calls = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            readings: readings(),
            calls: calls.clone(),
        };
        let period = Duration::from_secs(3600);
        let s = GpuSampler::start_with(fake, 0, &path, period, Instant::now()).unwrap();
        wait_for(&calls, 1);
        let summary = returns(move || s.stop().unwrap());
        assert_eq!(summary.samples, 1, "one reading at start, none while waiting");
        // Dropping without stop also ends the thread promptly and keeps the rows.
        let calls2 = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            readings: readings(),
            calls: calls2.clone(),
        };
        // A file of its own: a sampler creates its file exclusively.
        let path = dir.path().join("t2.csv");
        let s = GpuSampler::start_with(fake, 0, &path, period, Instant::now()).unwrap();
        wait_for(&calls2, 1);
        returns(move || drop(s));
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    }

    /// The grid, on made-up instants: on time, the next tick; late, the first tick after
    /// now, never a burst of the missed ones, and never off the grid.
    #[test]
    fn samples_on_a_fixed_grid() {
        let t0 = Instant::now();
        let p = Duration::from_millis(50);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        assert_eq!(next_tick(t0, ms(3), p), ms(50), "a quick reading: the next tick");
        assert_eq!(next_tick(ms(50), ms(50), p), ms(100), "at a tick: the one after it");
        assert_eq!(next_tick(ms(50), ms(176), p), ms(200), "late by 2 ticks: they are skipped");
        assert_eq!(next_tick(ms(200), ms(120), p), ms(200), "still ahead: kept");
        // And the thread does sample again and again on it.
        let dir = tempfile::tempdir().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            readings: readings(),
            calls: calls.clone(),
        };
        let s = GpuSampler::start_with(fake, 0, &dir.path().join("g.csv"), Duration::from_millis(5), Instant::now()).unwrap();
        wait_for(&calls, 4);
        assert!(s.stop().unwrap().samples >= 4);
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
        // As the trainer starts it: open the GPU, then sample it.
        let start = |bus: &str| {
            NvmlGpu::open(bus).and_then(|gpu| GpuSampler::start_with(gpu, 0, &path, Duration::from_millis(100), Instant::now()))
        };
        match start("0000:3b:00.0") {
            Err(e) if !nvml_here => {
                let e = format!("{e:#}");
                assert!(e.contains(NVML_LIBRARY) && e.contains("telemetry is off"), "{e}");
                assert!(!path.exists(), "no file when telemetry is off");
            }
            Err(e) => assert!(format!("{e:#}").contains("0000:3b:00.0"), "{e:#}"),
            Ok(s) => drop(s.stop()),
        }
        let e = start("not-a-bus-id").err().unwrap();
        assert!(e.to_string().contains("not a PCI bus id"), "{e}");
    }
}
