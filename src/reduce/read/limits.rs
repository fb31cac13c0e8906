//! The run-level values `reduce` reads beside the rank files (the manifest, `clock.csv`,
//! `epochs.csv`, the GPU telemetry) held against [`crate::bounds`]: each failure names
//! the key or column and the value, and leaves the run out.

use crate::bounds::{
    self, clock_slack_s, shown, MAX_BATCH_PER_RANK, MAX_BUCKETS, MAX_BYTES_PER_STEP, MAX_GRAD_ACCUM, MAX_RANKS, MAX_RUN_S,
};
use crate::record::clock::ClockRow;
use crate::record::{AllreduceProbe, EpochRow, Manifest};
use std::path::Path;

/// Steps of one epoch: 2^40, as many as samples a rank may process in one step.
const MAX_STEPS_PER_EPOCH: usize = 1 << 40;

/// Rows of `clock.csv` or `epochs.csv` read: 2^20 (an estimate per rank and epoch),
/// so a forged file cannot fill memory.
pub(super) const MAX_TABLE_ROWS: usize = 1 << 20;

/// Bytes per second of an all-reduce: 2^50 (1 PiB/s), a thousand times any link.
const MAX_BYTES_PER_S: f64 = (1u64 << 50) as f64;

/// The manifest's world size, or why no run of it can be read (nothing is sized by it
/// before this passes).
pub(super) fn world_size(m: &Manifest) -> Result<usize, String> {
    if m.world_size == 0 || m.world_size > MAX_RANKS {
        return Err(format!(
            "world_size {} is not a plausible number of ranks (1 to {MAX_RANKS}): the manifest is damaged",
            m.world_size
        ));
    }
    Ok(m.world_size)
}

/// The manifest's schema, or why this ddpbench cannot read the run: a newer one's keys
/// and columns may mean what it does not know ([`crate::record::schema_problem`], the
/// check `compare` makes of a report).
pub(super) fn schema(m: &Manifest) -> Result<(), String> {
    match crate::record::schema_problem(u64::from(m.schema_version), "reduce") {
        Some(why) => Err(format!("schema_version: the run is {why}")),
        None => Ok(()),
    }
}

/// The samples one rank's step holds: the manifest's batch per rank times `grad_accum`
/// micro-batches, or why that is no step of a real run (each factor beyond what `train`
/// accepts, or the global batch not the ranks' batches summed).
pub(super) fn batch(m: &Manifest, grad_accum: usize) -> Result<u64, String> {
    let per_rank = m.batch_size_per_rank as u64;
    if !(1..=MAX_BATCH_PER_RANK).contains(&per_rank) {
        return Err(format!(
            "batch_size_per_rank is {per_rank}: `train` runs 1 to {MAX_BATCH_PER_RANK} samples per rank and micro-batch"
        ));
    }
    let accum = grad_accum as u64;
    if !(1..=MAX_GRAD_ACCUM).contains(&accum) {
        return Err(format!(
            "comparison_key.grad_accum is {accum}: `train` runs 1 to {MAX_GRAD_ACCUM} micro-batches per step"
        ));
    }
    // Both factors and world_size are bounded: the product stays far below 2^64.
    let step = per_rank * accum;
    let global = step * m.world_size as u64;
    if m.global_batch_size as u64 != global {
        return Err(format!(
            "global_batch_size is {}: {} ranks × batch_size_per_rank {per_rank} × {accum} micro-batch(es) train {global} \
             samples a step",
            m.global_batch_size, m.world_size
        ));
    }
    Ok(step)
}

/// Err unless `ranks` has one entry for each rank of the run, 0 to world_size − 1.
pub(super) fn rank_list(m: &Manifest) -> Result<(), String> {
    let n = m.world_size;
    let mut seen = vec![false; n];
    for r in &m.ranks {
        match seen.get_mut(r.rank) {
            None => return Err(format!("ranks lists rank {}: the run has ranks 0 to {}", r.rank, n - 1)),
            Some(true) => return Err(format!("ranks lists rank {} twice: each rank has one entry", r.rank)),
            Some(s) => *s = true,
        }
    }
    match seen.iter().position(|s| !s) {
        Some(r) => Err(format!(
            "ranks lists {} of the {n} ranks (none for rank {r}): each rank has one entry",
            m.ranks.len()
        )),
        None => Ok(()),
    }
}

