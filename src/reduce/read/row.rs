//! One row of a rank file: its columns, parsing, and what a real step makes of it.
//! Every value is held against [`crate::bounds`] as it is parsed, then the row against
//! itself (phases within the step and adding up to it, the all-reduce entered inside
//! the step), against the rank's previous row (steps in order, one after the other) and
//! against the run (no step ends after the run did).

use crate::bounds::{self, clock_slack_s, shown, tolerance_s, MAX_BYTES_PER_STEP, MAX_RUN_S, MAX_SAMPLES_PER_STEP};
use crate::noise_scale::NormPair;
use crate::record::{format_plain, Phase, PhaseArray, PhaseTimes};

/// One parsed rank-file row: the fields the analysis uses.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Row {
    pub global_step: u64,
    pub warmup: bool,
    pub samples: u64,
    /// Seconds per phase ([`Phase::index`]); they add up to `step_s`.
    pub phases: PhaseTimes,
    pub step_s: f64,
    /// All-reduce work (`comm_s`), hidden or not.
    pub comm_s: f64,
    /// When the rank entered the all-reduce, on its own clock (the column
    /// `comm_start_at_s`; `comm_start_s` before schema 3).
    pub comm_start_at_s: f64,
    /// When it entered its last bucket's all-reduce (schema 1: the first bucket's entry).
    pub comm_last_start_at_s: f64,
    /// All-reduce work done before backward ended (0 in schema 1).
    pub comm_hidden_s: f64,
    pub bytes: u64,
    /// When the step started, seconds from the run's common origin (the column
    /// `step_start_at_s`, `elapsed_s` before schema 3; NaN where the file has neither).
    pub step_start_at_s: f64,
    /// The rank's training loss of the step (NaN where the cell is empty or the file
    /// has no `loss` column).
    pub loss: f64,
    /// The gradient noise scale's two squared norms (`noise_batch_small`,
    /// `grad_sq_small`, `noise_batch_big`, `grad_sq_big`); None where the step did not
    /// measure them or the file has no such columns. A norm's empty cell (not finite
    /// when it was taken) reads as NaN, which the estimate skips and counts.
    pub noise: Option<NormPair>,
}

/// Column positions in a rank file.
pub(super) struct Columns {
    pub rank: usize,
    pub node_type: usize,
    global_step: usize,
    warmup: usize,
    samples: usize,
    /// Each phase's column; None for a phase the file's schema lacks (it is 0 there).
    phases: PhaseArray<Option<usize>>,
    step_s: usize,
    comm_start_at_s: usize,
    comm_last_start_at_s: Option<usize>,
    comm_hidden_s: Option<usize>,
    step_start_at_s: Option<usize>,
    pub run_id: Option<usize>,
    bytes: usize,
    /// `comm_s`, the whole all-reduce, when the exposed phase has its own column.
    comm_s: Option<usize>,
    loss: Option<usize>,
    /// fp16 AMP's loss scale and whether the step was skipped (files from before them
    /// have neither).
    loss_scale: Option<usize>,
    step_skipped: Option<usize>,
    /// The four noise-scale columns, in [`Row::noise`]'s order, when the file has them.
    noise: Option<[usize; 4]>,
}

