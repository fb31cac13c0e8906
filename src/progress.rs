//! Progress bars on the terminal ([`indicatif`]): a bar per epoch of `train`, over the
//! points of a `study`, over the sizes of an `allreduce` sweep, over the samples of
//! `gen-bigmnist`. Only the launcher's rank 0 draws, and only where a person watches:
//! its stderr is a terminal, or (Open MPI hands a rank's stderr to `mpirun` through a
//! pipe) the stderr of the `mpirun` or `orted` that started it on this node is one. A
//! batch job's output file therefore never receives a bar, only the log lines.
//!
//! A terminal whose `TERM` is `dumb` cannot move the cursor: it gets no bar, and with
//! `NO_COLOR` set (<https://no-color.org>) log lines come without colours
//! ([`colours_allowed`]).
//!
//! Every bar of the process sits in one [`MultiProgress`], and log lines go through
//! [`LogWriter`], which hides the bars while a line is written and redraws them after,
//! so the two never share a line. Both reach stderr through [`crate::stderr`]'s queue, so
//! neither ever waits for a terminal or pipe that is not being read.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use std::cell::Cell;
use std::io::{self, IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Redraws per second at most: enough to watch, few bytes through a launcher's pipe.
const REDRAW_HZ: u8 = 5;
/// Columns assumed when the terminal does not tell its width.
const DEFAULT_COLUMNS: u16 = 80;
/// Launchers whose stderr a rank's stderr pipe leads to (Open MPI 4 and 5).
const LAUNCHERS: [&str; 5] = ["mpirun", "mpiexec", "orterun", "orted", "prted"];

/// The bars of this process, made on the first bar shown; None where none is shown.
fn bars() -> Option<&'static MultiProgress> {
    static BARS: OnceLock<Option<MultiProgress>> = OnceLock::new();
    BARS.get_or_init(|| {
        let columns = if crate::world::launcher_rank().unwrap_or(0) == 0 && !dumb_terminal() {
            watched_terminal_columns()
        } else {
            None
        };
        columns.map(|c| {
            let target = Stderr {
                columns: c,
                frame: Mutex::new(Vec::new()),
            };
            MultiProgress::with_draw_target(ProgressDrawTarget::term_like_with_hz(Box::new(target), REDRAW_HZ))
        })
    })
    .as_ref()
}

/// Whether `TERM` names a terminal that understands no escape sequence.
fn dumb_terminal() -> bool {
    std::env::var_os("TERM").is_some_and(|t| t == "dumb")
}

/// Whether log lines on a terminal may be coloured: not with `NO_COLOR` set to anything
/// but the empty string, nor on a dumb terminal.
pub(crate) fn colours_allowed() -> bool {
    !dumb_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The width of the terminal a person reads this process's stderr on, if one does.
fn watched_terminal_columns() -> Option<u16> {
    if io::stderr().is_terminal() {
        return Some(columns_of(libc::STDERR_FILENO));
    }
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let comm = std::fs::read_to_string(format!("/proc/{parent}/comm")).ok()?;
    if !LAUNCHERS.contains(&comm.trim()) {
        return None;
    }
    // The launcher's stderr, opened without becoming this process's controlling terminal.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(format!("/proc/{parent}/fd/2"))
        .ok()?;
    f.is_terminal().then(|| columns_of(std::os::fd::AsRawFd::as_raw_fd(&f)))
}

/// The columns of the terminal open on `fd`.
fn columns_of(fd: libc::c_int) -> u16 {
    // SAFETY: winsize is plain integers, for which all zeros is a valid value.
    let mut w: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize for a terminal descriptor and fails otherwise.
    let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut w) } == 0;
    if ok && w.ws_col > 0 {
        w.ws_col
    } else {
        DEFAULT_COLUMNS
    }
}

/// This process's stderr as indicatif draws on it: ANSI cursor codes written whether or
/// not stderr itself is a terminal (through `mpirun` it is a pipe to one). A redraw is
/// gathered whole and queued at its flush ([`crate::stderr::frame`]), so a redraw that
/// meets a full queue is dropped whole, never cut.
#[derive(Debug)]
struct Stderr {
    columns: u16,
    /// The redraw being gathered.
    frame: Mutex<Vec<u8>>,
}

impl Stderr {
    fn put(&self, s: &str) -> io::Result<()> {
        self.frame.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(s.as_bytes());
        Ok(())
    }

    /// Moves the cursor `n` cells in the direction of ANSI's final byte `dir` (A–D).
    fn cursor(&self, n: usize, dir: char) -> io::Result<()> {
        if n > 0 {
            self.put(&format!("\x1b[{n}{dir}"))?;
        }
        Ok(())
    }
}

