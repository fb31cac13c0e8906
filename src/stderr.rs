//! The process's stderr, written by a thread of its own so that no caller waits on it.
//!
//! A pipe nobody reads (`ddpbench train 2>&1 | sleep 600`), a terminal paused with
//! Ctrl-S or a launcher that stopped forwarding would otherwise stop the training loop
//! at its next log line. Log lines ([`line`](fn@line)) and progress-bar redraws ([`frame`]) are
//! queued, up to [`buffer_bytes`] of them; a log line that does not fit is dropped and
//! counted ([`lines_dropped`]), and where lines went missing the writer says how many as
//! soon as it can write again. A redraw that does not fit is dropped without a word (the
//! next one draws the bar again). An error ([`say`]) is never dropped: it waits for the
//! writer, [`DRAIN_WAIT`] at most. [`finish`] says the total dropped and gives the queue
//! the same time to drain before the process ends. A leaf: it uses nothing else in the
//! crate.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Bytes of text the queue holds while stderr is not read, unless
/// `DDPBENCH_LOG_BUFFER_BYTES` says otherwise: hundreds of log lines, beside the 64 KiB a
/// Linux pipe holds itself.
pub(crate) const DEFAULT_BUFFER_BYTES: usize = 64 << 10;
/// The environment variable that sets the queue's bytes (0: one line waits while the
/// writer is busy, the next is dropped).
pub(crate) const BUFFER_BYTES_VAR: &str = "DDPBENCH_LOG_BUFFER_BYTES";
/// The longest an error, or the end of the process, waits for stderr to take what is
/// queued: a reader that is merely slow gets everything, one that is gone costs this once.
pub(crate) const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// What the writer writes, in order.
enum Item {
    Text(Vec<u8>),
    /// This many log lines were dropped here.
    Dropped(u64),
}

struct State {
    items: VecDeque<Item>,
    /// Bytes of text in `items`.
    bytes: usize,
    /// Log lines dropped since the process started.
    dropped: u64,
    /// Items queued since the start, and items written (or given up on) by the writer:
    /// a caller waits for the writer to pass its item's number.
    queued: u64,
    written: u64,
    /// Starts the notes the writer adds ("ddpbench rank 0").
    label: String,
}

/// A queue drained by one writer thread into one output.
pub(crate) struct Queue {
    state: Mutex<State>,
    /// Wakes the writer: items were queued.
    queued: Condvar,
    /// Wakes waiters: items were written.
    written: Condvar,
    capacity_bytes: usize,
}

