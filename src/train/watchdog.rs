//! The collective watchdog. Every rank runs a thread beside training that keeps working
//! while the rank is blocked inside MPI (or waiting for NCCL): it reads the rank's
//! flight recorder ([`crate::flight`]) and reports it once a second to rank 0's watchdog
//! over a TCP connection of its own (rank 0 listens on an ephemeral port whose
//! addresses MPI broadcasts at start-up; no shared file system is needed, and MPI stays
//! at MPI_THREAD_SERIALIZED). Rank 0 thus knows where every rank is.
//!
//! When a rank has waited in a collective longer than the limit, rank 0 names the ranks
//! that never entered it (or went silent), tells every rank to write
//! `rank-NNNNN.flight.json`, prints one message and aborts the job (MPI_Abort), so no
//! allocation burns. If rank 0 itself is the one that stopped, the others notice that
//! it no longer answers and do the same. A rank that cannot reach rank 0 judges by its
//! own wait alone. `ddpbench diagnose RUN_DIR` reads the flight files afterwards.
//!
//! The watchdog also finishes the bookkeeping of a stop signal that arrives while the
//! rank is held inside a collective (a peer died): it records the rank's end at once,
//! since the job may be killed before the step could end.

use super::signals;
use crate::flight::{self, FlightDump, RankStatus};
use crate::record::{self, EndRecord, Manifest, RunStatus};
use crate::world::{broadcast_string, Group};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// The default limit while setting up (loading a large data set can take long).
pub const SETUP_LIMIT_S: f64 = 1800.0;
/// The default limit during the warm-up steps (first kernels, autotuning).
pub const WARMUP_LIMIT_S: f64 = 600.0;
/// After warm-up the default limit is this many median steps...
pub const STEPS_LIMIT: f64 = 50.0;
/// ...and at least this many seconds.
pub const MIN_LIMIT_S: f64 = 60.0;

const TICK: Duration = Duration::from_millis(250);
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A rank not heard from for this long is silent.
const SILENT_AFTER: Duration = Duration::from_secs(4);

/// The run a watchdog writes its files into, once known.
#[derive(Debug, Clone)]
pub struct RunFiles {
    pub dir: PathBuf,
    pub run_id: String,
}

struct Shared {
    rank: usize,
    host: String,
    size: usize,
    limit_bits: AtomicU64,
    stop: AtomicBool,
    run: Mutex<Option<RunFiles>>,
    /// Steps completed, for an end record written by the watchdog.
    steps: AtomicU64,
}

impl Shared {
    fn limit_s(&self) -> f64 {
        f64::from_bits(self.limit_bits.load(Ordering::Relaxed))
    }
}

