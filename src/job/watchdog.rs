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
//! It also watches progress outside collectives: a rank whose main thread stays in one
//! phase of a step (forward, backward, data loading...) or of the teardown longer than
//! the limit is named with that phase ([`hang::stalled`]), although no collective is
//! pending (a forward pass that never returns, on every rank or on a job's only one).
//!
//! It covers the job through its end: MPI_Finalize is watched as a collective, and after
//! it rank 0 waits until every rank it heard from is past MPI_Finalize too
//! ([`Watchdog::meet_at_exit`]), so a rank that stalls in teardown is named and the job
//! ends (exit status 3) instead of leaving `mpirun` waiting. Once a run's records are
//! final ([`Watchdog::records_final`]) a later verdict leaves them as they are.
//!
//! The watchdog also finishes the bookkeeping of a stop signal that arrives while the
//! rank is held inside a collective (a peer died): it records the rank's end at once,
//! since the job may be killed before the step could end.

pub(crate) mod channel;

use super::abort::abort_job;
use super::signals;
use crate::flight;
use crate::flight::hang::{self, FlightDump, RankStatus};
use crate::record::{self, EndRecord, Manifest, RunStatus};
use crate::world::{broadcast_string, gather_strings, Group};
use channel::{Hub, NetIdentity, Secret, Uplink};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The default limit while setting up (loading a large data set can take long).
pub(crate) const SETUP_LIMIT_S: f64 = 1800.0;
/// The default limit during the warm-up steps (first kernels, autotuning).
pub(crate) const WARMUP_LIMIT_S: f64 = 600.0;
/// After warm-up the default limit is this many median steps...
pub(crate) const STEPS_LIMIT: f64 = 50.0;
/// ...and at least this many seconds.
pub(crate) const MIN_LIMIT_S: f64 = 60.0;
/// The default limit in the job's teardown, after its last collective: closing files,
/// MPI_Finalize, and every rank past it.
pub(crate) const TEARDOWN_LIMIT_S: f64 = 300.0;

const TICK: Duration = Duration::from_millis(250);
/// Rank 0's tick while the ranks join: each rank's handshake takes two of rank 0's
/// polls, and its start waits for them.
const JOIN_TICK: Duration = Duration::from_millis(5);
/// Rank 0 ticks at `JOIN_TICK` for at most this long after it starts, however many ranks
/// have not joined: a rank that reconnects later, or a stranger's connection, is
/// answered at `TICK`.
const JOIN_WINDOW: Duration = Duration::from_secs(30);
/// The tick while the job exits, so that meeting at the exit costs the job little time.
const EXIT_TICK: Duration = Duration::from_millis(20);
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A rank not heard from for this long is silent.
const SILENT_AFTER: Duration = Duration::from_secs(4);

/// The run a watchdog writes its files into, once known.
#[derive(Debug, Clone)]
pub(crate) struct WatchdogRun {
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
    /// True once the run's records are final: a verdict then writes only flight records.
    records_final: AtomicBool,
    /// True once this rank is past MPI_Finalize and waits to meet the others at the exit.
    exiting: AtomicBool,
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
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    /// Closed by the watchdog's thread when it ends.
    done: Option<mpsc::Receiver<()>>,
    /// Given by the watchdog's thread once every rank is past MPI_Finalize.
    met: Option<mpsc::Receiver<()>>,
    /// The watchdog's thread, woken from its tick when the job exits or stops.
    thread: Option<std::thread::Thread>,
}

/// How long dropping a watchdog waits for its thread: the job's exit never waits on
/// the channel longer than this.
const STOP_WAIT: Duration = Duration::from_secs(1);

