//! `ddpbench allreduce`'s flags: the sizes, budget, backends and levels of a sweep, and
//! the checks on them that need no other rank.

use super::sweep::Idle;
use crate::comm::GradDtype;
use crate::device::DeviceChoice;
use crate::job::same_flags::LaunchFlags;
use crate::job::watchdog;
use crate::record::Backend;
use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
mpirun -n 2 ddpbench allreduce --max-bytes 64M          # two ranks on this node, host memory\n  \
srun -N 2 --ntasks-per-node 4 ddpbench allreduce        # intra-node, inter-node and the whole job\n  \
ddpbench reduce --interconnect results/allreduce-<time> results/<runs>   # project to more nodes\n\n\
Columns as nccl-tests prints them: time is the mean per all-reduce over the timed loop (averaged \
over ranks), algbw = size / time, busbw = algbw × 2(n−1)/n, #wrong = elements whose sum differs \
from the exact expected sum, over all ranks.")]
#[allow(rustdoc::invalid_html_tags)] // its doc comments are also `--help`, where `<name>` is a placeholder
pub struct AllreduceArgs {
    /// Smallest message, bytes (K, M, G suffixes: powers of 1024). Every size is rounded
    /// down to whole elements of --dtype (at least one), and sizes that round alike are
    /// swept once.
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    pub min_bytes: u64,
    /// Largest message, bytes: at least one element of --dtype. Default: twice the
    /// gradient bytes of --model or --for (so a one-bucket what-if of that training stays
    /// inside the sizes measured), else 1G on a GPU and 64M on CPU (a CPU sweep to 1 GiB
    /// takes minutes and training on CPU all-reduces far less).
    #[arg(long, value_parser = parse_bytes, conflicts_with_all = ["model", "for_run"])]
    pub max_bytes: Option<u64>,
    /// Size the sweep for this built-in model (`ddpbench models`): up to twice its
    /// gradient bytes.
    #[arg(long, value_name = "NAME", conflicts_with = "for_run")]
    pub model: Option<crate::model::ModelKind>,
    /// Size the sweep for the training run in this folder (its manifest.json's
    /// gradient_bytes): up to twice them.
    #[arg(long = "for", value_name = "RUN")]
    pub for_run: Option<PathBuf>,
    /// Each size is this many times the previous one.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    pub factor: u64,
    /// Timed iterations per size at most (fewer for large sizes, see --budget-s). Small
    /// messages need many: at 20, a 64 KiB all-reduce's mean swings by ±50 % between
    /// runs on a shared machine.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub iters: u64,
    /// Untimed iterations before each size's timed loop.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub warmup_iters: u64,
    /// Seconds one size's timed loop may take: the warm-up's time decides the iterations
    /// (between 3 and --iters).
    #[arg(long, default_value_t = 1.0)]
    pub budget_s: f64,
    /// Milliseconds every rank leaves the link idle before each timed all-reduce (after
    /// a barrier; never part of a time), or `auto`: as long as one all-reduce of the size
    /// took in the warm-up, at most 50 ms. Training leaves the link idle while it
    /// computes, and a link that queues back-to-back traffic (a shaping qdisc, a deep
    /// switch buffer, a cloud NIC's rate limit) is faster after idle than when kept busy:
    /// `auto` measures what a training step sees. 0: back to back, as nccl-tests and a
    /// plain MPI_Allreduce loop time it. The idle counts against --budget-s.
    #[arg(long = "idle-ms", default_value = "auto", value_parser = Idle::parse_ms)]
    pub idle: Idle,
    /// Element type.
    #[arg(long, value_enum, default_value_t = GradDtype::Fp32)]
    pub dtype: GradDtype,
    /// Backends to sweep, comma-separated: mpi, nccl (default: every one the ranks'
    /// device supports). On a GPU, mpi is swept on host memory and on device memory
    /// staged through pinned host buffers (the path `train --allreduce mpi` runs there);
    /// `staged`, its name before, is read as mpi.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub backends: Vec<Backend>,
    /// Levels to sweep, comma-separated (default: every level that differs from the
    /// others on this allocation).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub levels: Vec<Level>,
    /// Where the device-memory buffers (nccl, and mpi staged through the host) live.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Seconds a rank may wait in one phase of one size (warm-up, timed loop, check)
    /// before the job is declared hung: the watchdog names the ranks that never came,
    /// writes rank-NNNNN.flight.json into the output folder and aborts the job. The job's
    /// teardown (MPI_Finalize) is watched with it too, at most 300 s.
    #[arg(long, default_value_t = watchdog::WARMUP_LIMIT_S)]
    pub watchdog_s: f64,
    /// Output folder (default: results/allreduce-<time>[-j<job id>]-<4 random hex
    /// digits>): allreduce.csv, allreduce.json, link_model.json. A folder that holds any
    /// of them (or a rank's flight record) is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The `allreduce` flags that may differ between the ranks of one job: none, since every
/// flag shapes the sweep every rank takes part in.
pub(super) const RANK_LOCAL: &[(&str, &str)] = &[];

/// The `allreduce` flags every rank of a job must be given alike: what the completeness
/// test checks [`AllreduceArgs::launch_flags`] against.
#[cfg(test)]
pub(super) const SAME_ON_EVERY_RANK: &[&str] = &[
    "--min-bytes",
    "--max-bytes",
    "--model",
    "--for",
    "--factor",
    "--iters",
    "--warmup-iters",
    "--budget-s",
    "--idle-ms",
    "--dtype",
    "--backends",
    "--levels",
    "--device",
    "--watchdog-s",
    "--out",
];

impl AllreduceArgs {
    /// The command and flags compared across ranks at start-up.
    pub(crate) fn launch_flags(&self) -> LaunchFlags {
        let idle = match self.idle {
            Idle::Auto => "auto".to_string(),
            Idle::Fixed(s) => format!("{}", s * 1e3),
        };
        LaunchFlags::new("allreduce", RANK_LOCAL)
            .with("--min-bytes", json!(self.min_bytes))
            .with("--max-bytes", json!(self.max_bytes))
            .with("--model", json!(self.model.map(|m| format!("{m:?}"))))
            .with("--for", json!(self.for_run))
            .with("--factor", json!(self.factor))
            .with("--iters", json!(self.iters))
            .with("--warmup-iters", json!(self.warmup_iters))
            .with("--budget-s", json!(self.budget_s))
            .with("--idle-ms", json!(idle))
            .with("--dtype", json!(self.dtype))
            .with("--backends", json!(self.backends))
            .with("--levels", json!(self.levels))
            .with("--device", json!(self.device))
            .with("--watchdog-s", json!(self.watchdog_s))
            .with("--out", json!(self.out))
    }