/// A running watchdog; stops when dropped.
pub struct Watchdog {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the watchdog of every rank of `g` (a collective: rank 0's address is
    /// broadcast), with a first limit of `limit_s` seconds in one collective.
    pub fn start(g: &Group, limit_s: f64) -> Watchdog {
        let listener = if g.rank == 0 { listen() } else { None };
        let address = listener.as_ref().map(|(_, a)| a.clone()).unwrap_or_default();
        let address = broadcast_string(g, &address);
        let shared = Arc::new(Shared {
            rank: g.rank,
            host: g.host.clone(),
            size: g.size,
            limit_bits: AtomicU64::new(limit_s.to_bits()),
            stop: AtomicBool::new(false),
            run: Mutex::new(None),
            steps: AtomicU64::new(0),
        });
        let link = match listener {
            Some((l, _)) => Link::Root(Root::new(l)),
            None => match connect(&address) {
                Some(s) => Link::Member(Member::new(s)),
                None => {
                    tracing::warn!(
                        "watchdog: cannot reach rank 0's watchdog at {address:?}; a hang is reported from this rank's own wait only"
                    );
                    Link::Alone
                }
            },
        };
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("ddpbench-watchdog".into())
            .spawn(move || watch(s, link))
            .ok();
        Watchdog { shared, handle }
    }

    /// Seconds a collective may take before the job is declared hung.
    pub fn set_limit(&self, limit_s: f64) {
        self.shared.limit_bits.store(limit_s.to_bits(), Ordering::Relaxed);
    }

    pub fn limit_s(&self) -> f64 {
        self.shared.limit_s()
    }

    /// Where flight and end records go.
    pub fn set_run(&self, run: RunFiles) {
        *self.shared.run.lock().unwrap_or_else(|p| p.into_inner()) = Some(run);
    }

    /// Steps completed so far (for an end record the watchdog may have to write).
    pub fn set_steps(&self, steps: usize) {
        self.shared.steps.store(steps as u64, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Rank 0's listener on an ephemeral port, and `ip1,ip2,...;port` (loopback last).
fn listen() -> Option<(TcpListener, String)> {
    let l = TcpListener::bind(("0.0.0.0", 0)).ok()?;
    l.set_nonblocking(true).ok()?;
    let port = l.local_addr().ok()?.port();
    let mut ips = interface_ipv4s();
    ips.push("127.0.0.1".into());
    Some((l, format!("{};{port}", ips.join(","))))
}

/// The node's IPv4 addresses other than loopback.
fn interface_ipv4s() -> Vec<String> {
    let mut out = Vec::new();
    // SAFETY: getifaddrs fills a list that freeifaddrs releases; entries are read only
    // while the list lives, and sockaddr is read as sockaddr_in only for AF_INET.
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut p = list;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            if !a.is_null() && i32::from((*a).sa_family) == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() {
                    out.push(ip.to_string());
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out
}

/// Connects to the first of rank 0's addresses that answers.
fn connect(address: &str) -> Option<TcpStream> {
    let (ips, port) = address.split_once(';')?;
    for ip in ips.split(',') {
        let Some(addr) = (ip, port.parse::<u16>().ok()?).to_socket_addrs().ok().and_then(|mut a| a.next()) else {
            continue;
        };
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            let _ = s.set_nonblocking(true);
            let _ = s.set_nodelay(true);
            return Some(s);
        }
    }
    None
}

/// Newline-framed messages on a non-blocking stream.
struct Lines {
    stream: TcpStream,
    buf: Vec<u8>,
    closed: bool,
}

impl Lines {
    fn new(stream: TcpStream) -> Lines {
        Lines {
            stream,
            buf: Vec::new(),
            closed: false,
        }
    }

    /// The complete lines received so far.
    fn read(&mut self) -> Vec<String> {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.closed = true;
                    break;
                }
            }
        }
        let mut lines = Vec::new();
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            lines.push(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
        }
        lines
    }

    fn send(&mut self, line: &str) {
        // Small messages on a socket with room: a short write is not retried (the next
        // heartbeat follows within a second).
        let mut msg = line.replace('\n', " ");
        msg.push('\n');
        if self.stream.write_all(msg.as_bytes()).is_err() {
            self.closed = true;
        }
    }
}

enum Link {
    Root(Root),
    Member(Member),
    Alone,
}

/// Rank 0's view: every rank's last report and when it came.
struct Root {
    listener: TcpListener,
    peers: Vec<Lines>,
    reports: Vec<Option<(RankStatus, Instant)>>,
}

impl Root {
    fn new(listener: TcpListener) -> Root {
        Root {
            listener,
            peers: Vec::new(),
            reports: Vec::new(),
        }
    }

    fn poll(&mut self, size: usize) {
        while let Ok((s, _)) = self.listener.accept() {
            let _ = s.set_nonblocking(true);
            let _ = s.set_nodelay(true);
            self.peers.push(Lines::new(s));
        }
        self.reports.resize(size, None);
        for p in self.peers.iter_mut() {
            let lines = p.read();
            for line in &lines {
                if let Ok(st) = serde_json::from_str::<RankStatus>(line) {
                    let r = st.rank;
                    if r < size {
                        self.reports[r] = Some((st, Instant::now()));
                    }
                }
            }
            if !lines.is_empty() {
                p.send("ack");
            }
        }
    }

