//! One all-reduce measurement: buffers of one size on one backend, summed out of place
//! or in place, timed over a loop as nccl-tests and the OSU benchmarks do (barrier,
//! warm-up, a timed loop, the mean per iteration), with every iteration's time kept
//! for the spread, and the sum checked element by element on every rank.
//!
//! The timed loop runs its all-reduces back to back, or paced: every rank idle for a
//! while before each one, as a training step leaves the link idle during its compute.
//! The two differ where a link keeps state between messages: a queue that back-to-back
//! traffic keeps full (a shaping qdisc, a switch buffer) adds its delay to every
//! message, and an idle gap as long as a message's own time drains what that message
//! queued.
//!
//! The values rank r puts in element i are `(r + i) mod m`, small whole numbers whose
//! sums are exact in fp32, fp16 and bf16, so a correct all-reduce matches the expected
//! sum bit for bit and `wrong` counts the elements that do not.

use crate::comm::transport::{Dir, Slot, Transport};
use crate::comm::{wire_kind, GradDtype};
use crate::device::cuda::Event;
use crate::link::model::MAX_IDLE_S;
use anyhow::Result;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::{Communicator, SimpleCommunicator};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

/// What a measurement runs on: the transport under test (the one training uses), the
/// communicator whose members take part (barriers, agreeing on times and counts), and
/// where the buffers live.
pub(crate) struct Target<'a> {
    pub comm: &'a SimpleCommunicator,
    pub device: Device,
    pub transport: &'a mut dyn Transport,
}

/// How long and how often one size is timed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SweepIters {
    /// Untimed all-reduces before the timed loop.
    pub warmup_iters: usize,
    /// Timed iterations at most.
    pub iters: usize,
    /// Fewer iterations (but at least [`SweepIters::min_iters`]) when the warm-up says `iters`
    /// would take longer than this.
    pub budget_s: f64,
    pub min_iters: usize,
    /// Idle before each timed iteration.
    pub idle: Idle,
}

/// How long every rank leaves the link idle before each timed all-reduce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Idle {
    /// As long as one all-reduce of the size took in the warm-up (the slowest rank's),
    /// at most [`MAX_AUTO_IDLE_S`]: what one all-reduce queued has drained.
    Auto,
    /// This many seconds; 0 is back to back.
    Fixed(f64),
}

/// The longest idle [`Idle::Auto`] chooses: longer than the queueing delay a shaping
/// qdisc or a switch buffer is set to hold (milliseconds to tens of milliseconds).
pub(crate) const MAX_AUTO_IDLE_S: f64 = 0.05;

impl Idle {
    /// Seconds of idle before each timed iteration, given the warm-up's seconds per
    /// all-reduce on the slowest rank.
    pub(crate) fn seconds(self, per_iter_s: f64) -> f64 {
        match self {
            Idle::Auto if per_iter_s.is_finite() => per_iter_s.clamp(0.0, MAX_AUTO_IDLE_S),
            Idle::Auto => MAX_AUTO_IDLE_S,
            Idle::Fixed(s) => s,
        }
    }

    /// Parses `auto` or milliseconds from 0 to [`MAX_IDLE_S`] × 1000.
    pub(crate) fn parse_ms(s: &str) -> std::result::Result<Idle, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("auto") {
            return Ok(Idle::Auto);
        }
        match t.parse::<f64>() {
            Ok(ms) if ms.is_finite() && (0.0..=MAX_IDLE_S * 1e3).contains(&ms) => Ok(Idle::Fixed(ms / 1e3)),
            _ => Err(format!(
                "`{t}` is not `auto` or milliseconds from 0 to {} (0: back to back)",
                MAX_IDLE_S * 1e3
            )),
        }
    }
}

/// One size's result, the same on every rank.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SizeResult {
    pub bytes: u64,
    pub count: u64,
    pub in_place: bool,
    pub iters: usize,
    /// Seconds every rank left the link idle before each timed iteration (0: back to
    /// back); not part of any time below.
    pub idle_before_s: f64,
    /// The timed loop's seconds per iteration, averaged over ranks (as nccl-tests and
    /// the OSU benchmarks report).
    pub time_s: f64,
    /// The same on the slowest rank.
    pub time_max_rank_s: f64,
    /// Quantiles of the single iterations' times (each the slowest rank's).
    pub iter_p10_s: f64,
    pub iter_median_s: f64,
    pub iter_p90_s: f64,
    /// Elements that differed from the expected sum, over all ranks.
    pub wrong: u64,
}