/// The manifest's run id, or why it is none: a name of one path component
/// ([`crate::files::name_problem`]), and the name of the folder that holds the run
/// (`dir`, its symbolic links resolved), which `train` named the run after and every
/// row repeats. Checked before the id is used anywhere (a file name, a table).
pub(super) fn run_id(m: &Manifest, dir: &Path) -> Result<(), String> {
    let shown = shown_id(&m.run_id);
    if let Some(why) = crate::files::name_problem(&m.run_id) {
        return Err(format!(
            "run_id is {shown}: {why}; a run id is the name of its run folder, not a path"
        ));
    }
    let folder = dir
        .canonicalize()
        .map_err(|e| format!("cannot resolve the run folder {}: {e}", dir.display()))?;
    let name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name != m.run_id {
        return Err(format!(
            "run_id is {shown} but its folder is named {}: a run keeps the name it was written under (every row carries it); \
             rename the folder back to {shown}, or reduce the folder it was copied from",
            shown_id(&name)
        ));
    }
    Ok(())
}

/// A run id as the messages show it: quoted, its first 80 characters.
fn shown_id(id: &str) -> String {
    match id.char_indices().nth(80) {
        Some((at, _)) => format!("{:?}… ({} bytes)", &id[..at], id.len()),
        None => format!("{id:?}"),
    }
}

/// Every value of the manifest that `reduce` sizes, sums or prints, checked; one line
/// per key that fails (`key is value: why`).
pub(super) fn manifest(m: &Manifest) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |r: Result<(), String>| {
        if let Err(e) = r {
            out.push(e);
        }
    };
    let n = m.world_size;
    check(if (1..=n).contains(&m.nodes) {
        Ok(())
    } else {
        Err(format!("nodes is {}: {n} ranks run on 1 to {n} nodes", m.nodes))
    });
    check(bounds::at_most("buckets", m.buckets, MAX_BUCKETS, "buckets").map(drop));
    check(bounds::at_most("gradient_bytes", m.gradient_bytes, MAX_BYTES_PER_STEP, "bytes").map(drop));
    check(rank_list(m));
    check(bounds::at_most("steps_per_epoch", m.steps_per_epoch, MAX_STEPS_PER_EPOCH, "steps").map(drop));
    if let Some(w) = m.wall_s {
        check(bounds::seconds("wall_s", w, MAX_RUN_S).map(drop));
    }
    check(buckets(&m.comm.bucket_bytes, &m.comm.bucket_ready_fraction));
    if let Some(t) = &m.target {
        check(target(t));
    }
    for (key, p) in [
        ("allreduce_probe", &m.allreduce_probe),
        ("allreduce_probe_warm", &m.allreduce_probe_warm),
    ] {
        if let Some(p) = p {
            check(probe(key, p));
        }
    }
    out
}

/// `target`: exactly one of a training loss (finite, above 0) and a validation accuracy
/// (a fraction above 0, at most 1), so that no run is grouped by a target it did not have.
fn target(t: &crate::record::TargetOutcome) -> Result<(), String> {
    match (t.target_loss, t.target_accuracy) {
        (Some(l), None) if l.is_finite() && l > 0.0 => Ok(()),
        (None, Some(a)) if a > 0.0 && a <= 1.0 => Ok(()),
        (Some(l), None) => Err(format!("target.target_loss is {}: a training loss lies above 0", shown(l))),
        (None, Some(a)) => Err(format!(
            "target.target_accuracy is {}: an accuracy is a fraction above 0, at most 1",
            shown(a)
        )),
        (Some(_), Some(_)) => Err("target sets both target_loss and target_accuracy: a run trains to one".into()),
        (None, None) => Err("target sets neither target_loss nor target_accuracy".into()),
    }
}

/// `comm.bucket_bytes` and `comm.bucket_ready_fraction`: as many as a run has buckets,
/// each bucket's bytes within a step's, their sum too, fractions of backward in 0..1.
fn buckets(bytes: &[u64], ready: &[f64]) -> Result<(), String> {
    bounds::at_most("comm.bucket_bytes (its length)", bytes.len(), MAX_BUCKETS, "buckets")?;
    bounds::at_most("comm.bucket_ready_fraction (its length)", ready.len(), MAX_BUCKETS, "buckets")?;
    let mut sum = 0u64;
    for (i, &b) in bytes.iter().enumerate() {
        sum = sum.saturating_add(bounds::at_most(&format!("comm.bucket_bytes[{i}]"), b, MAX_BYTES_PER_STEP, "bytes")?);
    }
    bounds::at_most("the sum of comm.bucket_bytes", sum, MAX_BYTES_PER_STEP, "bytes per step")?;
    match ready.iter().position(|f| !(0.0..=1.0).contains(f)) {
        Some(i) => Err(format!(
            "comm.bucket_ready_fraction[{i}] is {}: a fraction of backward lies from 0 to 1",
            shown(ready[i])
        )),
        None => Ok(()),
    }
}

