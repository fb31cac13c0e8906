//! One trace event in the Chrome trace-event format, as ddpbench writes it: complete
//! (`"ph":"X"`) slices, counters (`"C"`) and process-wide instants (`"i"`). Times are
//! kept in integer nanoseconds and written in microseconds, the format's unit whatever
//! `displayTimeUnit` says, on a grid of 1/1024 µs ([`ticks`]): every `ts` and `dur` is an
//! exact binary fraction, so whatever a viewer adds or subtracts in f64 (`ts + dur`,
//! speedscope's `(ts − the track's first ts) + dur`) is exact, and a slice that ends where
//! the next starts, or where its parent ends, does so on screen too. The grid is
//! monotone: slices ordered in nanoseconds stay ordered. Every event carries `cat` and
//! `dur` (Holistic Trace Analysis drops events without them), metadata, counters and
//! instants with `dur` 0.

use serde_json::Value;

/// The threads (`tid`) of one rank's trace.
pub(crate) mod tid {
    /// The training thread: steps, their phases, validation.
    pub(crate) const STEP: u64 = 1;
    /// Each bucket's all-reduce, from its start to its end.
    pub(crate) const ALLREDUCE: u64 = 2;
    /// When backward handed each bucket to the all-reduce.
    pub(crate) const HAND_OVER: u64 = 3;
    /// Counters (loss).
    pub(crate) const COUNTERS: u64 = 4;
    /// Data worker w's batch preparation is on thread `WORKER_FIRST + w`.
    pub(crate) const WORKER_FIRST: u64 = 16;
}

/// An event on one rank's own clock: nanoseconds since its start of the run.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub ph: char,
    pub name: String,
    pub cat: &'static str,
    pub tid: u64,
    pub ts_ns: i64,
    pub dur_ns: i64,
    /// A JSON object, or Null for none.
    pub args: Value,
}

impl Event {
    pub(crate) fn slice(name: impl Into<String>, cat: &'static str, tid: u64, ts_ns: i64, end_ns: i64) -> Event {
        Event {
            ph: 'X',
            name: name.into(),
            cat,
            tid,
            ts_ns,
            dur_ns: (end_ns - ts_ns).max(0),
            args: Value::Null,
        }
    }

    pub(crate) fn with_args(mut self, args: Value) -> Event {
        self.args = args;
        self
    }

    /// A mark across the whole of this rank's process (`"ph":"i"`, `"s":"p"`).
    pub(crate) fn instant(name: impl Into<String>, cat: &'static str, tid: u64, ts_ns: i64) -> Event {
        Event {
            ph: 'i',
            ..Event::slice(name, cat, tid, ts_ns, ts_ns)
        }
    }

    /// Metadata naming a process or thread (`name` is `process_name`, `thread_name`, ...).
    pub(crate) fn metadata(name: &str, tid: u64, args: Value) -> Event {
        Event {
            ph: 'M',
            name: name.into(),
            cat: "__metadata",
            tid,
            ts_ns: 0,
            dur_ns: 0,
            args,
        }
    }

    /// One line of JSON, for rank `pid`.
    pub(crate) fn line(&self, pid: usize) -> String {
        let mut s = format!(
            "{{\"ph\":\"{}\",\"cat\":\"{}\",\"name\":{},\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{}",
            self.ph,
            self.cat,
            Value::String(self.name.clone()),
            self.tid,
            grid_text(ticks(self.ts_ns)),
            grid_text(ticks(self.ts_ns + self.dur_ns) - ticks(self.ts_ns))
        );
        if self.ph == 'i' {
            s.push_str(",\"s\":\"p\"");
        }
        if !self.args.is_null() {
            s.push_str(",\"args\":");
            s.push_str(&self.args.to_string());
        }
        s.push('}');
        s
    }
}

/// Ticks of the time grid per microsecond: a power of two, so that a time on the grid
/// is an exact f64 (below 2^53 ticks, 278 years) and sums and differences of such
/// times are exact too.
pub(crate) const TICKS_PER_US: i64 = 1024;

/// `ns` on the grid: the nearest tick of 1/1024 µs (ties up), within 0.49 ns of it.
/// Monotone in `ns`, so times in order stay in order.
pub(crate) fn ticks(ns: i64) -> i64 {
    // ns × 1024/1000 = ns × 128/125; ×2 and +125 round half up; div_euclid floors
    // negatives too. No overflow within ±4.5e16 ns (over a year).
    (2 * 128 * ns + 125).div_euclid(250)
}