/// Values per element cycle, so that sums over `ranks` stay exact in `dtype`.
fn value_cycle(ranks: usize, dtype: GradDtype) -> i64 {
    // Largest whole number each type holds exactly with all smaller ones.
    let exact: i64 = match dtype {
        GradDtype::Fp32 => 1 << 24,
        GradDtype::Fp16 => 2048,
        GradDtype::Bf16 => 256,
    };
    (exact / ranks.max(1) as i64 + 1).clamp(1, 4)
}

/// Rank `rank`'s buffer of `count` elements: `(rank + i) mod m`.
fn fill(count: usize, rank: usize, ranks: usize, dtype: GradDtype, device: Device) -> Tensor {
    let t = Tensor::empty([count as i64], (wire_kind(dtype), device));
    fill_into(&t, rank, ranks, dtype);
    t
}

/// Writes rank `rank`'s values into `t`, [`CHECK_CHUNK`] elements at a time (so the
/// temporaries stay small whatever the message size).
fn fill_into(t: &Tensor, rank: usize, ranks: usize, dtype: GradDtype) {
    let m = value_cycle(ranks, dtype);
    let n = t.numel() as i64;
    for start in (0..n).step_by(CHECK_CHUNK as usize) {
        let len = CHECK_CHUNK.min(n - start);
        let values = Tensor::arange_start(start + rank as i64, start + rank as i64 + len, (Kind::Int64, t.device())).remainder(m);
        t.narrow(0, start, len).copy_(&values);
    }
    let corrupt = std::env::var("DDPBENCH_TEST_CORRUPT_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    if corrupt == Some(rank) && n > 0 {
        // Test hook: this rank's first element is off by one, so every rank's sum is wrong there.
        let _ = t.get(0).g_add_scalar_(1);
    }
}

/// Elements compared at once by [`count_wrong`]: its temporaries (24 bytes an element)
/// stay near 100 MB whatever the message size.
const CHECK_CHUNK: i64 = 1 << 22;

/// Elements of `result` that are not the sum over `ranks` of [`fill`]'s values.
fn count_wrong(result: &Tensor, ranks: usize, dtype: GradDtype) -> u64 {
    let m = value_cycle(ranks, dtype);
    let per_residue: Vec<i64> = (0..m).map(|j| (0..ranks as i64).map(|r| (r + j) % m).sum()).collect();
    let device = result.device();
    let table = Tensor::from_slice(&per_residue).to_device(device);
    let n = result.numel() as i64;
    let mut wrong = 0u64;
    for start in (0..n).step_by(CHECK_CHUNK as usize) {
        let len = CHECK_CHUNK.min(n - start);
        let idx = Tensor::arange_start(start, start + len, (Kind::Int64, device)).remainder(m);
        let expected = table.index_select(0, &idx).to_kind(Kind::Double);
        let got = result.narrow(0, start, len).to_kind(Kind::Double);
        wrong += i64::try_from(got.ne_tensor(&expected).sum(Kind::Int64)).unwrap_or(i64::MAX) as u64;
    }
    wrong
}

