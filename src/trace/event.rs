//! One trace event in the Chrome trace-event format, as ddpbench writes it: complete
//! (`"ph":"X"`) slices, counters (`"C"`) and process-wide instants (`"i"`). Times are
//! kept in integer nanoseconds and written in microseconds, the format's unit whatever
//! `displayTimeUnit` says: `ts` with three decimals, and `dur` such that `ts + dur`
//! added in f64, as a viewer adds them, lands exactly where the slice ends
//! ([`viewer_times`]), so a slice that ends where the next starts, or where its parent
//! ends, does so on screen too. Every event carries `cat` and `dur` (Holistic Trace
//! Analysis drops events without them), metadata, counters and instants with `dur` 0.

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
            micros(self.ts_ns),
            dur_text(self.ts_ns, self.ts_ns + self.dur_ns)
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

/// Nanoseconds as microseconds with exactly three decimals (no exponent, no rounding).
pub(crate) fn micros(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

/// `ts` and `dur` in microseconds of a slice from `ts_ns` to `end_ns`, as a viewer
/// reads and adds them. `ts` is the f64 nearest `ts_ns / 1000`, what its three-decimal
/// text parses to. `dur` is the f64 for which `ts + dur`, added in f64, is [`end_f64`]
/// of `end_ns`: the same f64 for every slice that ends at that nanosecond whatever its
/// start, and never past the `ts` of a slice that starts there. So a phase ends at or
/// before the next one's start and a child at or before its parent's end, on screen as
/// in nanoseconds. `dur` stays within a few f64 steps of the end's size of
/// `(end_ns - ts_ns) / 1000` (under 0.05 ns within ten hours of trace), so a reader
/// that rounds to whole nanoseconds (Perfetto) reads the nanoseconds written.
pub fn viewer_times(ts_ns: i64, end_ns: i64) -> (f64, f64) {
    let t = ts_ns as f64 / 1e3;
    let e = end_f64(end_ns.max(ts_ns));
    if e <= t {
        return (t, 0.0);
    }
    let plain = (end_ns - ts_ns) as f64 / 1e3;
    let near = e - t;
    let candidates = [plain, near, next_up(near), next_down(near), next_up(next_up(near))];
    if let Some(d) = candidates.into_iter().find(|d| t + d == e) {
        return (t, d);
    }
    // Before the origin (a negative `ts`) the sum may not reach `e`: the largest `dur`
    // below it, a few f64 steps from `near` (each moves the sum by about one of e's).
    let mut d = near;
    for _ in 0..64 {
        if t + d > e {
            d = next_down(d);
        } else if t + next_up(d) <= e {
            d = next_up(d);
        } else {
            break;
        }
    }
    (t, if t + d <= e { d } else { 0.0 })
}

/// Where a slice ending at `end_ns` ends in f64 microseconds: the f64 nearest
/// `end_ns / 1000` when its last bit is even, else the one just below (whose last bit
/// is). A start that lies halfway between two f64 of the end's size, as a start
/// smaller than the slice's length can, reaches only sums with an even last bit
/// (ties round to even); with it every slice ending there can end on the same f64.
pub(crate) fn end_f64(end_ns: i64) -> f64 {
    let e = end_ns as f64 / 1e3;
    match (e.to_bits() & 1, e > 0.0) {
        (0, _) => e,
        (_, true) => f64::from_bits(e.to_bits() - 1),
        (_, false) => f64::from_bits(e.to_bits() + 1),
    }
}

/// [`viewer_times`]' `dur` as JSON text: three decimals where they already add up,
/// else the shortest decimal that reads back as that f64.
fn dur_text(ts_ns: i64, end_ns: i64) -> String {
    let (_, d) = viewer_times(ts_ns, end_ns);
    let dur_ns = end_ns.max(ts_ns) - ts_ns;
    if d == dur_ns as f64 / 1e3 {
        micros(dur_ns)
    } else {
        format!("{d}")
    }
}

/// The next f64 above `d >= 0`.
fn next_up(d: f64) -> f64 {
    f64::from_bits(d.to_bits() + 1)
}

/// The next f64 below `d >= 0`, or 0.
fn next_down(d: f64) -> f64 {
    if d > 0.0 {
        f64::from_bits(d.to_bits() - 1)
    } else {
        0.0
    }
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
        assert_eq!(micros(1_234_567), "1234.567");
        assert_eq!(micros(-5), "-0.005");
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

    /// Random slices over ten hours of nanoseconds, each with a child ending with it: from
    /// the texts written, `ts + dur` in f64 is the same for parent and child and at or
    /// before the `ts` of a slice starting at that instant; whole nanoseconds read back.
    #[test]
    fn ts_plus_dur_in_f64_ends_children_with_parents_and_before_the_next_start() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        let parse = |s: &str| s.parse::<f64>().unwrap();
        let (mut exact, mut three_decimals_past) = (0, 0);
        for _ in 0..200_000 {
            let span = if next(2) == 0 { 2_000_000_000 } else { 36_000_000_000_000 };
            let ts = next(span) as i64;
            let longest = if next(2) == 0 { 1_000_000 } else { 5_000_000_000 };
            let end = ts + next(longest) as i64;
            // A child of some length (a zero-length one at its parent's end starts, and
            // ends, at the next start: after the parent, drawn beside it).
            let child = ts + next((end - ts).max(1) as u64) as i64;
            let ends = |from: i64| parse(&micros(from)) + parse(&dur_text(from, end));
            let next_start = parse(&micros(end));
            assert_eq!(ends(ts), ends(child), "{ts} and {child} -> {end}");
            assert!(ends(ts) <= next_start, "{ts} -> {end}");
            exact += usize::from(ends(ts) == next_start);
            let (t, d) = viewer_times(ts, end);
            assert_eq!(((t * 1e3).round() as i64, (d * 1e3).round() as i64), (ts, end - ts));
            three_decimals_past += usize::from(parse(&micros(ts)) + parse(&micros(end - ts)) > next_start);
        }
        // Half the ends land on the next start itself, the rest one f64 before it; three
        // decimals alone end many slices past the next start.
        assert!(exact > 90_000, "{exact}");
        assert!(three_decimals_past > 10_000, "{three_decimals_past}");
        // Before the origin, and zero length: never past the end.
        assert_eq!(viewer_times(42, 42), (0.042, 0.0));
        for (ts, end) in [(0, 5), (-5_000_000_001, 1), (-3, -1), (-7, 1_000)] {
            let (t, d) = viewer_times(ts, end);
            assert!(t + d <= end_f64(end) && d >= 0.0, "{ts} -> {end}: {t} + {d}");
            assert!(((t + d) * 1e3 - end as f64).abs() < 1e-3, "{ts} -> {end}: {t} + {d}");
        }
    }
}