impl Queue {
    /// A queue of `capacity_bytes` whose thread writes to `out`.
    pub(crate) fn start(capacity_bytes: usize, out: Box<dyn Write + Send>) -> std::io::Result<Arc<Queue>> {
        let q = Arc::new(Queue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                bytes: 0,
                dropped: 0,
                queued: 0,
                written: 0,
                label: "ddpbench".into(),
            }),
            queued: Condvar::new(),
            written: Condvar::new(),
            capacity_bytes,
        });
        let writer = Arc::clone(&q);
        std::thread::Builder::new()
            .name("stderr".into())
            .spawn(move || writer.write_all_to(out))?;
        Ok(q)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned one is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a log line, or drops and counts it when the queue is full. Returns whether
    /// it was queued.
    pub(crate) fn line(&self, text: Vec<u8>) -> bool {
        let mut s = self.lock();
        if self.has_room(&s, text.len()) {
            self.push(&mut s, text);
            return true;
        }
        s.dropped += 1;
        match s.items.back_mut() {
            Some(Item::Dropped(n)) => *n += 1,
            _ => {
                s.items.push_back(Item::Dropped(1));
                s.queued += 1;
                self.queued.notify_one();
            }
        }
        false
    }

    /// Queues a redraw of the bars, or drops it when the queue is full.
    pub(crate) fn frame(&self, text: Vec<u8>) {
        let mut s = self.lock();
        if self.has_room(&s, text.len()) {
            self.push(&mut s, text);
        }
    }

    /// Queues `text` whatever the queue holds and waits until it is written, `wait` at
    /// most. Returns whether it was written.
    pub(crate) fn say(&self, text: Vec<u8>, wait: Duration) -> bool {
        let mut s = self.lock();
        let mine = self.push(&mut s, text);
        self.wait_for(s, mine, wait)
    }

    /// Queues the count of lines dropped in all (when any were) and waits until
    /// everything queued is written, `wait` at most. Returns whether it all was.
    pub(crate) fn finish(&self, wait: Duration) -> bool {
        let mut s = self.lock();
        if s.dropped > 0 {
            let note = format!(
                "{}: {} log line(s) dropped in all: stderr was full (nothing read it)\n",
                s.label, s.dropped
            );
            self.push(&mut s, note.into_bytes());
        }
        let last = s.queued;
        self.wait_for(s, last, wait)
    }

    /// Waits until everything queued so far is written, `wait` at most.
    pub(crate) fn drain(&self, wait: Duration) -> bool {
        let s = self.lock();
        let last = s.queued;
        self.wait_for(s, last, wait)
    }

    pub(crate) fn lines_dropped(&self) -> u64 {
        self.lock().dropped
    }

    pub(crate) fn set_label(&self, label: &str) {
        self.lock().label = label.to_string();
    }

    /// Whether `bytes` more fit: within the capacity, or the first text waiting (however
    /// long, so a capacity of 0 still lets the writer take one line at a time).
    fn has_room(&self, s: &State, bytes: usize) -> bool {
        s.bytes == 0 || s.bytes + bytes <= self.capacity_bytes
    }

    /// Queues `text`; returns its number.
    fn push(&self, s: &mut State, text: Vec<u8>) -> u64 {
        s.bytes += text.len();
        s.items.push_back(Item::Text(text));
        s.queued += 1;
        self.queued.notify_one();
        s.queued
    }

    fn wait_for(&self, mut s: MutexGuard<'_, State>, item: u64, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        while s.written < item {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self.written.wait_timeout(s, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    /// The writer thread: takes everything queued, writes it with one call, and again.
    fn write_all_to(&self, mut out: Box<dyn Write + Send>) {
        let mut batch = Vec::new();
        loop {
            let taken = {
                let mut s = self.lock();
                while s.items.is_empty() {
                    s = self.queued.wait(s).unwrap_or_else(|p| p.into_inner());
                }
                batch.clear();
                let taken = s.items.len() as u64;
                let items = std::mem::take(&mut s.items);
                for item in items {
                    match item {
                        Item::Text(t) => batch.extend_from_slice(&t),
                        Item::Dropped(n) => batch.extend_from_slice(
                            format!("{}: {n} log line(s) dropped here: stderr was full (nothing read it)\n", s.label).as_bytes(),
                        ),
                    }
                }
                s.bytes = 0;
                taken
            };
            // Blocks while nobody reads; callers meanwhile queue or drop, never wait.
            let _ = out.write_all(&batch).and_then(|_| out.flush());
            let mut s = self.lock();
            s.written += taken;
            self.written.notify_all();
        }
    }
}

/// The queue in front of this process's stderr (None when its thread could not start).
static QUEUE: OnceLock<Option<Arc<Queue>>> = OnceLock::new();

/// The queue, started on first use.
fn queue() -> Option<&'static Arc<Queue>> {
    QUEUE
        .get_or_init(|| Queue::start(buffer_bytes(), Box::new(std::io::stderr())).ok())
        .as_ref()
}

/// The queue, when something was queued already (a process that logged nothing starts
/// no thread at its end).
fn started() -> Option<&'static Arc<Queue>> {
    QUEUE.get().and_then(Option::as_ref)
}

/// The queue's bytes: [`BUFFER_BYTES_VAR`] when it holds a number, else [`DEFAULT_BUFFER_BYTES`].
pub(crate) fn buffer_bytes() -> usize {
    std::env::var(BUFFER_BYTES_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_BUFFER_BYTES)
}

/// Queues one log line (its bytes end in a newline), dropped and counted when the queue
/// is full. Written straight to stderr only when no writer thread could be started.
pub(crate) fn line(text: Vec<u8>) {
    match queue() {
        Some(q) => {
            q.line(text);
        }
        None => {
            let _ = std::io::stderr().write_all(&text);
        }
    }
}

/// Queues one redraw of the progress bars, dropped when the queue is full.
pub(crate) fn frame(text: Vec<u8>) {
    match queue() {
        Some(q) => q.frame(text),
        None => {
            let _ = std::io::stderr().write_all(&text);
        }
    }
}

/// Says `message` (one line, without its newline) on stderr after everything queued
/// before it, never dropped, waiting [`DRAIN_WAIT`] at most for it to be written.
pub fn say(message: &str) {
    let text = format!("{message}\n").into_bytes();
    match queue() {
        Some(q) => {
            q.say(text, DRAIN_WAIT);
        }
        None => {
            let _ = std::io::stderr().write_all(&text);
        }
    }
}