    /// Every rank's status as rank 0 knows it now: fresh reports as they are (their
    /// waits grown by their age), old ones marked silent.
    fn statuses(&self, own: RankStatus) -> Vec<RankStatus> {
        let mut out = vec![own];
        for (st, at) in self.reports.iter().skip(1).flatten() {
            let age = at.elapsed();
            let mut st = st.clone();
            if age > SILENT_AFTER {
                st.silent_s = age.as_secs_f64();
            } else if st.pending.is_some() {
                st.waited_s += age.as_secs_f64();
            }
            out.push(st);
        }
        out
    }

    fn abort_all(&mut self, message: &str) {
        for p in self.peers.iter_mut() {
            p.send(&format!("abort\t{message}"));
        }
    }
}

/// A rank's link to rank 0.
struct Member {
    lines: Lines,
    last_sent: Option<Instant>,
    last_ack: Instant,
}

impl Member {
    fn new(stream: TcpStream) -> Member {
        Member {
            lines: Lines::new(stream),
            last_sent: None,
            last_ack: Instant::now(),
        }
    }
}

fn watch(s: Arc<Shared>, mut link: Link) {
    let mut signal_recorded = false;
    while !s.stop.load(Ordering::Relaxed) {
        std::thread::sleep(TICK);
        let own = RankStatus::here(s.rank, &s.host);
        if !signal_recorded {
            signal_recorded = record_signal_while_held(&s, &own);
        }
        if let Some(e) = crate::device::cuda::async_error() {
            give_up(&s, &mut link, Verdict::Own(format!("rank {} on {}: {e}", s.rank, s.host)));
        }
        let verdict = match &mut link {
            Link::Root(root) => judge_as_root(&s, root, own).map(Verdict::Own),
            Link::Member(m) => judge_as_member(&s, m, own),
            Link::Alone => judge_alone(&s, &own).map(Verdict::Own),
        };
        if let Some(v) = verdict {
            give_up(&s, &mut link, v);
        }
    }
}

/// Rank 0: collects the reports and decides when a collective has hung.
fn judge_as_root(s: &Shared, root: &mut Root, own: RankStatus) -> Option<String> {
    root.poll(s.size);
    let statuses = root.statuses(own);
    let hung = statuses.iter().any(|st| {
        st.silent_s == 0.0 && st.pending.as_ref().is_some_and(|p| p.state == flight::State::Started) && st.waited_s > s.limit_s()
    });
    if !hung {
        return None;
    }
    let d = flight::diagnose(&statuses, s.size)?;
    Some(d.message())
}

/// A watchdog's conclusion: its own (printed by it) or rank 0's (printed by rank 0).
enum Verdict {
    Own(String),
    FromRoot(String),
}

/// Other ranks: report to rank 0, obey its verdict, and act alone when it is silent.
fn judge_as_member(s: &Shared, m: &mut Member, own: RankStatus) -> Option<Verdict> {
    if m.last_sent.is_none_or(|t| t.elapsed() >= HEARTBEAT) {
        if let Ok(line) = serde_json::to_string(&own) {
            m.lines.send(&line);
        }
        m.last_sent = Some(Instant::now());
    }
    for line in m.lines.read() {
        if line == "ack" {
            m.last_ack = Instant::now();
        } else if let Some(msg) = line.strip_prefix("abort\t") {
            return Some(Verdict::FromRoot(msg.to_string()));
        }
    }
    let silent = m.last_ack.elapsed();
    let (pending, waited) = (own.pending.as_ref()?, own.waited_s);
    if silent > SILENT_AFTER && waited > s.limit_s() + SILENT_AFTER.as_secs_f64() {
        return Some(Verdict::Own(format!(
            "rank 0's watchdog has not answered for {:.0} s (rank 0 stopped or its node is gone); rank {} on {} waited {waited:.0} s in {}",
            silent.as_secs_f64(),
            s.rank,
            s.host,
            pending.describe()
        )));
    }
    None
}

/// Without a link to rank 0: only this rank's own wait counts.
fn judge_alone(s: &Shared, own: &RankStatus) -> Option<String> {
    let pending = own.pending.as_ref()?;
    (pending.state == flight::State::Started && own.waited_s > s.limit_s()).then(|| {
        format!(
            "rank {} on {} waited {:.0} s in {}; which rank is missing is unknown (no link to rank 0's watchdog)",
            s.rank,
            s.host,
            own.waited_s,
            pending.describe()
        )
    })
}

/// The verdict: write this rank's flight record, pass the word on (rank 0), print it
/// once (the rank that concluded it), and abort the job.
fn give_up(s: &Shared, link: &mut Link, verdict: Verdict) -> ! {
    let run = s.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let message = match &verdict {
        Verdict::Own(m) | Verdict::FromRoot(m) => m.as_str(),
    };
    if let Link::Root(root) = link {
        root.abort_all(message);
    }
    if let Verdict::Own(m) = &verdict {
        eprintln!("watchdog: {m}. Aborting the job");
    }
    if let Some(run) = &run {
        let _ = FlightDump::here(s.rank, &s.host, message).write(&run.dir);
        let end = EndRecord {
            run_id: run.run_id.clone(),
            rank: s.rank,
            host: s.host.clone(),
            status: RunStatus::Failed,
            error: Some(format!("watchdog: {message}")),
            steps: s.steps.load(Ordering::Relaxed) as usize,
            time_utc: record::rfc3339_utc(SystemTime::now()),
        };
        let _ = end.write(&run.dir);
        if s.rank == 0 {
            mark_manifest(&run, RunStatus::Failed, &format!("watchdog: {message}"));
            eprintln!("flight records: ddpbench diagnose {}", run.dir.display());
        }
    }
    // Let the other ranks write their records before the job is torn down.
    std::thread::sleep(Duration::from_millis(1500));
    // A rank blocked inside NCCL returns only once its communicators are aborted.
    crate::device::cuda::abort_all();
    // SAFETY: MPI is initialised (the watchdog starts after it); MPI_Abort ends every
    // rank of the job, which is what a hung collective needs.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, 3);
    }
    std::process::exit(3)
}