/// Times the all-reduce of `bytes` (rounded down to whole elements of `dtype`, at least
/// one) on `t`, every rank of its communicator taking part, and checks the sum.
pub(crate) fn measure(t: &mut Target, bytes: u64, dtype: GradDtype, in_place: bool, timing: SweepIters) -> Result<SizeResult> {
    let comm = t.comm;
    let (rank, ranks) = (comm.rank() as usize, comm.size() as usize);
    let count = (bytes as usize / dtype.bytes()).max(1);
    let device = t.device;
    let src = fill(count, rank, ranks, dtype, device);
    let dst = src.zeros_like();
    let mut op = Op::new(t, &src, &dst, in_place, dtype)?;
    let t = &mut *t.transport;
    let what = format!(
        "sweep {} B {}",
        count * dtype.bytes(),
        if in_place { "in place" } else { "out of place" }
    );
    // One flight entry per phase, so the watchdog's limit bounds each phase, not the size.
    let f = crate::flight::enter("all-reduce", &format!("{what}, warm-up"));

    // Warm-up, and how many timed iterations fit the budget (agreed: the slowest rank's estimate).
    comm.barrier();
    let t0 = mpi::time();
    for _ in 0..timing.warmup_iters {
        op.run(t)?;
        crate::flight::progress();
    }
    t.wait()?;
    let per_iter = (mpi::time() - t0) / timing.warmup_iters.max(1) as f64;
    let mut slowest = 0.0f64;
    comm.all_reduce_into(&per_iter, &mut slowest, SystemOperation::max());
    let most = timing.iters.max(1);
    let idle_before_s = timing.idle.seconds(slowest);
    let iters = if slowest > 0.0 && timing.warmup_iters > 0 {
        ((timing.budget_s / (slowest + idle_before_s)) as usize).clamp(timing.min_iters.clamp(1, most), most)
    } else {
        most
    };

    drop(f);

    // The timed loop: each iteration's start and end on the host clock (on a GPU, by events).
    let f = crate::flight::enter("all-reduce", &format!("{what}, timed loop"));
    let iter_s = if idle_before_s > 0.0 {
        timed_paced(&mut op, t, comm, iters, idle_before_s)?
    } else {
        timed_back_to_back(&mut op, t, comm, iters)?
    };
    let loop_s: f64 = iter_s.iter().sum();

    // Across ranks: the mean and the slowest loop, and each iteration's slowest rank.
    let mut sum = 0.0f64;
    let mut max = 0.0f64;
    comm.all_reduce_into(&loop_s, &mut sum, SystemOperation::sum());
    comm.all_reduce_into(&loop_s, &mut max, SystemOperation::max());
    let mut iter_max = vec![0.0f64; iter_s.len()];
    comm.all_reduce_into(&iter_s[..], &mut iter_max[..], SystemOperation::max());

    drop(f);

    // The check: fresh values in the same buffers, one all-reduce, every element compared.
    let _f = crate::flight::enter("all-reduce", &format!("{what}, check"));
    let wrong_here = op.check(t, device, rank, ranks, dtype)?;
    let mut wrong = 0u64;
    comm.all_reduce_into(&wrong_here, &mut wrong, SystemOperation::sum());

    Ok(SizeResult {
        bytes: (count * dtype.bytes()) as u64,
        count: count as u64,
        in_place,
        iters,
        idle_before_s,
        time_s: sum / ranks as f64 / iters as f64,
        time_max_rank_s: max / iters as f64,
        iter_p10_s: crate::stats::quantile(&iter_max, 0.1),
        iter_median_s: crate::stats::median(&iter_max),
        iter_p90_s: crate::stats::quantile(&iter_max, 0.9),
        wrong,
    })
}

/// `iters` all-reduces back to back after one barrier: each iteration's seconds, from
/// the previous one's end (the first from the loop's start).
fn timed_back_to_back(op: &mut Op, t: &mut dyn Transport, comm: &SimpleCommunicator, iters: usize) -> Result<Vec<f64>> {
    comm.barrier();
    let mut marks = Marks::for_count(iters + 1);
    marks.mark(t)?;
    for _ in 0..iters {
        op.run(t)?;
        marks.mark(t)?;
        crate::flight::progress();
    }
    t.wait()?;
    marks.spans(t, |i| (i, i + 1), iters)
}

/// `iters` all-reduces, each after the previous one finished, a barrier and
/// `idle_s` of sleep on every rank: each iteration's seconds from its own start.
fn timed_paced(op: &mut Op, t: &mut dyn Transport, comm: &SimpleCommunicator, iters: usize, idle_s: f64) -> Result<Vec<f64>> {
    let mut marks = Marks::for_count(2 * iters);
    for _ in 0..iters {
        t.wait()?;
        comm.barrier();
        std::thread::sleep(std::time::Duration::from_secs_f64(idle_s));
        marks.mark(t)?;
        op.run(t)?;
        marks.mark(t)?;
        crate::flight::progress();
    }
    t.wait()?;
    marks.spans(t, |i| (2 * i, 2 * i + 1), iters)
}

