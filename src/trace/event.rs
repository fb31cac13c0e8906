//! One trace event in the Chrome trace-event format, as ddpbench writes it: complete
//! (`"ph":"X"`) slices and counters (`"C"`), times in integer nanoseconds written as
//! microseconds with three decimals, so a slice cut from its parent's marks nests in it
//! exactly. Every event carries `cat` and `dur` (Holistic Trace Analysis drops events
//! without them), metadata and counters with `dur` 0.

use serde_json::Value;

/// The threads (`tid`) of one rank's trace.
pub mod tid {
    /// The training thread: steps, their phases, validation.
    pub const STEP: u64 = 1;
    /// Each bucket's all-reduce, from its start to its end.
    pub const ALLREDUCE: u64 = 2;
    /// When backward handed each bucket to the all-reduce.
    pub const HAND_OVER: u64 = 3;
    /// Counters (loss).
    pub const COUNTERS: u64 = 4;
    /// Data worker w's batch preparation is on thread `WORKER_FIRST + w`.
    pub const WORKER_FIRST: u64 = 16;
}

/// An event on one rank's own clock: nanoseconds since its start of the run.
#[derive(Debug, Clone)]
pub struct Event {
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
    pub fn slice(name: impl Into<String>, cat: &'static str, tid: u64, ts_ns: i64, end_ns: i64) -> Event {
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

    pub fn with_args(mut self, args: Value) -> Event {
        self.args = args;
        self
    }

    /// Metadata naming a process or thread (`name` is `process_name`, `thread_name`, ...).
    pub fn metadata(name: &str, tid: u64, args: Value) -> Event {
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
    pub fn line(&self, pid: usize) -> String {
        let mut s = format!(
            "{{\"ph\":\"{}\",\"cat\":\"{}\",\"name\":{},\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{}",
            self.ph,
            self.cat,
            Value::String(self.name.clone()),
            self.tid,
            micros(self.ts_ns),
            micros(self.dur_ns)
        );
        if !self.args.is_null() {
            s.push_str(",\"args\":");
            s.push_str(&self.args.to_string());
        }
        s.push('}');
        s
    }
}

/// Nanoseconds as microseconds with exactly three decimals (no exponent, no rounding).
pub fn micros(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

/// Seconds as whole nanoseconds.
pub fn ns(seconds: f64) -> i64 {
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
    }
}