impl Columns {
    pub(super) fn find(headers: &csv::ByteRecord) -> Result<Columns, String> {
        let opt = |name: &str| headers.iter().position(|h| h == name.as_bytes());
        let pos = |name: &str| opt(name).ok_or_else(|| format!("no column {name}"));
        let mut phases = PhaseArray::default();
        for p in Phase::ALL {
            phases[p] = match p {
                // Schema 1 had no batch copy column: the copy is inside data_s.
                Phase::BatchCopy => opt(p.column()),
                // Before overlap existed, comm_s was the (all exposed) communication phase.
                Phase::CommExposed => Some(pos(p.column()).or_else(|_| pos("comm_s"))?),
                _ => Some(pos(p.column())?),
            };
        }
        Ok(Columns {
            rank: pos("rank")?,
            node_type: pos("node_type")?,
            global_step: pos("global_step")?,
            warmup: pos("warmup")?,
            samples: pos("samples")?,
            phases,
            step_s: pos("step_s")?,
            // Schema 3 names instants `_at_s`; older files hold them under `_s`.
            comm_start_at_s: pos("comm_start_at_s").or_else(|_| pos("comm_start_s"))?,
            comm_last_start_at_s: opt("comm_last_start_at_s").or_else(|| opt("comm_last_start_s")),
            comm_hidden_s: opt("comm_hidden_s"),
            step_start_at_s: opt("step_start_at_s").or_else(|| opt("elapsed_s")),
            run_id: opt("run_id"),
            bytes: pos("bytes")?,
            comm_s: opt("comm_exposed_s").and(opt("comm_s")),
            loss: opt("loss"),
            loss_scale: opt("loss_scale"),
            step_skipped: opt("step_skipped"),
            noise: match ["noise_batch_small", "grad_sq_small", "noise_batch_big", "grad_sq_big"].map(opt) {
                [Some(a), Some(b), Some(c), Some(d)] => Some([a, b, c, d]),
                _ => None,
            },
        })
    }
}

pub(super) fn field<T: std::str::FromStr>(rec: &csv::ByteRecord, i: usize) -> Option<T> {
    std::str::from_utf8(rec.get(i)?).ok()?.parse().ok()
}

/// Parses a row; Err says which field is unreadable or impossible: a time that is not
/// a finite number of seconds from 0 to [`MAX_RUN_S`], more samples than the run's
/// step holds (`max_samples`, the manifest's batch per rank times its micro-batches) or
/// more bytes than a step can, a flag other than 0 or 1, a loss scale that is not
/// positive, or a row that contradicts itself ([`Row::check`]).
pub(super) fn parse_row(rec: &csv::ByteRecord, c: &Columns, headers: &csv::ByteRecord, max_samples: u64) -> Result<Row, String> {
    let name = |i: usize| String::from_utf8_lossy(headers.get(i).unwrap_or_default()).into_owned();
    flags_and_scale(rec, c, &name)?;
    let get = |i: usize| -> Result<f64, String> { field::<f64>(rec, i).ok_or_else(|| format!("{} is not a number", name(i))) };
    let seconds = |i: usize| -> Result<f64, String> { bounds::seconds(&name(i), get(i)?, MAX_RUN_S) };
    let whole = |i: usize| -> Result<u64, String> { field::<u64>(rec, i).ok_or_else(|| format!("{} is not a whole number", name(i))) };
    let per_step = |i: usize, max: u64| -> Result<u64, String> { bounds::at_most(&name(i), whole(i)?, max, "per step") };
    let mut phases = PhaseTimes::default();
    for (p, col) in c.phases.iter() {
        if let Some(i) = col {
            phases[p] = seconds(*i)?;
        }
    }
    let comm_start_at_s = seconds(c.comm_start_at_s)?;
    let row = Row {
        global_step: whole(c.global_step)?,
        warmup: rec.get(c.warmup) == Some(b"1"),
        samples: samples(whole(c.samples)?, max_samples)?,
        step_s: seconds(c.step_s)?,
        comm_start_at_s,
        comm_last_start_at_s: match c.comm_last_start_at_s {
            Some(i) => seconds(i)?,
            None => comm_start_at_s,
        },
        comm_hidden_s: match c.comm_hidden_s {
            Some(i) => seconds(i)?,
            None => 0.0,
        },
        bytes: per_step(c.bytes, MAX_BYTES_PER_STEP)?,
        step_start_at_s: match c.step_start_at_s {
            Some(i) => seconds(i)?,
            None => f64::NAN,
        },
        comm_s: match c.comm_s {
            Some(i) => seconds(i)?,
            None => phases[Phase::CommExposed],
        },
        loss: c.loss.and_then(|i| field::<f64>(rec, i)).unwrap_or(f64::NAN),
        noise: match c.noise {
            Some(cols) => noise_pair(rec, cols, &name)?,
            None => None,
        },
        phases,
    };
    row.check()?;
    Ok(row)
}

