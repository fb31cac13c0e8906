//! The collective watchdog. Every rank runs a thread beside training that keeps working
//! while the rank is blocked inside MPI (or waiting for NCCL): it reads the rank's
//! flight recorder ([`crate::flight`]) and reports it once a second to rank 0's watchdog
//! over a TCP connection of its own ([`channel`]: rank 0 listens on an ephemeral port
//! of the addresses its peers use, and MPI broadcasts those with a secret made for the
//! job, which every connection must prove it holds; no shared file system is needed,
//! and MPI stays at MPI_THREAD_SERIALIZED). Rank 0 thus knows where every rank is, and
//! nothing outside the job can tell it otherwise.
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

pub mod channel;

use super::signals;
use crate::flight::{self, FlightDump, RankStatus};
use crate::record::{self, EndRecord, Manifest, RunStatus};
use crate::world::{broadcast_string, gather_strings, Group};
use channel::{Hub, NetIdentity, Secret, Uplink};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
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
pub struct WatchdogRun {
    pub dir: PathBuf,
    pub run_id: String,
}

struct Shared {
    rank: usize,
    host: String,
    size: usize,
    limit_bits: AtomicU64,
    stop: AtomicBool,
    run: Mutex<Option<WatchdogRun>>,
    /// Where flight records go while no run is open (a study's folder between points).
    flight_dir: Mutex<Option<PathBuf>>,
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
    /// Closed by the watchdog's thread when it ends.
    done: Option<mpsc::Receiver<()>>,
}

/// How long dropping a watchdog waits for its thread: the job's exit never waits on
/// the channel longer than this.
const STOP_WAIT: Duration = Duration::from_secs(1);

impl Watchdog {
    /// Starts the watchdog of every rank of `g` (a collective: rank 0's addresses and
    /// the job's secret are broadcast), with a first limit of `limit_s` seconds in one
    /// collective.
    pub fn start(g: &Group, limit_s: f64) -> Watchdog {
        let (hub, view) = rendezvous(g);
        let shared = Arc::new(Shared {
            rank: g.rank,
            host: g.host.clone(),
            size: g.size,
            limit_bits: AtomicU64::new(limit_s.to_bits()),
            stop: AtomicBool::new(false),
            run: Mutex::new(None),
            flight_dir: Mutex::new(None),
            steps: AtomicU64::new(0),
        });
        let link = match (hub, view) {
            (Some(hub), _) => Link::Root(Root::new(hub, g.size)),
            (None, Some((secret, addrs))) if g.rank != 0 => Link::Member(Member::connect(g.rank, secret, addrs)),
            _ => Link::Alone,
        };
        let s = shared.clone();
        let (tx, rx) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new().name("ddpbench-watchdog".into()).spawn(move || {
            let _done = tx;
            watch(s, link)
        });
        Watchdog {
            shared,
            done: spawned.ok().map(|_| rx),
        }
    }

    /// Seconds a collective may take before the job is declared hung.
    pub fn set_limit(&self, limit_s: f64) {
        self.shared.limit_bits.store(limit_s.to_bits(), Ordering::Relaxed);
    }

    pub fn limit_s(&self) -> f64 {
        self.shared.limit_s()
    }

    /// Where flight and end records go.
    pub fn set_run(&self, run: WatchdogRun) {
        *self.shared.run.lock().unwrap_or_else(|p| p.into_inner()) = Some(run);
    }