    /// Checks what needs no other rank: every rank finds the same answer, so rank 0 can
    /// say it before MPI starts.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(max) = self.max_bytes {
            self.check_sizes(max, "--max-bytes")?;
        }
        if !(self.budget_s.is_finite() && self.budget_s > 0.0) {
            bail!("--budget-s {} must be a positive number of seconds", self.budget_s);
        }
        if !(self.watchdog_s.is_finite() && self.watchdog_s > 0.0) {
            bail!("--watchdog-s {} must be a positive number of seconds", self.watchdog_s);
        }
        Ok(())
    }

    /// The largest size swept on `device`: --max-bytes, or twice the gradient bytes of
    /// --model or --for, or the device's default; checked against --min-bytes and one
    /// element.
    pub(crate) fn sweep_max_bytes(&self, device: tch::Device) -> Result<u64> {
        let (max, source) = match (self.max_bytes, self.model, &self.for_run) {
            (Some(m), _, _) => (m, "--max-bytes"),
            (None, Some(kind), _) => (2 * crate::model::gradient_bytes_of(kind), "twice --model's gradient bytes,"),
            (None, None, Some(dir)) => {
                let m = crate::record::Manifest::read(dir)
                    .with_context(|| format!("--for {}: not a run folder ddpbench can read", dir.display()))?;
                ensure!(
                    m.gradient_bytes > 0,
                    "--for {}: its manifest records no gradient bytes; give --max-bytes",
                    dir.display()
                );
                (2 * m.gradient_bytes, "twice --for's gradient bytes,")
            }
            (None, None, None) if device == tch::Device::Cpu => (64 << 20, "the CPU default --max-bytes"),
            (None, None, None) => (1 << 30, "the GPU default --max-bytes"),
        };
        self.check_sizes(max, source)?;
        Ok(max)
    }

    /// Checks the largest size `max`, named `source` in messages, against --min-bytes
    /// and one element.
    fn check_sizes(&self, max: u64, source: &str) -> Result<()> {
        if self.min_bytes > max {
            bail!("--min-bytes {} is larger than {source} {max}", self.min_bytes);
        }
        let element = self.dtype.bytes() as u64;
        if max < element {
            bail!(
                "--max-bytes {max} is smaller than one {} element ({element} bytes): nothing to all-reduce; raise --max-bytes",
                dtype_name(self.dtype)
            );
        }
        Ok(())
    }

    /// The sweep a study runs before its points: 8 B to 64 MiB by 2, a short budget per
    /// size, every backend the ranks' device supports, into `out`.
    pub(crate) fn for_study(out: PathBuf) -> AllreduceArgs {
        AllreduceArgs {
            min_bytes: 8,
            max_bytes: Some(64 << 20),
            model: None,
            for_run: None,
            factor: 2,
            iters: 100,
            warmup_iters: 5,
            budget_s: 0.5,
            idle: Idle::Auto,
            dtype: GradDtype::Fp32,
            backends: Vec::new(),
            levels: Vec::new(),
            device: DeviceChoice::Auto,
            watchdog_s: watchdog::WARMUP_LIMIT_S,
            out: Some(out),
        }
    }
}

/// Parses "4096", "64K", "16M", "1G" (powers of 1024).
pub(super) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size in bytes (e.g. 4096, 64K, 16M, 1G)"))?;
    n.checked_mul(mult)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("'{s}': a size must be 1 byte or more and fit in 64 bits"))
}