/// `samples` of a row when a step of the run holds that many: at most `max_samples`
/// (which [`MAX_SAMPLES_PER_STEP`] bounds too).
fn samples(samples: u64, max_samples: u64) -> Result<u64, String> {
    let max = max_samples.min(MAX_SAMPLES_PER_STEP);
    if samples <= max {
        Ok(samples)
    } else {
        Err(format!(
            "samples is {samples}: more than a step of this run holds ({max}: the manifest's batch_size_per_rank times its \
             micro-batches per step)"
        ))
    }
}

/// Err when `warmup` or `step_skipped` is other than 0 or 1, or `loss_scale` (where the
/// cell is filled) is not a positive finite number.
fn flags_and_scale(rec: &csv::ByteRecord, c: &Columns, name: &dyn Fn(usize) -> String) -> Result<(), String> {
    // A cell as a message quotes it: its first 40 characters.
    let cell = |i: usize| {
        String::from_utf8_lossy(rec.get(i).unwrap_or_default())
            .chars()
            .take(40)
            .collect::<String>()
    };
    for i in std::iter::once(c.warmup).chain(c.step_skipped) {
        if !matches!(rec.get(i), Some(b"0" | b"1")) {
            return Err(format!("{} is {:?}: it is 0 or 1", name(i), cell(i)));
        }
    }
    if let Some(i) = c.loss_scale.filter(|&i| rec.get(i).is_some_and(|v| !v.is_empty())) {
        match field::<f64>(rec, i) {
            Some(v) if v.is_finite() && v > 0.0 => {}
            _ => {
                return Err(format!(
                    "{} is {:?}: a loss scale is a positive number (or empty without fp16 AMP)",
                    name(i),
                    cell(i)
                ))
            }
        }
    }
    Ok(())
}

/// A step's two squared norms: None when the step did not measure them (its batch
/// cells empty); Err for a batch size that is not a count of samples or a
/// squared norm that is negative. An empty norm cell reads as NaN (not finite when it
/// was taken).
fn noise_pair(rec: &csv::ByteRecord, cols: [usize; 4], name: &dyn Fn(usize) -> String) -> Result<Option<NormPair>, String> {
    let [b_small, sq_small, b_big, sq_big] = cols;
    if rec.get(b_small).is_none_or(<[u8]>::is_empty) {
        return Ok(None);
    }
    let batch = |i: usize| -> Result<f64, String> {
        match field::<f64>(rec, i) {
            Some(v) if v >= 1.0 && v <= MAX_SAMPLES_PER_STEP as f64 => Ok(v),
            _ => Err(format!(
                "{} is {:?}: not a count of samples from 1 to {MAX_SAMPLES_PER_STEP}",
                name(i),
                String::from_utf8_lossy(rec.get(i).unwrap_or_default())
            )),
        }
    };
    let norm = |i: usize| -> Result<f64, String> {
        match field::<f64>(rec, i) {
            None => Ok(f64::NAN),
            Some(v) if v < 0.0 => Err(format!("{} is {}: a squared norm is not negative", name(i), shown(v))),
            Some(v) => Ok(v),
        }
    };
    Ok(Some(NormPair {
        batch_small: batch(b_small)?,
        sq_small: norm(sq_small)?,
        batch_big: batch(b_big)?,
        sq_big: norm(sq_big)?,
    }))
}