impl TermLike for Stderr {
    fn width(&self) -> u16 {
        self.columns
    }
    fn move_cursor_up(&self, n: usize) -> io::Result<()> {
        self.cursor(n, 'A')
    }
    fn move_cursor_down(&self, n: usize) -> io::Result<()> {
        self.cursor(n, 'B')
    }
    fn move_cursor_right(&self, n: usize) -> io::Result<()> {
        self.cursor(n, 'C')
    }
    fn move_cursor_left(&self, n: usize) -> io::Result<()> {
        self.cursor(n, 'D')
    }
    fn write_line(&self, s: &str) -> io::Result<()> {
        self.put(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> io::Result<()> {
        self.put(s)
    }
    fn clear_line(&self) -> io::Result<()> {
        self.put("\r\x1b[2K")
    }
    fn flush(&self) -> io::Result<()> {
        let frame = std::mem::take(&mut *self.frame.lock().unwrap_or_else(|p| p.into_inner()));
        if !frame.is_empty() {
            crate::stderr::frame(frame);
        }
        Ok(())
    }
}

/// The `tracing` writer of log lines: each line is queued whole for stderr
/// ([`crate::stderr::line`]: dropped and counted when stderr is not read), with the bars
/// hidden around it.
#[derive(Clone, Copy, Default)]
pub(crate) struct LogWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogLine;
    fn make_writer(&'a self) -> LogLine {
        LogLine(Vec::new())
    }
}

/// One log event's bytes, written when dropped.
pub(crate) struct LogLine(Vec<u8>);

impl Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        let line = std::mem::take(&mut self.0);
        // Queued between the bars' clearing and their redraw, in the same queue.
        match bars() {
            Some(m) => m.suspend(|| crate::stderr::line(line)),
            None => crate::stderr::line(line),
        }
    }
}

/// Runs `f`, which prints to stdout or stderr itself, with the bars hidden: the
/// clearing is written out first (waiting [`crate::stderr::DRAIN_WAIT`] at most).
pub(crate) fn suspend<R>(f: impl FnOnce() -> R) -> R {
    match bars() {
        Some(m) => m.suspend(|| {
            crate::stderr::drain();
            f()
        }),
        None => f(),
    }
}

/// One bar, shown on rank 0 where a terminal is watched; elsewhere every call does
/// nothing. Cleared from the screen when dropped.
pub(crate) struct Bar {
    bar: Option<ProgressBar>,
    start: Instant,
    /// Samples done over all ranks, for samples/s.
    samples: Cell<u64>,
}

impl Bar {
    /// A bar of `len` steps of `unit` (e.g. "points"), its line starting with `what`.
    pub(crate) fn new(what: &str, len: u64, unit: &str) -> Bar {
        let template = format!("{{prefix}} [{{wide_bar}}] {{pos}}/{{len}} {unit} · {{msg}} · ETA {{eta}}");
        Bar::styled(what, len, &template)
    }

    /// A bar in percent of `len` (samples to write, say).
    pub(crate) fn percent(what: &str, len: u64) -> Bar {
        Bar::styled(what, len, "{prefix} [{wide_bar}] {percent:>3} % · {msg} · ETA {eta}")
    }

    fn styled(what: &str, len: u64, template: &str) -> Bar {
        let bar = bars().map(|m| {
            let style = ProgressStyle::with_template(template)
                .expect("the bar's template is fixed and valid")
                .progress_chars("=> ");
            // The rank in the line: a bar that a rank other than 0 drew would say so.
            let prefix = match crate::world::launcher_rank() {
                Some(r) => format!("rank {r} · {what}"),
                None => what.to_string(),
            };
            let b = m.add(ProgressBar::new(len).with_style(style).with_prefix(prefix).with_message("starting"));
            // Without a tick the ETA and rates of a slow step would freeze between updates.
            b.enable_steady_tick(Duration::from_millis(1000 / u64::from(REDRAW_HZ)));
            b
        });
        Bar {
            bar,
            start: Instant::now(),
            samples: Cell::new(0),
        }
    }

    /// The bar of epoch `epoch` (from 0) of `epochs`, of `steps` steps.
    pub(crate) fn epoch(epoch: usize, epochs: usize, steps: usize) -> Bar {
        Bar::new(&format!("epoch {}/{epochs}", epoch + 1), steps as u64, "steps")
    }

    /// Whether the bar is drawn.
    pub(crate) fn shown(&self) -> bool {
        self.bar.is_some()
    }

    /// `done` steps of the epoch measured, the last of `samples` samples over all ranks
    /// with loss `loss`: steps/s, samples/s and the loss on the bar.
    pub(crate) fn step(&self, done: usize, samples: u64, loss: f64) {
        let Some(b) = &self.bar else { return };
        self.samples.set(self.samples.get() + samples);
        let s = self.start.elapsed().as_secs_f64().max(1e-9);
        // Position first: each call may redraw, and the next one may be rate-limited.
        b.set_position(done as u64);
        b.set_message(format!(
            "{:.2} steps/s · {:.0} samples/s · loss {loss:.4}",
            done as f64 / s,
            self.samples.get() as f64 / s
        ));
    }

    /// `done` of the bar's length reached; `msg` says what follows it on the line.
    pub(crate) fn set(&self, done: u64, msg: impl Into<String>) {
        if let Some(b) = &self.bar {
            b.set_position(done);
            b.set_message(msg.into());
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let (Some(b), Some(m)) = (self.bar.take(), bars()) {
            b.finish_and_clear();
            m.remove(&b);
        }
    }
}
