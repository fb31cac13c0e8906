//! `ddpbench trace RUN_DIR --png [FILE]`: a picture of the merged timeline, one lane per
//! rank, each lane the training thread's phases of every step drawn (upper row) and the
//! all-reduce (lower row: from a step's first bucket's start to its last bucket's end,
//! blue while backward still runs, pink once it is exposed), on rank 0's clock in ms.
//!
//! What is drawn stays readable whatever the run: at most [`MAX_RANKS_DRAWN`] ranks (the
//! lowest-numbered) and [`MAX_STEPS_DRAWN`] steps (the first ones of the window asked for,
//! or of the trace). The events are taken from the merge as it streams
//! ([`super::merge::merge_seeing`]), so memory holds only the slices drawn.

use crate::plot::{self, LaneRow, LaneSlice};
use crate::record::Phase;
use crate::trace::event::tid;
use crate::trace::StepWindow;
use anyhow::{bail, Result};
use plotters::style::RGBColor;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The most ranks drawn: ranks 0 to 63; the title says how many the run had.
pub(crate) const MAX_RANKS_DRAWN: usize = 64;
/// The most steps drawn: the first 20 of the window; stderr says which were left out.
pub(crate) const MAX_STEPS_DRAWN: usize = 20;

/// The all-reduce while backward still runs (hidden behind it).
pub(crate) const HIDDEN: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
/// The all-reduce once backward has ended (exposed).
pub(crate) const EXPOSED: RGBColor = RGBColor(0xe3, 0x77, 0xc2);

/// A phase's colour in the picture. A match with no catch-all: a new phase does not
/// compile until it has its own colour.
pub(crate) fn phase_colour(phase: Phase) -> RGBColor {
    match phase {
        Phase::Data => RGBColor(0x8c, 0x56, 0x4b),
        Phase::BatchCopy => RGBColor(0xc4, 0x9c, 0x94),
        Phase::Forward => RGBColor(0xff, 0x7f, 0x0e),
        Phase::Backward => RGBColor(0x2c, 0xa0, 0x2c),
        Phase::CommExposed => RGBColor(0xd6, 0x27, 0x28),
        Phase::Optimizer => RGBColor(0x94, 0x67, 0xbd),
        Phase::Other => RGBColor(0xbc, 0xbd, 0x22),
    }
}

/// One span of one rank in one step, in µs on rank 0's clock.
#[derive(Debug, Clone, Copy)]
struct Span {
    rank: usize,
    row: LaneRow,
    colour: RGBColor,
    from_us: f64,
    to_us: f64,
}

/// The slices of the steps drawn, gathered from the merge one event at a time.
#[derive(Debug)]
pub(crate) struct Picture {
    /// The steps asked for; `None`: the first [`MAX_STEPS_DRAWN`] the trace holds.
    asked: Option<StepWindow>,
    /// Per rank, the step whose events its file is at (each step's events follow its
    /// `ProfilerStep#N` slice).
    step_of: BTreeMap<usize, usize>,
    /// The spans of each step kept, by step; the all-reduce as one span per rank, kind
    /// and step.
    steps: BTreeMap<usize, Vec<Span>>,
    /// Steps seen in the window asked for, drawn or not.
    seen: std::collections::BTreeSet<usize>,
    /// The highest rank seen, plus one.
    ranks: usize,
}

impl Picture {
    pub(crate) fn new(asked: Option<StepWindow>) -> Picture {
        Picture {
            asked,
            step_of: BTreeMap::new(),
            steps: BTreeMap::new(),
            seen: Default::default(),
            ranks: 0,
        }
    }

    /// Takes one merged event of `rank`.
    pub(crate) fn see(&mut self, rank: usize, e: &Map<String, Value>) {
        self.ranks = self.ranks.max(rank + 1);
        let (Some(name), Some(thread)) = (e.get("name").and_then(Value::as_str), e.get("tid").and_then(Value::as_u64)) else {
            return;
        };
        if e.get("ph").and_then(Value::as_str) != Some("X") {
            return;
        }
        if let Some(n) = name.strip_prefix("ProfilerStep#").and_then(|n| n.parse::<usize>().ok()) {
            self.step_of.insert(rank, n);
            if self.asked.is_none_or(|w| w.contains(n)) {
                self.seen.insert(n);
            }
            return;
        }
        let (row, colour) = match (thread, name) {
            (tid::STEP, _) => match Phase::ALL.iter().find(|p| p.column().trim_end_matches("_s") == name) {
                Some(p) => (LaneRow::Phases, phase_colour(*p)),
                None => return,
            },
            (tid::ALLREDUCE, "hidden") => (LaneRow::Comm, HIDDEN),
            (tid::ALLREDUCE, "exposed") => (LaneRow::Comm, EXPOSED),
            _ => return,
        };
        let Some(&step) = self.step_of.get(&rank) else { return };
        if rank >= MAX_RANKS_DRAWN || !self.keeps(step) {
            return;
        }
        let ts = e.get("ts").and_then(Value::as_f64).unwrap_or(0.0);
        let dur = e.get("dur").and_then(Value::as_f64).unwrap_or(0.0);
        let span = Span {
            rank,
            row,
            colour,
            from_us: ts,
            to_us: ts + dur,
        };
        let spans = self.steps.entry(step).or_default();
        // One all-reduce span of each kind per rank and step: its buckets' union, so a
        // model of a thousand buckets draws two spans a step, not a thousand.
        let same = |s: &&mut Span| row == LaneRow::Comm && s.row == row && s.rank == rank && s.colour == colour;
        match spans.iter_mut().find(same) {
            Some(s) => {
                s.from_us = s.from_us.min(span.from_us);
                s.to_us = s.to_us.max(span.to_us);
            }
            None => spans.push(span),
        }
        if self.steps.len() > MAX_STEPS_DRAWN {
            self.steps.pop_last();
        }
    }