/// An all-reduce probe: times in seconds, bandwidths below [`MAX_BYTES_PER_S`].
fn probe(key: &str, p: &AllreduceProbe) -> Result<(), String> {
    bounds::at_most(&format!("{key}.bytes"), p.bytes, MAX_BYTES_PER_STEP, "bytes")?;
    let times = [
        ("median_s", Some(p.median_s)),
        ("min_s", Some(p.min_s)),
        ("p10_s", p.p10_s),
        ("p90_s", p.p90_s),
    ];
    for (name, t) in times {
        if let Some(t) = t {
            bounds::seconds(&format!("{key}.{name}"), t, MAX_RUN_S)?;
        }
    }
    for (name, v) in [
        ("busbw_bytes_per_s", p.busbw_bytes_per_s),
        ("algbw_bytes_per_s", p.algbw_bytes_per_s),
    ] {
        if !(0.0..=MAX_BYTES_PER_S).contains(&v) {
            return Err(format!(
                "{key}.{name} is {}: a bandwidth lies from 0 to {} bytes/s",
                shown(v),
                shown(MAX_BYTES_PER_S)
            ));
        }
    }
    Ok(())
}

/// The latest instant of a run of `run_s` seconds (None: unknown, [`MAX_RUN_S`]).
pub(super) fn run_end_s(run_s: Option<f64>) -> f64 {
    run_s.map_or(MAX_RUN_S, |w| w + clock_slack_s(w))
}

/// A row of `clock.csv`: a rank of the run, an estimate within it, an offset no larger
/// than the start barrier's skew and the clocks' drift since ([`clock_slack_s`]).
pub(super) fn clock_row(row: &ClockRow, world_size: usize, run_s: Option<f64>) -> Result<(), String> {
    if row.rank >= world_size {
        return Err(format!("rank is {}: the run has ranks 0 to {}", row.rank, world_size - 1));
    }
    let at = bounds::seconds("rank0_at_s", row.rank0_at_s, run_end_s(run_s))?;
    bounds::seconds("error_s", row.error_s, clock_slack_s(at))?;
    for (key, v) in [("offset_s", Some(row.offset_s)), ("exact_offset_s", row.exact_offset_s)] {
        if let Some(v) = v.filter(|v| v.is_nan() || v.abs() > clock_slack_s(at)) {
            return Err(format!(
                "{key} is {}: clocks that left one barrier together differ by at most {} s here",
                shown(v),
                shown(clock_slack_s(at))
            ));
        }
    }
    if let Some(e) = row.exact_error_s {
        bounds::seconds("exact_error_s", e, clock_slack_s(at))?;
    }
    if row.rounds.is_some_and(|n| n > crate::record::clock::MAX_ROUNDS) {
        return Err(format!(
            "rounds is more than {}: not a file ddpbench wrote",
            crate::record::clock::MAX_ROUNDS
        ));
    }
    Ok(())
}

/// A row of `epochs.csv`: no more steps than an epoch has, an epoch within the run.
pub(super) fn epoch_row(e: &EpochRow, steps_per_epoch: usize, run_s: Option<f64>) -> Result<(), String> {
    if e.steps > steps_per_epoch {
        return Err(format!("steps is {}: an epoch of this run has {steps_per_epoch}", e.steps));
    }
    bounds::seconds("epoch_s", e.epoch_s, run_end_s(run_s)).map(drop)
}