/// A set of buffers all-reduced back to back per iteration, as training sends its
/// buckets: the same buffers, values and check as [`measure`].
#[derive(Debug, Clone)]
pub(crate) struct SetMeasured {
    /// The slowest rank's time for the whole set, per timed iteration.
    pub iter_s: Vec<f64>,
    /// Elements whose sum was wrong, over all ranks and buffers.
    pub wrong: u64,
}

/// Times all-reduces of buffers of `counts` elements each (one iteration all-reduces
/// every buffer in turn), after one untimed iteration: up to `iters` iterations, and
/// no more once `budget_s` has passed and `min_iters` are done. Each iteration first
/// writes `flush_bytes` bytes elsewhere (so the buffers come from memory rather than
/// cache, as gradients do after backward), then aligns the ranks by a barrier. Every
/// rank of the target's communicator takes part. The sums are checked at the end.
pub(crate) fn measure_set(
    t: &mut Target,
    counts: &[usize],
    dtype: GradDtype,
    iters: usize,
    budget_s: f64,
    min_iters: usize,
    flush_bytes: usize,
) -> Result<SetMeasured> {
    let comm = t.comm;
    let (rank, ranks) = (comm.rank() as usize, comm.size() as usize);
    let device = t.device;
    let mut ops = Vec::with_capacity(counts.len());
    for &c in counts {
        let src = fill(c.max(1), rank, ranks, dtype, device);
        let dst = src.zeros_like();
        ops.push(Op::new(t, &src, &dst, false, dtype)?);
    }
    let t = &mut *t.transport;
    let mut flush = vec![0u8; flush_bytes];
    let mut iter_s = Vec::with_capacity(iters);
    let start = mpi::time();
    for it in 0..=iters {
        for (k, v) in flush.iter_mut().enumerate().step_by(64) {
            *v = (k + it) as u8;
        }
        comm.barrier();
        let t0 = mpi::time();
        for op in ops.iter_mut() {
            op.run(t)?;
        }
        t.wait()?;
        crate::flight::progress();
        // The slowest rank's time, and whether every rank agrees the budget is spent.
        let local = [mpi::time() - t0, mpi::time() - start];
        let mut slowest = [0.0f64; 2];
        comm.all_reduce_into(&local[..], &mut slowest[..], SystemOperation::max());
        if it > 0 {
            iter_s.push(slowest[0]);
        }
        if iter_s.len() >= min_iters && slowest[1] > budget_s {
            break;
        }
    }
    let mut wrong_here = 0u64;
    for op in ops.iter_mut() {
        wrong_here += op.check(t, device, rank, ranks, dtype)?;
    }
    let mut wrong = 0u64;
    comm.all_reduce_into(&wrong_here, &mut wrong, SystemOperation::sum());
    Ok(SetMeasured { iter_s, wrong })
}

/// One all-reduce of the sweep: its buffers bound to the transport.
struct Op {
    slot: Slot,
    src: Tensor,
    dst: Tensor,
}

impl Op {
    fn new(t: &mut Target, src: &Tensor, dst: &Tensor, in_place: bool, dtype: GradDtype) -> Result<Op> {
        let slot = t.transport.slot(src, (!in_place).then_some(dst), dtype.into(), false)?;
        // The buffers were written on libtorch's stream: done before anything is timed.
        crate::device::sync(t.device);
        Ok(Op {
            slot,
            src: src.shallow_clone(),
            dst: dst.shallow_clone(),
        })
    }

    fn run(&mut self, t: &mut dyn Transport) -> Result<()> {
        t.allreduce(&mut self.slot, Dir::AToB).map(|_| ())
    }

    /// Fresh values in the same buffers, one all-reduce, and the elements of this rank's
    /// result that are not the exact sum.
    fn check(&mut self, t: &mut dyn Transport, device: Device, rank: usize, ranks: usize, dtype: GradDtype) -> Result<u64> {
        fill_into(&self.src, rank, ranks, dtype);
        let _ = self.dst.zero_();
        crate::device::sync(device);
        self.run(t)?;
        t.wait()?;
        Ok(count_wrong(self.slot.result(Dir::AToB), ranks, dtype))
    }
}

/// The timed loop's marks: host instants, and (where the transport runs on a stream)
/// an event recorded on it at each.
struct Marks(Vec<(f64, Option<Event>)>);