    /// Whether `step` is one of the steps drawn, as far as the events seen so far tell.
    fn keeps(&self, step: usize) -> bool {
        match self.asked {
            Some(w) => w.contains(step) && step < w.first + MAX_STEPS_DRAWN,
            None => self.steps.len() < MAX_STEPS_DRAWN || self.steps.last_key_value().is_some_and(|(last, _)| step <= *last),
        }
    }

    /// The steps drawn, first and last.
    pub(crate) fn drawn(&self) -> Option<(usize, usize)> {
        Some((*self.steps.first_key_value()?.0, *self.steps.last_key_value()?.0))
    }

    /// The steps of the window that were traced but not drawn.
    pub(crate) fn left_out(&self) -> usize {
        self.seen.iter().filter(|s| !self.steps.contains_key(s)).count()
    }

    /// How many ranks' lanes are drawn.
    pub(crate) fn lanes(&self) -> usize {
        self.ranks.min(MAX_RANKS_DRAWN)
    }

    /// The picture as an SVG document; `run` names the run in its title.
    pub(crate) fn svg(&self, run: &str) -> Result<String> {
        let Some((first, last)) = self.drawn() else {
            match self.asked {
                Some(w) => bail!("the trace holds no step of {w} (B excluded): give --png-steps within the traced steps"),
                None => bail!("the trace holds no whole step to draw"),
            }
        };
        let spans = self.steps.values().flatten();
        let t0_us = spans.clone().map(|s| s.from_us).fold(f64::INFINITY, f64::min);
        let t1_us = spans.clone().map(|s| s.to_us).fold(f64::NEG_INFINITY, f64::max);
        let slices: Vec<LaneSlice> = spans
            .map(|s| LaneSlice {
                lane: s.rank,
                row: s.row,
                from_ms: (s.from_us - t0_us) / 1e3,
                to_ms: (s.to_us - t0_us) / 1e3,
                colour: s.colour,
            })
            .collect();
        let lanes = self.lanes();
        let labels: Vec<String> = (0..lanes).map(|r| r.to_string()).collect();
        let ranks = if lanes < self.ranks {
            format!("ranks 0-{} of {}", lanes - 1, self.ranks)
        } else {
            format!("{} ranks", self.ranks)
        };
        let title = format!("{run}: steps {first}-{last}, {ranks}, on rank 0's clock");
        let mut legend: Vec<(String, RGBColor)> = Phase::ALL
            .iter()
            .map(|p| (p.column().trim_end_matches("_s").to_string(), phase_colour(*p)))
            .collect();
        legend.push(("all-reduce, hidden".into(), HIDDEN));
        legend.push(("all-reduce, exposed".into(), EXPOSED));
        plot::lanes(&title, &labels, (t1_us - t0_us) / 1e3, &slices, &legend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(name: &str, thread: u64, ts: f64, dur: f64) -> Map<String, Value> {
        json!({"ph": "X", "name": name, "tid": thread, "ts": ts, "dur": dur})
            .as_object()
            .unwrap()
            .clone()
    }

    /// `steps` steps of `ranks` ranks, each step a forward and two buckets' exposed
    /// all-reduce.
    fn fed(asked: Option<StepWindow>, ranks: usize, steps: usize) -> Picture {
        let mut p = Picture::new(asked);
        for r in 0..ranks {
            for s in 0..steps {
                let t = s as f64 * 1000.0;
                p.see(r, &ev(&format!("ProfilerStep#{s}"), tid::STEP, t, 900.0));
                p.see(r, &ev("forward", tid::STEP, t, 300.0));
                p.see(r, &ev("exposed", tid::ALLREDUCE, t + 400.0, 100.0));
                p.see(r, &ev("exposed", tid::ALLREDUCE, t + 600.0, 100.0));
            }
        }
        p
    }

    #[test]
    fn at_most_64_ranks_and_the_first_20_steps_are_kept() {
        let p = fed(None, 70, 30);
        assert_eq!(p.drawn(), Some((0, 19)));
        assert_eq!((p.lanes(), p.left_out()), (64, 10));
        let ranks: std::collections::BTreeSet<usize> = p.steps.values().flatten().map(|s| s.rank).collect();
        assert_eq!(ranks.len(), 64);
        // One forward and one all-reduce span (two buckets' union) per rank and step.
        let comm: Vec<&Span> = p.steps[&3].iter().filter(|s| s.row == LaneRow::Comm && s.rank == 5).collect();
        assert_eq!(comm.len(), 1);
        assert_eq!((comm[0].from_us, comm[0].to_us), (3400.0, 3700.0));
        assert!(p.svg("run").unwrap().contains("ranks 0-63 of 70"));
    }

    #[test]
    fn a_window_asked_for_keeps_its_first_20_steps_and_an_empty_one_is_refused() {
        let p = fed(Some("5:40".parse().unwrap()), 2, 50);
        assert_eq!((p.drawn(), p.left_out()), (Some((5, 24)), 15));
        let e = fed(Some("60:70".parse().unwrap()), 2, 50).svg("run").unwrap_err().to_string();
        assert!(e.contains("no step of 60:70"), "{e}");
    }
}