/// A grid time as JSON text in microseconds: exact decimal digits (at most ten after
/// the point), no exponent.
pub(crate) fn grid_text(ticks: i64) -> String {
    let sign = if ticks < 0 { "-" } else { "" };
    let a = ticks.unsigned_abs();
    let (whole, frac) = (a / TICKS_PER_US as u64, a % TICKS_PER_US as u64);
    if frac == 0 {
        return format!("{sign}{whole}");
    }
    // frac/1024 = frac × 9,765,625 / 10^10.
    let digits = format!("{:010}", frac * 9_765_625);
    format!("{sign}{whole}.{}", digits.trim_end_matches('0'))
}

/// `ts` and `dur` in microseconds of a slice from `ts_ns` to `end_ns`, on the grid, as
/// f64 (exact): `ts + dur` is the end's grid time itself.
pub fn viewer_times(ts_ns: i64, end_ns: i64) -> (f64, f64) {
    let (from, to) = (ticks(ts_ns), ticks(end_ns.max(ts_ns)));
    let per = TICKS_PER_US as f64;
    (from as f64 / per, (to - from) as f64 / per)
}

/// Seconds as whole nanoseconds.
pub(crate) fn ns(seconds: f64) -> i64 {
    (seconds * 1e9).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json_with_exact_microseconds() {
        assert_eq!(grid_text(ticks(1_234_567)), "1234.5673828125");
        assert_eq!(grid_text(ticks(1_000)), "1");
        assert_eq!(grid_text(ticks(-5)), "-0.0048828125");
        let e = Event::slice("forward \"x\"", "cpu_op", tid::STEP, 1_000, 3_500).with_args(serde_json::json!({"k": 1}));
        let v: Value = serde_json::from_str(&e.line(3)).unwrap();
        assert_eq!(v["ts"], 1.0);
        assert_eq!(v["dur"], 2.5);
        assert_eq!(v["pid"], 3);
        assert_eq!(v["name"], "forward \"x\"");
        assert_eq!(v["args"]["k"], 1);
        let i: Value = serde_json::from_str(&Event::instant("stop", "user_annotation", tid::STEP, 7_000).line(0)).unwrap();
        assert_eq!(
            (i["ph"].as_str(), i["s"].as_str(), i["ts"].as_f64(), i["dur"].as_f64()),
            (Some("i"), Some("p"), Some(7.0), Some(0.0))
        );
    }

    /// Random slices over ten hours of nanoseconds, each with a child ending with it and
    /// a track starting anywhere before: from the texts written, parsed as a viewer
    /// parses them, the end is the same for parent and child and at or before the next
    /// start whether the viewer adds `ts + dur` or `(ts − first) + dur`; each time is
    /// within half a grid step of its nanoseconds. Three-decimal microseconds, the
    /// format before the grid, fail the same check many times.
    #[test]
    fn any_viewer_arithmetic_ends_children_with_parents_and_before_the_next_start() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        let parse = |s: &str| s.parse::<f64>().unwrap();
        let text = |ns: i64| grid_text(ticks(ns));
        let dur = |from: i64, to: i64| grid_text(ticks(to) - ticks(from));
        let mut three_decimals_past = 0;
        for _ in 0..200_000 {
            let span = if next(2) == 0 { 2_000_000_000 } else { 36_000_000_000_000 };
            let ts = next(span) as i64;
            let longest = if next(2) == 0 { 1_000_000 } else { 5_000_000_000 };
            let end = ts + next(longest) as i64;
            let child = ts + next((end - ts).max(1) as u64) as i64;
            let first = parse(&text(next(ts.max(1) as u64) as i64));
            for base in [0.0, first] {
                let ends = |from: i64| (parse(&text(from)) - base) + parse(&dur(from, end));
                let next_start = parse(&text(end)) - base;
                assert_eq!(ends(ts), ends(child), "{ts} and {child} -> {end} from {base}");
                assert!(ends(ts) <= next_start, "{ts} -> {end} from {base}");
            }
            let back = parse(&text(ts)) * 1e3;
            assert!((back - ts as f64).abs() <= 0.49, "{ts} read back as {back}");
            let three = |ns: i64| format!("{}.{:03}", ns / 1000, ns % 1000).parse::<f64>().unwrap();
            let start = three(ts);
            three_decimals_past += usize::from((start - first) + three(end - ts) > three(end) - first);
        }
        assert!(three_decimals_past > 1_000, "{three_decimals_past}");
        // Before the origin, and zero length.
        assert_eq!(viewer_times(42, 42), (43.0 / 1024.0, 0.0));
        for (ts, end) in [(0, 5), (-5_000_000_001, 1), (-3, -1), (-7, 1_000)] {
            let (t, d) = viewer_times(ts, end);
            assert!(d >= 0.0 && ((t + d) * 1e3 - end as f64).abs() <= 0.49, "{ts} -> {end}: {t} + {d}");
        }
    }
}