impl Marks {
    /// Room for `count` marks, so that no mark grows the list inside a timed span.
    fn for_count(count: usize) -> Marks {
        Marks(Vec::with_capacity(count))
    }

    /// A mark: the host clock now, and (on a stream) an event recorded after what was queued.
    fn mark(&mut self, t: &dyn Transport) -> Result<()> {
        let event = match t.stream() {
            Some((cuda, stream)) => {
                let e = cuda.event(true)?;
                cuda.record(&e, stream)?;
                Some(e)
            }
            None => None,
        };
        self.0.push((mpi::time(), event));
        Ok(())
    }

    /// Seconds from mark `a` to mark `b` of each of `iters` iterations (`(a, b) =
    /// at(i)`): between the events on a stream, between the host instants otherwise.
    fn spans(&self, t: &dyn Transport, at: impl Fn(usize) -> (usize, usize), iters: usize) -> Result<Vec<f64>> {
        (0..iters)
            .map(|i| {
                let (a, b) = at(i);
                let ((ta, ea), (tb, eb)) = (&self.0[a], &self.0[b]);
                match (t.stream(), ea, eb) {
                    (Some((cuda, _)), Some(ea), Some(eb)) => cuda.elapsed_s(ea, eb),
                    _ => Ok(tb - ta),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_auto_or_bounded_milliseconds_and_auto_follows_the_warm_up() {
        assert_eq!(Idle::parse_ms("auto"), Ok(Idle::Auto));
        assert_eq!(Idle::parse_ms(" AUTO "), Ok(Idle::Auto));
        assert_eq!(Idle::parse_ms("0"), Ok(Idle::Fixed(0.0)));
        assert_eq!(Idle::parse_ms("12.5"), Ok(Idle::Fixed(0.0125)));
        for bad in ["-1", "nan", "inf", "10001", "soon", ""] {
            let e = Idle::parse_ms(bad).unwrap_err();
            assert!(e.contains("not `auto` or milliseconds from 0 to 10000"), "{bad}: {e}");
        }
        assert_eq!(Idle::Auto.seconds(0.003), 0.003);
        assert_eq!(Idle::Auto.seconds(2.0), MAX_AUTO_IDLE_S);
        assert_eq!(Idle::Auto.seconds(f64::NAN), MAX_AUTO_IDLE_S);
        assert_eq!(Idle::Fixed(0.2).seconds(0.003), 0.2);
    }

    #[test]
    fn values_stay_exact_in_every_dtype() {
        assert_eq!(value_cycle(2, GradDtype::Fp32), 4);
        assert_eq!(value_cycle(2, GradDtype::Bf16), 4);
        // 3 × 128 > 256: bf16 with 128 ranks needs values 0..2.
        assert_eq!(value_cycle(128, GradDtype::Bf16), 3);
        assert_eq!(value_cycle(100_000, GradDtype::Fp16), 1);
        for (ranks, dtype) in [(2, GradDtype::Fp16), (128, GradDtype::Bf16), (700, GradDtype::Fp16)] {
            let m = value_cycle(ranks, dtype);
            let max_sum = (m - 1) * ranks as i64;
            let limit = if dtype == GradDtype::Fp16 { 2048 } else { 256 };
            assert!(max_sum <= limit, "{ranks} ranks {dtype:?}: sums up to {max_sum}");
        }
    }

    #[test]
    fn the_check_counts_exactly_the_wrong_elements() {
        // Two ranks' values summed by hand: element i holds (i%4) + ((1+i)%4).
        let ranks = 2;
        let a = fill(10, 0, ranks, GradDtype::Fp16, Device::Cpu);
        let b = fill(10, 1, ranks, GradDtype::Fp16, Device::Cpu);
        let sum = (&a + &b).to_kind(Kind::Half);
        assert_eq!(count_wrong(&sum, ranks, GradDtype::Fp16), 0);
        let _ = sum.get(3).g_add_scalar_(1);
        let _ = sum.get(7).g_add_scalar_(-2);
        assert_eq!(count_wrong(&sum, ranks, GradDtype::Fp16), 2);
        // One rank's buffer alone is not the sum, except where the other rank's value is
        // 0: (1 + i) mod 4 = 0 at i = 3 and 7.
        assert_eq!(count_wrong(&a, ranks, GradDtype::Fp16), 8);
    }
}