impl Watchdog {
    /// Starts the watchdog of every rank of `g` (a collective: rank 0's addresses and
    /// the job's secret are broadcast), with a first limit of `limit_s` seconds in one
    /// collective.
    pub(crate) fn start(g: &Group, limit_s: f64) -> Watchdog {
        let (hub, view) = rendezvous(g);
        let shared = Arc::new(Shared {
            rank: g.rank,
            host: g.host.clone(),
            size: g.size,
            limit_bits: AtomicU64::new(limit_s.to_bits()),
            stop: AtomicBool::new(false),
            run: Mutex::new(None),
            records_final: AtomicBool::new(false),
            exiting: AtomicBool::new(false),
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
        let (met_tx, met_rx) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new().name("ddpbench-watchdog".into()).spawn(move || {
            let _done = tx;
            watch(s, link, met_tx)
        });
        let running = spawned.is_ok();
        Watchdog {
            shared,
            done: running.then_some(rx),
            met: running.then_some(met_rx),
            thread: spawned.ok().map(|h| h.thread().clone()),
        }
    }

    /// Ends the watchdog thread's current tick at once, so that it sees a change now.
    fn wake(&self) {
        if let Some(t) = &self.thread {
            t.unpark();
        }
    }

    /// Seconds a collective may take before the job is declared hung.
    pub(crate) fn set_limit(&self, limit_s: f64) {
        self.shared.limit_bits.store(limit_s.to_bits(), Ordering::Relaxed);
    }

    /// Where flight and end records go.
    pub(crate) fn set_run(&self, run: WatchdogRun) {
        *self.shared.run.lock().unwrap_or_else(|p| p.into_inner()) = Some(run);
        self.shared.records_final.store(false, Ordering::Relaxed);
    }

    /// The run's end records and manifest are final (the run completed, or said how it
    /// ended): a verdict in the teardown still writes its flight records into the run
    /// folder, but no longer rewrites what the run recorded.
    pub(crate) fn records_final(&self) {
        self.shared.records_final.store(true, Ordering::Relaxed);
    }

    /// After MPI_Finalize: waits until every rank heard from is past it too (rank 0
    /// tells the others when they are), within the limit; a rank that does not come is
    /// named and the job ends with exit status 3 ([`Watchdog`]'s verdict).
    pub(crate) fn meet_at_exit(&self) {
        let _f = flight::enter("exit", "after MPI_Finalize");
        self.shared.exiting.store(true, Ordering::Relaxed);
        self.wake();
        if let Some(met) = &self.met {
            // Err: the watchdog's thread is gone, and nobody waits.
            let _ = met.recv();
        }
    }

    /// The run has ended and its records are written: a later verdict leaves them as
    /// they are (a finished study point stays finished whatever hangs after it).
    pub(crate) fn end_run(&self) {
        *self.shared.run.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Where flight records go when no run is open.
    pub(crate) fn set_flight_dir(&self, dir: PathBuf) {
        *self.shared.flight_dir.lock().unwrap_or_else(|p| p.into_inner()) = Some(dir);
    }

    /// Steps completed so far (for an end record the watchdog may have to write).
    pub(crate) fn set_steps(&self, steps: usize) {
        self.shared.steps.store(steps as u64, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.wake();
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
    started: Instant,
}

/// Refusals logged before the watchdog stops naming each one.
const REFUSALS_LOGGED: u64 = 3;

impl Root {
    fn new(hub: Hub, size: usize) -> Root {
        Root {
            hub,
            reports: vec![None; size],
            started: Instant::now(),
        }
    }

    /// True while ranks are joining: in the first `JOIN_WINDOW`, until every rank has
    /// an authenticated connection.
    fn joining(&self) -> bool {
        self.started.elapsed() < JOIN_WINDOW && self.hub.missing_ranks()
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
                Ok(st) if st.rank == rank && seconds_ok(st.waited_s) && st.phase.as_ref().is_none_or(|p| seconds_ok(p.for_s)) => {
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
            } else {
                if st.pending.is_some() {
                    st.waited_s += age.as_secs_f64();
                }
                if let Some(p) = st.phase.as_mut() {
                    p.for_s += age.as_secs_f64();
                }
            }
            out.push(st);
        }
        out
    }

    fn abort_all(&mut self, message: &str) {
        self.hub.send_all(&format!("abort\t{message}"));
    }

    /// True when rank 0 (`own`) and every rank it heard from report being past
    /// MPI_Finalize. A rank never heard from (its link never worked) is not waited for.
    fn all_finalized(&self, own: &RankStatus) -> bool {
        own.finalized && self.reports.iter().skip(1).flatten().all(|(st, _)| st.finalized)
    }
}

/// A number of seconds a report may hold.
fn seconds_ok(s: f64) -> bool {
    s.is_finite() && s >= 0.0
}

/// A rank's link to rank 0 (None while broken; it is made again every few seconds).
struct Member {
    up: Option<Uplink>,
    secret: Arc<Secret>,
    addrs: Vec<SocketAddr>,
    last_try: Instant,
    last_sent: Option<Instant>,
    last_ack: Instant,
    /// Rank 0 said that every rank is past MPI_Finalize.
    exit_said: bool,
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
            exit_said: false,
        }
    }

    /// Sends this rank's status once a second and returns rank 0's lines.
    fn exchange(&mut self, rank: usize, own: &RankStatus) -> Vec<String> {
        // Past MPI_Finalize every tick counts: rank 0 waits for this report to end the job.
        let heartbeat = if own.finalized { Duration::ZERO } else { HEARTBEAT };
        if self.up.as_ref().is_some_and(|u| u.closed().is_some()) {
            self.up = None;
        }
        if self.up.is_none() && self.last_try.elapsed() > RECONNECT {
            self.last_try = Instant::now();
            self.up = Uplink::connect(&self.addrs, self.secret.clone(), rank).ok();
        }
        let Some(up) = self.up.as_mut() else { return Vec::new() };
        if self.last_sent.is_none_or(|t| t.elapsed() >= heartbeat) {
            if let Ok(json) = serde_json::to_string(own) {
                up.send(&format!("report {json}"));
            }
            self.last_sent = Some(Instant::now());
        }
        up.receive()
    }
}

fn watch(s: Arc<Shared>, mut link: Link, met: mpsc::Sender<()>) {
    let mut signal_recorded = false;
    let mut met = Some(met);
    while !s.stop.load(Ordering::Relaxed) {
        let exiting = s.exiting.load(Ordering::Relaxed);
        // Woken early by `Watchdog::wake` (or spuriously): a tick only looks at clocks.
        std::thread::park_timeout(if exiting {
            EXIT_TICK
        } else if matches!(&link, Link::Root(root) if root.joining()) {
            JOIN_TICK
        } else {
            TICK
        });
        let own = RankStatus::here(s.rank, &s.host);
        if !signal_recorded {
            signal_recorded = record_signal_while_held(&s, &own);
        }
        if let Some(e) = crate::device::cuda::async_error() {
            give_up(&s, &mut link, Verdict::Own(format!("rank {} on {}: {e}", s.rank, s.host)));
        }
        let verdict = match &mut link {
            Link::Root(root) => judge_as_root(&s, root, own.clone()).map(Verdict::Own),
            Link::Member(m) => judge_as_member(&s, m, own.clone()),
            Link::Alone => judge_alone(&s, &own).map(Verdict::Own),
        };
        if let Some(v) = verdict {
            give_up(&s, &mut link, v);
        }
        if exiting && met.is_some() && everyone_at_exit(&mut link, &own) {
            // The main thread goes on to exit; dropping the sender says so if it waits.
            let _ = met.take().map(|m| m.send(()));
        }
    }
}

/// Past MPI_Finalize: true once this rank may exit. Rank 0 waits for every rank it
/// heard from to be past MPI_Finalize, then tells them; another rank waits for rank 0's
/// word (or exits at once without a link to rank 0).
fn everyone_at_exit(link: &mut Link, own: &RankStatus) -> bool {
    match link {
        Link::Root(root) => {
            let all = root.all_finalized(own);
            if all {
                root.hub.send_all("exit");
            }
            all
        }
        Link::Member(m) => m.exit_said || m.up.is_none(),
        Link::Alone => true,
    }
}

/// Rank 0: collects the reports and decides when a collective has hung, or a rank's
/// step (or teardown) has stopped advancing.
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
    let stalled = hang::stalled(&statuses, s.limit_s());
    if !hung && stalled.is_empty() {
        return None;
    }
    // Ranks waiting for a stalled one are a collective's diagnosis, which says where the
    // stalled rank is; without any, the stall is the whole story.
    match hang::diagnose(&statuses, s.size) {
        Some(d) => Some(d.message()),
        None if !stalled.is_empty() => Some(hang::stall_message(&stalled, Some(s.limit_s()))),
        None => None,
    }
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
        } else if line == "exit" {
            m.exit_said = true;
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

/// Without a link to rank 0: only this rank's own wait, or its own stall, counts.
fn judge_alone(s: &Shared, own: &RankStatus) -> Option<String> {
    let stalled = hang::stalled(std::slice::from_ref(own), s.limit_s());
    if !stalled.is_empty() {
        return Some(hang::stall_message(&stalled, Some(s.limit_s())));
    }
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
/// once (the rank that concluded it), and abort the job. A run whose records are final
/// keeps them: only the flight records are added.
fn give_up(s: &Shared, link: &mut Link, verdict: Verdict) -> ! {
    let run = s.run.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let kept = s.records_final.load(Ordering::Relaxed);
    let message = match &verdict {
        Verdict::Own(m) | Verdict::FromRoot(m) => m.as_str(),
    };
    if let Link::Root(root) = link {
        root.abort_all(message);
    }
    if let Verdict::Own(m) = &verdict {
        crate::stderr::say(&format!("watchdog: {m}. Aborting the job"));
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
            crate::stderr::say(&format!("flight records: ddpbench diagnose {}", dir.display()));
        }
    }
    match &run {
        Some(run) if kept && s.rank == 0 => crate::stderr::say(&format!(
            "watchdog: the run's records were final before the stall and are kept as they are in {}",
            run.dir.display()
        )),
        _ => {}
    }
    if let Some(run) = run.as_ref().filter(|_| !kept) {
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
    abort_job(3)
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
    if s.records_final.load(Ordering::Relaxed) {
        return true;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    /// Rank 0 ticks at `JOIN_TICK` while a rank is missing, for `JOIN_WINDOW` at most.
    #[test]
    fn rank_0_ticks_fast_only_while_ranks_join() {
        let secret = Arc::new(Secret::generate().unwrap());
        let (hub, _) = Hub::bind(&[IpAddr::V4(Ipv4Addr::LOCALHOST)], secret, 2).unwrap();
        let mut root = Root::new(hub, 2);
        assert!(root.joining(), "rank 1 has not joined");
        // None only on a machine up for less than the window.
        if let Some(before) = Instant::now().checked_sub(JOIN_WINDOW) {
            root.started = before;
            assert!(!root.joining(), "past the window a missing rank is waited for at TICK");
        }
        const { assert!(JOIN_TICK.as_millis() * 10 <= TICK.as_millis()) };
    }
}