/// The part of the allocation a sweep runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// All ranks of the job.
    World,
    /// The ranks of each node among themselves (every node at once; rank 0's node reported).
    IntraNode,
    /// One rank per node.
    InterNode,
}

impl Level {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::World => "world",
            Level::IntraNode => "intra-node",
            Level::InterNode => "inter-node",
        }
    }
}

/// Sizes from `min` to `max`, each `factor` times the previous, rounded down to whole
/// elements of `element` bytes (at least one), each size once: 1, 2 and 4 bytes of fp32
/// are one 4-byte all-reduce, measured once.
pub(super) fn sizes(min: u64, max: u64, factor: u64, element: u64) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    let mut s = min;
    while s <= max {
        let whole = (s / element).max(1) * element;
        if out.last() != Some(&whole) {
            out.push(whole);
        }
        match s.checked_mul(factor) {
            Some(n) => s = n,
            None => break,
        }
    }
    out
}

/// The name nccl-tests prints for an element type.
pub(super) fn dtype_name(d: GradDtype) -> &'static str {
    match d {
        GradDtype::Fp32 => "float",
        GradDtype::Fp16 => "half",
        GradDtype::Bf16 => "bfloat16",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<AllreduceArgs, clap::Error> {
        use clap::Parser;
        #[derive(Parser)]
        #[command(name = "allreduce")]
        struct Line {
            #[command(flatten)]
            args: AllreduceArgs,
        }
        Line::try_parse_from(std::iter::once("allreduce").chain(flags.iter().copied())).map(|l| l.args)
    }

    /// The sweep's largest size: --max-bytes as given; twice the gradient bytes of
    /// --model or of --for's run; else 64 MiB on CPU and 1 GiB on a GPU. Two sources at
    /// once are refused, and a bad run folder is named.
    #[test]
    fn the_sweep_is_sized_for_the_training_it_stands_for() {
        let cpu = tch::Device::Cpu;
        let gpu = tch::Device::Cuda(0);
        let plain = parse(&[]).unwrap();
        assert_eq!(
            (plain.sweep_max_bytes(cpu).unwrap(), plain.sweep_max_bytes(gpu).unwrap()),
            (64 << 20, 1 << 30)
        );
        assert_eq!(parse(&["--max-bytes", "4M"]).unwrap().sweep_max_bytes(gpu).unwrap(), 4 << 20);
        // mnist-cnn: 1,199,882 parameters, 4,799,528 gradient bytes.
        let model = parse(&["--model", "mnist-cnn"]).unwrap();
        assert_eq!(model.sweep_max_bytes(cpu).unwrap(), 2 * 4_799_528);
        let d = tempfile::tempdir().unwrap();
        // A schema-2 run's manifest, its gradient bytes set to 1000.
        let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/schema2/single/single-2r/manifest.json");
        let mut manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        manifest["gradient_bytes"] = json!(1000);
        std::fs::write(d.path().join("manifest.json"), manifest.to_string()).unwrap();
        let run = d.path().to_str().unwrap();
        assert_eq!(parse(&["--for", run]).unwrap().sweep_max_bytes(cpu).unwrap(), 2000);
        let e = parse(&["--for", "/nonexistent/run"]).unwrap().sweep_max_bytes(cpu).unwrap_err();
        assert!(format!("{e:#}").contains("--for /nonexistent/run: not a run folder"), "{e:#}");
        for both in [
            &["--max-bytes", "4M", "--model", "mnist-cnn"][..],
            &["--model", "mnist-cnn", "--for", run],
        ] {
            assert!(parse(both).is_err(), "{both:?}");
        }
        // --min-bytes above the size a model gives: refused, naming both.
        let e = parse(&["--model", "mnist-cnn", "--min-bytes", "1G"])
            .unwrap()
            .sweep_max_bytes(cpu)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("--min-bytes 1073741824 is larger than twice --model's gradient bytes, 9599056"),
            "{e}"
        );
    }

    /// Every `allreduce` flag is compared across ranks (or says why it may differ).
    #[test]
    fn every_allreduce_flag_is_compared_across_ranks_or_says_why_not() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        #[command(name = "allreduce")]
        struct Line {
            #[command(flatten)]
            args: AllreduceArgs,
        }
        let args = Line::try_parse_from(["allreduce"]).unwrap().args;
        crate::job::same_flags::assert_every_flag_decided(&Line::command(), RANK_LOCAL, SAME_ON_EVERY_RANK, &args.launch_flags());
    }

    #[test]
    fn sizes_and_byte_suffixes() {
        assert_eq!(sizes(8, 64, 2, 4), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 4, 4), vec![8, 32]);
        assert_eq!(sizes(u64::MAX / 2, u64::MAX, 4, 1), vec![u64::MAX / 2]);
        // Below and between whole elements: rounded down, each once.
        assert_eq!(sizes(1, 16, 2, 4), vec![4, 8, 16]);
        assert_eq!(sizes(3, 27, 3, 2), vec![2, 8, 26]);
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("0").is_err() && parse_bytes("12Q").is_err() && parse_bytes("99999999999G").is_err());
    }
}