/// A GPU telemetry sample's readings (None: an empty cell): utilisation a percentage,
/// memory within [`MAX_BYTES_PER_STEP`], power below 10 kW (no GPU draws that).
pub(super) fn gpu_sample(util_pct: Option<f64>, mem_bytes: Option<f64>, power_w: Option<f64>) -> Result<(), String> {
    let limits = [
        ("gpu_util_pct", util_pct, 100.0),
        ("mem_used_bytes", mem_bytes, MAX_BYTES_PER_STEP as f64),
        ("power_w", power_w, 1e4),
    ];
    for (key, v, max) in limits {
        if let Some(v) = v.filter(|v| !(0.0..=max).contains(v)) {
            return Err(format!("{key} is {}: it lies from 0 to {}", shown(v), shown(max)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_lists_are_bounded_before_they_are_summed() {
        assert_eq!(buckets(&[100, 200], &[0.5, 1.0]), Ok(()));
        let e = buckets(&[u64::MAX, u64::MAX], &[]).unwrap_err();
        assert!(e.contains("comm.bucket_bytes[0] is 18446744073709551615"), "{e}");
        let e = buckets(&[1 << 49, 1 << 49, 1 << 49], &[]).unwrap_err();
        assert!(e.contains("the sum of comm.bucket_bytes"), "{e}");
        assert!(buckets(&[1], &[1.5]).unwrap_err().contains("comm.bucket_ready_fraction[0] is 1.5"));
    }

    /// A target is one of a loss and an accuracy, each within what a run can reach;
    /// the error names the field.
    #[test]
    fn a_target_is_one_loss_or_one_accuracy() {
        use crate::record::TargetOutcome;
        let t = |l: Option<f64>, a: Option<f64>| {
            target(&TargetOutcome {
                target_loss: l,
                target_accuracy: a,
                ..TargetOutcome::default()
            })
        };
        assert_eq!(t(Some(0.6), None), Ok(()));
        assert_eq!(t(None, Some(1.0)), Ok(()));
        assert!(t(Some(0.6), Some(0.9)).unwrap_err().contains("both"));
        assert!(t(None, None).unwrap_err().contains("neither"));
        assert!(t(Some(f64::NAN), None).unwrap_err().contains("target.target_loss is NaN"));
        assert!(t(None, Some(85.0)).unwrap_err().contains("target.target_accuracy is 85"));
        assert!(t(None, Some(0.0)).unwrap_err().contains("target.target_accuracy is 0"));
    }

    #[test]
    fn clock_offsets_beyond_the_barrier_skew_are_refused() {
        let row = |rank: usize, at: f64, offset_s: f64| ClockRow {
            sync: 0,
            rank,
            rank0_at_s: at,
            offset_s,
            error_s: 1e-5,
            rounds: Some(8),
            exact_offset_s: None,
            exact_error_s: None,
        };
        assert_eq!(clock_row(&row(1, 100.0, -0.002), 2, Some(200.0)), Ok(()));
        assert!(clock_row(&row(2, 100.0, 0.0), 2, Some(200.0)).unwrap_err().contains("rank is 2"));
        assert!(clock_row(&row(1, 100.0, 1e9), 2, Some(200.0))
            .unwrap_err()
            .contains("offset_s is 1000000000"));
        assert!(clock_row(&row(1, 500.0, 0.0), 2, Some(200.0))
            .unwrap_err()
            .contains("rank0_at_s is 500"));
        let exact = ClockRow {
            exact_offset_s: Some(f64::NAN),
            ..row(1, 100.0, 0.0)
        };
        assert!(clock_row(&exact, 2, Some(200.0)).unwrap_err().contains("exact_offset_s is NaN"));
        let exact = ClockRow {
            exact_offset_s: Some(0.0),
            exact_error_s: Some(-1.0),
            ..row(1, 100.0, 0.0)
        };
        assert!(clock_row(&exact, 2, Some(200.0)).unwrap_err().contains("exact_error_s"));
    }

    #[test]
    fn a_run_id_is_its_folders_name_and_never_a_path() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("run0");
        std::fs::create_dir(&dir).unwrap();
        let with_id = |id: &str| {
            let mut m: Manifest = serde_json::from_value(serde_json::json!({
                "run_id": id, "status": "completed", "error": null, "ddpbench_version": "0", "libtorch_version": "0",
                "mpi_library": "", "command_line": [], "config": {}, "model": "m", "dataset": "d",
                "dataset_source": "", "parameters": 1, "gradient_bytes": 4, "comm_backend": "mpi",
                "buckets": 1, "world_size": 1, "nodes": 1, "batch_size_per_rank": 1,
                "global_batch_size": 1, "steps_per_epoch": 1, "start_utc": "", "end_utc": null, "wall_s": null,
                "final_param_l2": null, "final_val_accuracy": null, "allreduce_probe": null, "ranks": [],
            }))
            .unwrap();
            m.run_id = id.into();
            m
        };
        assert_eq!(run_id(&with_id("run0"), &dir), Ok(()));
        assert_eq!(
            run_id(&with_id("run0"), &dir.join(".")),
            Ok(()),
            "the folder's own name, however reached"
        );
        let e = run_id(&with_id("x/../../escape_pwn"), &dir).unwrap_err();
        assert!(e.starts_with("run_id is \"x/../../escape_pwn\": it holds '/'"), "{e}");
        let e = run_id(&with_id("run1"), &dir).unwrap_err();
        assert!(e.contains("but its folder is named \"run0\""), "{e}");
        let e = run_id(&with_id(&"a/".repeat(1000)), &dir).unwrap_err();
        assert!(e.len() < 300 && e.contains("(2000 bytes)"), "{e}");
    }

    #[test]
    fn telemetry_readings_are_physical() {
        assert_eq!(gpu_sample(Some(50.0), None, Some(300.0)), Ok(()));
        assert!(gpu_sample(Some(250.0), None, None).unwrap_err().contains("gpu_util_pct is 250"));
        assert!(gpu_sample(None, None, Some(-1.0)).unwrap_err().contains("power_w is -1"));
    }
}