/// Waits until what is queued is written, [`DRAIN_WAIT`] at most.
pub(crate) fn drain() {
    if let Some(q) = started() {
        q.drain(DRAIN_WAIT);
    }
}

/// Before the process ends: says how many log lines were dropped (when any were) and
/// waits until the queue is written, [`DRAIN_WAIT`] at most.
pub fn finish() {
    if let Some(q) = started() {
        q.finish(DRAIN_WAIT);
    }
}

/// Log lines dropped so far because stderr was full.
pub(crate) fn lines_dropped() -> u64 {
    started().map_or(0, |q| q.lines_dropped())
}

/// Starts the notes the writer adds about dropped lines (e.g. "ddpbench rank 3").
pub(crate) fn set_label(label: &str) {
    if let Some(q) = queue() {
        q.set_label(label);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// An output that takes nothing until opened: a pipe nobody reads, then read.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, Condvar)>,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Gate {
        fn open(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }
        fn text(&self) -> String {
            String::from_utf8(self.out.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut open = self.open.0.lock().unwrap();
            while !*open {
                open = self.open.1.wait(open).unwrap();
            }
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A queue whose writer has taken `first` and is blocked writing it.
    fn blocked(capacity: usize, first: &str) -> (Arc<Queue>, Gate) {
        let gate = Gate::default();
        let q = Queue::start(capacity, Box::new(gate.clone())).unwrap();
        q.line(first.as_bytes().to_vec());
        let start = Instant::now();
        while !q.lock().items.is_empty() {
            assert!(start.elapsed() < Duration::from_secs(10), "the writer never took the first line");
            std::thread::sleep(Duration::from_millis(1));
        }
        (q, gate)
    }

    /// Runs `f` on another thread; fails when it has not returned in 10 s (it blocked).
    fn returns(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the caller blocked on a full output");
    }

    #[test]
    fn a_full_queue_drops_and_counts_lines_and_says_where_they_went_missing() {
        let (q, gate) = blocked(100, "first\n");
        let q2 = Arc::clone(&q);
        // 8 bytes a line: 12 fit in 100 bytes, the other 38 are dropped.
        returns(move || {
            (0..50).for_each(|i| {
                q2.line(format!("line {i:02}\n").into_bytes());
            })
        });
        assert_eq!(q.lines_dropped(), 38);
        gate.open();
        assert!(q.drain(Duration::from_secs(10)));
        let kept: String = (0..12).map(|i| format!("line {i:02}\n")).collect();
        assert_eq!(
            gate.text(),
            format!("first\n{kept}ddpbench: 38 log line(s) dropped here: stderr was full (nothing read it)\n")
        );
        // Once read again, lines pass; the end says the total.
        q.set_label("ddpbench rank 0");
        assert!(q.line(b"after\n".to_vec()));
        assert!(q.finish(Duration::from_secs(10)));
        assert!(
            gate.text()
                .ends_with("after\nddpbench rank 0: 38 log line(s) dropped in all: stderr was full (nothing read it)\n"),
            "{}",
            gate.text()
        );
    }

    #[test]
    fn an_error_is_never_dropped_and_waits_a_bounded_time() {
        let (q, gate) = blocked(16, "first\n");
        let q2 = Arc::clone(&q);
        returns(move || {
            for _ in 0..10 {
                q2.line(b"0123456789\n".to_vec());
                q2.frame(b"\r[=====>    ]".to_vec());
            }
            // Nothing reads: the error waits its bound, then the caller goes on.
            assert!(!q2.say(b"Error: the one message\n".to_vec(), Duration::from_millis(200)));
        });
        assert_eq!(q.lines_dropped(), 9, "one line waits, nine are dropped; frames are not counted");
        gate.open();
        assert!(q.drain(Duration::from_secs(10)));
        assert_eq!(
            gate.text(),
            "first\n0123456789\nddpbench: 9 log line(s) dropped here: stderr was full (nothing read it)\nError: the one message\n"
        );
    }

    #[test]
    fn finishing_without_drops_adds_nothing() {
        let gate = Gate::default();
        gate.open();
        let q = Queue::start(1 << 10, Box::new(gate.clone())).unwrap();
        q.line(b"one\n".to_vec());
        assert!(q.finish(Duration::from_secs(10)));
        assert_eq!(gate.text(), "one\n");
    }
}