impl Row {
    /// Err when the row cannot be one real step: a phase longer than the step, phases
    /// that do not add up to it (they do by construction, results/README.md), all-reduce
    /// work longer than the step (its buckets run one after another inside it), more
    /// hidden than there was, or an entry into the all-reduce outside the step. Times
    /// agree within [`tolerance_s`].
    pub(crate) fn check(&self) -> Result<(), String> {
        let step = self.step_s;
        let tol = |a: f64, b: f64| tolerance_s(a, b);
        for p in Phase::ALL {
            let v = self.phases[p];
            if v > step + tol(v, step) {
                return Err(format!("{p} is {}, longer than the step (step_s is {})", shown(v), shown(step)));
            }
        }
        let sum: f64 = self.phases.values().sum();
        if (sum - step).abs() > tol(sum, step) {
            return Err(format!(
                "the phases add up to {} s where step_s is {}: they must add up to the step",
                format_plain(sum),
                shown(step)
            ));
        }
        if self.comm_s > step + tol(self.comm_s, step) {
            return Err(format!(
                "comm_s is {}, longer than the step (step_s is {})",
                shown(self.comm_s),
                shown(step)
            ));
        }
        if self.comm_hidden_s > self.comm_s + tol(self.comm_hidden_s, self.comm_s) {
            return Err(format!(
                "comm_hidden_s is {}, more than all of the all-reduce work (comm_s is {})",
                shown(self.comm_hidden_s),
                shown(self.comm_s)
            ));
        }
        if self.comm_last_start_at_s + tol(self.comm_last_start_at_s, self.comm_start_at_s) < self.comm_start_at_s {
            return Err(format!(
                "comm_last_start_at_s is {}, before the first bucket's entry (comm_start_at_s is {})",
                shown(self.comm_last_start_at_s),
                shown(self.comm_start_at_s)
            ));
        }
        if self.step_start_at_s.is_finite() {
            let (from, to) = (self.step_start_at_s, self.step_start_at_s + step);
            for (key, t) in [
                ("comm_start_at_s", self.comm_start_at_s),
                ("comm_last_start_at_s", self.comm_last_start_at_s),
            ] {
                if t + tol(t, from) < from || t > to + tol(t, to) {
                    return Err(format!(
                        "{key} is {}, outside its step, which ran from {} to {} s (step_start_at_s to step_start_at_s + step_s)",
                        shown(t),
                        format_plain(from),
                        format_plain(to)
                    ));
                }
            }
        }
        Ok(())
    }

    /// Err when this row cannot follow `prev` in one rank's file: a step not after the
    /// previous one, or one that started before the previous one ended.
    pub(crate) fn follows(&self, prev: &Row) -> Result<(), String> {
        if self.global_step <= prev.global_step {
            return Err(format!(
                "global_step is {}, not after the previous row's {}",
                self.global_step, prev.global_step
            ));
        }
        let prev_end = prev.step_start_at_s + prev.step_s;
        if self.step_start_at_s.is_finite()
            && prev_end.is_finite()
            && self.step_start_at_s + tolerance_s(self.step_start_at_s, prev_end) < prev_end
        {
            return Err(format!(
                "step_start_at_s is {}: the step starts before the previous one ended (at {} s)",
                shown(self.step_start_at_s),
                format_plain(prev_end)
            ));
        }
        Ok(())
    }