    /// The run has ended and its records are written: a later verdict leaves them as
    /// they are (a finished study point stays finished whatever hangs after it).
    pub fn end_run(&self) {
        *self.shared.run.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Where flight records go when no run is open.
    pub fn set_flight_dir(&self, dir: PathBuf) {
        *self.shared.flight_dir.lock().unwrap_or_else(|p| p.into_inner()) = Some(dir);
    }

    /// Steps completed so far (for an end record the watchdog may have to write).
    pub fn set_steps(&self, steps: usize) {
        self.shared.steps.store(steps as u64, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // The thread ends within a tick; whatever holds it, the job does not wait longer.
        if let Some(done) = self.done.take() {
            let _ = done.recv_timeout(STOP_WAIT);
        }
    }
}

/// The secret and rank 0's listening addresses, agreed over MPI: rank 0 learns where
/// every rank is, listens only where they can reach it, and broadcasts
/// `secret;addr,addr`. Returns rank 0's hub, or this rank's view of the job.
fn rendezvous(g: &Group) -> (Option<Hub>, Option<(Arc<Secret>, Vec<SocketAddr>)>) {
    let me = NetIdentity::here(&g.host);
    let identities = gather_strings(g, &serde_json::to_string(&me).unwrap_or_default());
    let mut hub = None;
    let mut said = String::new();
    if let Some(all) = identities {
        let peers: Vec<NetIdentity> = all.iter().skip(1).filter_map(|t| serde_json::from_str(t).ok()).collect();
        match open_hub(g.size, &me, &peers) {
            Ok((h, secret, addrs)) => {
                let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
                tracing::info!(
                    "the watchdog listens on {} for {} rank(s) (authenticated channel v{})",
                    list.join(", "),
                    g.size - 1,
                    channel::VERSION
                );
                said = format!("{};{}", secret.to_hex(), list.join(","));
                hub = Some(h);
            }
            Err(e) => tracing::warn!("the watchdog of rank 0 cannot listen ({e}); each rank judges a hang by its own wait"),
        }
    }
    let said = broadcast_string(g, &said);
    let view = said.split_once(';').and_then(|(secret, addrs)| {
        let secret = Arc::new(Secret::from_hex(secret)?);
        let addrs = addrs.split(',').filter_map(|a| a.parse().ok()).collect();
        Some((secret, addrs))
    });
    (hub, view)
}

fn open_hub(size: usize, me: &NetIdentity, peers: &[NetIdentity]) -> std::io::Result<(Hub, Arc<Secret>, Vec<SocketAddr>)> {
    let secret = Arc::new(Secret::generate()?);
    let (hub, addrs) = Hub::bind(&channel::listen_addresses(me, peers), secret.clone(), size)?;
    Ok((hub, secret, addrs))
}

enum Link {
    Root(Root),
    Member(Member),
    Alone,
}

/// Rank 0's view: every rank's last report and when it came.
struct Root {
    hub: Hub,
    reports: Vec<Option<(RankStatus, Instant)>>,
}

/// Refusals logged before the watchdog stops naming each one.
const REFUSALS_LOGGED: u64 = 3;

impl Root {
    fn new(hub: Hub, size: usize) -> Root {
        Root {
            hub,
            reports: vec![None; size],
        }
    }

    fn poll(&mut self) {
        let got = self.hub.poll();
        let before = self.hub.refused - got.refused.len() as u64;
        for (k, why) in got.refused.iter().enumerate() {
            let n = before + k as u64 + 1;
            if n <= REFUSALS_LOGGED {
                let more = if n == REFUSALS_LOGGED {
                    "; further refusals are not logged"
                } else {
                    ""
                };
                tracing::warn!("the watchdog refused a connection ({why}){more}");
            }
        }
        let mut answered = Vec::new();
        for (rank, body) in got.lines {
            let Some(json) = body.strip_prefix("report ") else { continue };
            // The report must be of the rank that authenticated, with times that can be.
            match serde_json::from_str::<RankStatus>(json) {
                Ok(st) if st.rank == rank && st.waited_s.is_finite() && st.waited_s >= 0.0 => {
                    self.reports[rank] = Some((st, Instant::now()));
                    if !answered.contains(&rank) {
                        answered.push(rank);
                    }
                }
                _ => tracing::debug!("watchdog: ignored a malformed report on rank {rank}'s connection"),
            }
        }
        for rank in answered {
            self.hub.send(rank, "ack");
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
        self.hub.send_all(&format!("abort\t{message}"));
    }
}

/// A rank's link to rank 0 (None while broken; it is made again every few seconds).
struct Member {
    up: Option<Uplink>,
    secret: Arc<Secret>,
    addrs: Vec<SocketAddr>,
    last_try: Instant,
    last_sent: Option<Instant>,
    last_ack: Instant,
}

/// How often a rank whose link broke tries to make it again.
const RECONNECT: Duration = Duration::from_secs(5);

impl Member {
    fn connect(rank: usize, secret: Arc<Secret>, addrs: Vec<SocketAddr>) -> Member {
        let up = match Uplink::connect(&addrs, secret.clone(), rank) {
            Ok(u) => Some(u),
            Err(e) => {
                tracing::warn!("watchdog: cannot reach rank 0's watchdog ({e}); a hang is reported from this rank's own wait until it can");
                None
            }
        };
        Member {
            up,
            secret,
            addrs,
            last_try: Instant::now(),
            last_sent: None,
            last_ack: Instant::now(),
        }
    }

    /// Sends this rank's status once a second and returns rank 0's lines.
    fn exchange(&mut self, rank: usize, own: &RankStatus) -> Vec<String> {
        if self.up.as_ref().is_some_and(|u| u.closed().is_some()) {
            self.up = None;
        }
        if self.up.is_none() && self.last_try.elapsed() > RECONNECT {
            self.last_try = Instant::now();
            self.up = Uplink::connect(&self.addrs, self.secret.clone(), rank).ok();
        }
        let Some(up) = self.up.as_mut() else { return Vec::new() };
        if self.last_sent.is_none_or(|t| t.elapsed() >= HEARTBEAT) {
            if let Ok(json) = serde_json::to_string(own) {
                up.send(&format!("report {json}"));
            }
            self.last_sent = Some(Instant::now());
        }
        up.receive()
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
    root.poll();
    let statuses = root.statuses(own);
    // A rank sitting out a study point waits there by design: only the others hang.
    let hung = statuses.iter().any(|st| {
        !st.idle
            && st.silent_s == 0.0
            && st.pending.as_ref().is_some_and(|p| p.state == flight::State::Started)
            && st.waited_s > s.limit_s()
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
    for line in m.exchange(s.rank, &own) {
        if line == "ack" {
            m.last_ack = Instant::now();
        } else if let Some(msg) = line.strip_prefix("abort\t") {
            return Some(Verdict::FromRoot(msg.to_string()));
        }
    }
    let silent = m.last_ack.elapsed();
    let (pending, waited) = (own.pending.as_ref()?, own.waited_s);
    if own.idle {
        return None;
    }
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
    (!own.idle && pending.state == flight::State::Started && own.waited_s > s.limit_s()).then(|| {
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
    let flight_dir = match &run {
        Some(run) => Some(run.dir.clone()),
        None => s.flight_dir.lock().unwrap_or_else(|p| p.into_inner()).clone(),
    };
    if let Some(dir) = &flight_dir {
        let mut dump = FlightDump::here(s.rank, &s.host, message);
        if let Link::Root(root) = link {
            dump.known = root.statuses(dump.status.clone()).into_iter().skip(1).collect();
        }
        let _ = dump.write(dir);
        if s.rank == 0 {
            eprintln!("flight records: ddpbench diagnose {}", dir.display());
        }
    }
    if let Some(run) = &run {
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
            mark_manifest(run, RunStatus::Failed, &format!("watchdog: {message}"));
        }
    }
    // Let the other ranks write their records before the job is torn down.
    std::thread::sleep(Duration::from_millis(1500));
    // A rank blocked inside NCCL returns only once its communicators are aborted.
    crate::device::cuda::abort_all();
    super::abort_job(3)
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

fn mark_manifest(run: &WatchdogRun, status: RunStatus, why: &str) {
    if let Ok(mut m) = Manifest::read(&run.dir) {
        m.status = status.as_str().into();
        m.error = Some(why.to_string());
        m.end_utc = Some(record::rfc3339_utc(SystemTime::now()));
        let _ = m.write(&run.dir);
    }
}