/// A stop signal that came while the rank is held inside a collective for more than
/// two seconds: the step cannot end, so the end record (and, on rank 0, the manifest's
/// status) is written now. Returns true once written.
fn record_signal_while_held(s: &Shared, own: &RankStatus) -> bool {
    let Some(sig) = signals::received() else { return false };
    let Some(pending) = own.pending.as_ref().filter(|_| own.waited_s > 2.0) else {
        return false;
    };
    let Some(run) = s.run.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
        return false;
    };
    let why = format!(
        "{} while waiting {:.0} s in {}",
        signals::name(sig),
        own.waited_s,
        pending.describe()
    );
    let end = EndRecord {
        run_id: run.run_id.clone(),
        rank: s.rank,
        host: s.host.clone(),
        status: RunStatus::Interrupted,
        error: Some(why.clone()),
        steps: s.steps.load(Ordering::Relaxed) as usize,
        time_utc: record::rfc3339_utc(SystemTime::now()),
    };
    let _ = end.write(&run.dir);
    if s.rank == 0 {
        mark_manifest(&run, RunStatus::Interrupted, &why);
    }
    true
}

fn mark_manifest(run: &RunFiles, status: RunStatus, why: &str) {
    if let Ok(mut m) = Manifest::read(&run.dir) {
        m.status = status.as_str().into();
        m.error = Some(why.to_string());
        m.end_utc = Some(record::rfc3339_utc(SystemTime::now()));
        let _ = m.write(&run.dir);
    }
}