    /// Err when the step ends after a run of `run_s` seconds (the manifest's `wall_s`,
    /// on rank 0's clock, which starts before every rank's origin) had ended, beyond
    /// [`clock_slack_s`].
    pub(crate) fn within_run(&self, run_s: f64) -> Result<(), String> {
        let (key, end) = if self.step_start_at_s.is_finite() {
            ("step_start_at_s + step_s", self.step_start_at_s + self.step_s)
        } else {
            ("comm_last_start_at_s", self.comm_last_start_at_s)
        };
        if end > run_s + clock_slack_s(run_s) {
            return Err(format!(
                "{key} is {} s, after the run ended (manifest.json: wall_s is {})",
                shown(end),
                shown(run_s)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1.5 s step from 10 s: data, forward, backward, then 0.4 s in the all-reduce.
    fn step() -> Row {
        Row {
            global_step: 3,
            samples: 32,
            phases: PhaseArray([0.1, 0.0, 0.3, 0.5, 0.4, 0.1, 0.1]),
            step_s: 1.5,
            comm_s: 0.4,
            comm_start_at_s: 10.9,
            comm_last_start_at_s: 10.9,
            bytes: 400,
            step_start_at_s: 10.0,
            ..Row::default()
        }
    }

    #[test]
    fn a_real_step_passes_and_each_contradiction_is_named() {
        assert_eq!(step().check(), Ok(()));
        // Rounded to nanoseconds, as the CSV holds them: still one step.
        let mut r = step();
        r.phases[Phase::Other] += 3e-9;
        assert_eq!(r.check(), Ok(()));
        let broken = |f: fn(&mut Row), needle: &str| {
            let mut r = step();
            f(&mut r);
            let e = r.check().unwrap_err();
            assert!(e.contains(needle), "{e}");
        };
        broken(|r| r.phases[Phase::Forward] = 2.0, "forward_s is 2, longer than the step");
        broken(|r| r.phases[Phase::Other] = 0.0, "the phases add up to 1.4 s where step_s is 1.5");
        broken(|r| r.comm_s = 1.6, "comm_s is 1.6, longer than the step");
        broken(|r| r.comm_hidden_s = 0.5, "comm_hidden_s is 0.5, more than");
        broken(|r| r.comm_start_at_s = 11.0, "before the first bucket's entry");
        broken(
            |r| r.comm_start_at_s = 9.0,
            "comm_start_at_s is 9, outside its step, which ran from 10 to 11.5 s",
        );
        broken(|r| r.comm_last_start_at_s = 12.0, "comm_last_start_at_s is 12, outside its step");
    }

    #[test]
    fn noise_cells_read_as_a_pair_empty_as_unmeasured_and_impossible_ones_named() {
        let headers = csv::ByteRecord::from(vec!["noise_batch_small", "grad_sq_small", "noise_batch_big", "grad_sq_big"]);
        let name = |i: usize| String::from_utf8_lossy(headers.get(i).unwrap()).into_owned();
        let read = |cells: [&str; 4]| noise_pair(&csv::ByteRecord::from(cells.to_vec()), [0, 1, 2, 3], &name);
        let p = read(["32", "2.5", "64", ""]).unwrap().unwrap();
        assert_eq!((p.batch_small, p.sq_small, p.batch_big), (32.0, 2.5, 64.0));
        assert!(p.sq_big.is_nan() && !p.is_usable(), "an empty norm: not finite when taken");
        assert_eq!(read(["", "", "", ""]), Ok(None));
        let e = read(["32", "-1", "64", "1"]).unwrap_err();
        assert!(e.contains("grad_sq_small is -1: a squared norm is not negative"), "{e}");
        let e = read(["0", "1", "64", "1"]).unwrap_err();
        assert!(e.contains("noise_batch_small is \"0\": not a count of samples"), "{e}");
    }

    #[test]
    fn rows_follow_each_other_within_the_run() {
        let first = step();
        let mut next = step();
        next.global_step = 4;
        next.step_start_at_s = 11.5;
        assert_eq!(next.follows(&first), Ok(()));
        next.step_start_at_s = 11.4;
        assert!(next
            .follows(&first)
            .unwrap_err()
            .contains("step_start_at_s is 11.4: the step starts before"));
        next.global_step = 3;
        assert!(next.follows(&first).unwrap_err().contains("global_step is 3, not after"));
        assert_eq!(first.within_run(11.5), Ok(()));
        // 1 s of slack for the clocks: a step ending 1.5 s after the run is not real.
        assert_eq!(first.within_run(10.6), Ok(()));
        assert!(first.within_run(10.0).unwrap_err().contains("after the run ended"));
    }
}
