//! Hang diagnosis: where each rank is as its watchdog reports it ([`RankStatus`]), the
//! collective a job is held in and the ranks that never entered it ([`diagnose`]), the
//! ranks whose phase does not advance ([`stalled`]), and the dump a rank leaves
//! ([`FlightDump`]).

use super::{recorder, PhaseStatus, Record, State};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What one rank knows about where it is, as its watchdog reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct RankStatus {
    pub rank: usize,
    pub host: String,
    /// The collective it is held in, if any, and for how long.
    pub pending: Option<Record>,
    pub waited_s: f64,
    /// The last collective it completed.
    pub last_completed: Option<u64>,
    /// Seconds since this status was reported, when the rank has gone silent (0 while
    /// it reports on time).
    #[serde(default)]
    pub silent_s: f64,
    /// True while the rank sits out the current part of the job (a study point).
    #[serde(default)]
    pub idle: bool,
    /// The phase its main thread is in ([`Activity`](super::Activity)), None outside watched work.
    #[serde(default)]
    pub phase: Option<PhaseStatus>,
    /// True once it is past MPI_Finalize.
    #[serde(default)]
    pub finalized: bool,
}

impl RankStatus {
    /// This process's status.
    pub(crate) fn here(rank: usize, host: &str) -> RankStatus {
        let r = recorder();
        let (pending, waited_s) = match r.pending() {
            Some((rec, w)) => (Some(rec), w),
            None => (None, 0.0),
        };
        RankStatus {
            rank,
            host: host.into(),
            pending,
            waited_s,
            last_completed: r.last_completed(),
            silent_s: 0.0,
            idle: r.idle(),
            phase: r.phase(),
            finalized: r.finalized(),
        }
    }

    /// Where it is, for a message: the collective it waits in, else its phase; None
    /// when neither is known.
    fn whereabouts(&self) -> Option<String> {
        // A silent rank's place is its last report's, which may be steps behind the
        // collective the others wait in: said as a report from before it went silent,
        // so the two step numbers do not read as one moment.
        let place = match (&self.pending, &self.phase) {
            (Some(p), _) if p.state == State::Started => p.describe(),
            (_, Some(ph)) if self.silent_s > 0.0 => ph.describe(),
            (_, Some(ph)) => return Some(format!("is in {} for {:.0} s", ph.describe(), ph.for_s)),
            _ => return None,
        };
        Some(if self.silent_s > 0.0 {
            format!("last reported being in {place}, before it went silent")
        } else {
            format!("is in {place}")
        })
    }

    /// True when it is alive and its main thread has been in one phase for more than
    /// `limit_s` with no collective it waits in (the collective watch covers those).
    fn stalled(&self, limit_s: f64) -> bool {
        let in_collective = self.pending.as_ref().is_some_and(|p| p.state == State::Started);
        !self.idle && self.silent_s == 0.0 && !in_collective && self.phase.as_ref().is_some_and(|p| p.for_s > limit_s)
    }

    /// True when this rank has entered collective `seq` (or gone past it).
    fn entered(&self, seq: u64) -> bool {
        let started = self
            .pending
            .as_ref()
            .is_some_and(|p| p.seq > seq || (p.seq == seq && p.state >= State::Started));
        started || self.last_completed.is_some_and(|c| c >= seq)
    }
}

/// The analysis of a hang: the collective the waiting ranks are held in, and the ranks
/// that never entered it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Diagnosis {
    pub collective: Record,
    /// Ranks that never entered it: (rank, host, seconds silent).
    pub missing: Vec<(usize, String, f64)>,
    /// Ranks that entered it and then went silent (stopped inside it).
    pub stuck_inside: Vec<(usize, String, f64)>,
    /// Ranks whose status is unknown (no report).
    pub silent: Vec<usize>,
    pub waiting: Vec<usize>,
    pub waited_s: f64,
    /// When the ranks that report wait in different collectives: each collective, with
    /// the ranks in it (empty when they wait in one).
    pub split: Vec<(Record, Vec<usize>)>,
    /// Where the first missing ranks are instead: (rank, `is in forward of epoch 0
    /// step 3 for 12 s`, `last reported being in teardown (closing the run's files), before it
    /// went silent`...).
    pub elsewhere: Vec<(usize, String)>,
}

/// Missing ranks whose whereabouts a message gives.
const WHEREABOUTS_LISTED: usize = 8;

impl Diagnosis {
    /// `rank 1 on node2 has not entered all-reduce #4812 (bucket 2, epoch 3 step 120); ranks 0, 2-7 waited 312 s`.
    pub(crate) fn message(&self) -> String {
        let name = |(r, h, silent): &(usize, String, f64)| {
            if *silent > 0.0 {
                format!("rank {r} on {h} (silent for {silent:.0} s)")
            } else {
                format!("rank {r} on {h}")
            }
        };
        // Ranks named in a split are said where they wait; the others are missing.
        let in_split = |r: usize| self.split.iter().any(|(_, ranks)| ranks.contains(&r));
        let missing: Vec<&(usize, String, f64)> = self.missing.iter().filter(|m| !in_split(m.0)).collect();
        let mut who: Vec<String> = missing.iter().map(|m| name(m)).collect();
        if !self.silent.is_empty() {
            who.push(silent_list(&self.silent));
        }
        let verb = if missing.len() + self.silent.len() == 1 { "has" } else { "have" };
        let mut text = if self.split.len() > 1 {
            let mut t = self.split_text();
            if !who.is_empty() {
                t.push_str(&format!("; {} {verb} not entered {}", who.join(", "), self.collective.describe()));
            }
            t
        } else if who.is_empty() {
            format!("every rank entered {}", self.collective.describe())
        } else {
            format!("{} {verb} not entered {}", who.join(", "), self.collective.describe())
        };
        for (r, place) in self.elsewhere.iter().filter(|(r, _)| !in_split(*r)) {
            text.push_str(&format!("; rank {r} {place}"));
        }
        if !self.stuck_inside.is_empty() {
            let stuck: Vec<String> = self.stuck_inside.iter().map(name).collect();
            text.push_str(&format!("; {} stopped inside it", stuck.join(", ")));
        }
        if self.waiting.is_empty() {
            text
        } else {
            format!("{text}; {} waited {:.0} s", rank_list(&self.waiting), self.waited_s)
        }
    }

    /// `the ranks wait in different collectives: rank 0 in all-reduce #49 (…); rank 1 in
    /// all-reduce #49 (…)`, and why that cannot end when the numbers are the same.
    fn split_text(&self) -> String {
        let parts: Vec<String> = self
            .split
            .iter()
            .map(|(rec, ranks)| format!("{} in {}", rank_list(ranks), rec.describe()))
            .collect();
        let one_number = self.split.iter().all(|(rec, _)| rec.seq == self.split[0].0.seq);
        let why = if one_number {
            ": the same call number in different calls, so the ranks no longer make the same calls \
             (were they started with different flags?)"
        } else {
            ""
        };
        format!("the ranks wait in different collectives: {}{why}", parts.join("; "))
    }
}

/// Silent ranks listed in a message: at most this many, then how many more.
const SILENT_LISTED: usize = 64;

/// `ranks 2-5, 9 (no report)`, the first [`SILENT_LISTED`] of them and `and N more`:
/// a world of millions with one report gives one line, not millions.
fn silent_list(silent: &[usize]) -> String {
    let shown = &silent[..silent.len().min(SILENT_LISTED)];
    let more = silent.len() - shown.len();
    let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
    format!("{}{tail} (no report)", rank_list(shown))
}

/// `ranks 0, 2-7` / `rank 3`.
pub(crate) fn rank_list(ranks: &[usize]) -> String {
    let ids: Vec<u32> = ranks.iter().map(|&r| r as u32).collect();
    let list = crate::record::compact_list(&ids).replace(',', ", ");
    if ranks.len() == 1 {
        format!("rank {list}")
    } else {
        format!("ranks {list}")
    }
}

/// Which collective the job is held in (the lowest-numbered one a rank has started and
/// not completed) and which of `size` ranks have not entered it. `statuses` holds what
/// is known (a rank without one is silent). None when no rank waits in a collective.
pub(crate) fn diagnose(all: &[RankStatus], size: usize) -> Option<Diagnosis> {
    // Ranks sitting out the current part are no party to its collectives, unless they
    // went silent: a stopped rank's last report is stale (the part it sat out may have
    // ended), and it will hold every collective of the job.
    let statuses: Vec<RankStatus> = all.iter().filter(|s| !s.idle || s.silent_s > 0.0).cloned().collect();
    let statuses = &statuses[..];
    let started: Vec<&Record> = statuses
        .iter()
        .filter_map(|s| s.pending.as_ref().filter(|p| p.state == State::Started))
        .collect();
    // A rank stopped inside a collective another rank has already completed (rank 0 of a
    // ring has every piece before rank 1 finishes) is not where the job is held: that is
    // the next collective, the one the running ranks wait in and nobody has completed.
    let completed_somewhere = |seq: u64| statuses.iter().any(|s| s.last_completed.is_some_and(|c| c >= seq));
    let held = started
        .iter()
        .filter(|p| !completed_somewhere(p.seq))
        .min_by_key(|p| p.seq)
        .or_else(|| started.iter().min_by_key(|p| p.seq))
        .map(|p| (*p).clone())?;
    let seq = held.seq;
    // Sets: `size` may be millions of ranks, each looked up once.
    let known: std::collections::BTreeSet<usize> = statuses.iter().map(|s| s.rank).collect();
    let named = |s: &RankStatus| (s.rank, s.host.clone(), s.silent_s);
    let mut missing: Vec<(usize, String, f64)> = statuses.iter().filter(|s| !s.entered(seq)).map(named).collect();
    missing.sort_by_key(|m| m.0);
    let mut stuck_inside: Vec<(usize, String, f64)> = statuses
        .iter()
        .filter(|s| s.entered(seq) && s.silent_s > 0.0 && s.last_completed.is_none_or(|c| c < seq))
        .map(named)
        .collect();
    stuck_inside.sort_by_key(|m| m.0);
    let idle: std::collections::BTreeSet<usize> = all.iter().filter(|s| s.idle && s.silent_s == 0.0).map(|s| s.rank).collect();
    let silent: Vec<usize> = (0..size).filter(|r| !known.contains(r) && !idle.contains(r)).collect();
    let split = split_by_collective(statuses);
    let waiting: Vec<usize> = if split.len() > 1 {
        let mut all: Vec<usize> = split.iter().flat_map(|(_, ranks)| ranks.iter().copied()).collect();
        all.sort_unstable();
        all
    } else {
        statuses
            .iter()
            .filter(|s| s.silent_s == 0.0 && s.pending.as_ref().is_some_and(|p| p.seq == seq && p.state == State::Started))
            .map(|s| s.rank)
            .collect()
    };
    let waited_s = statuses
        .iter()
        .filter(|s| waiting.contains(&s.rank))
        .map(|s| s.waited_s)
        .fold(0.0, f64::max);
    let elsewhere = missing
        .iter()
        .take(WHEREABOUTS_LISTED)
        .filter_map(|m| statuses.iter().find(|s| s.rank == m.0))
        .filter_map(|s| Some((s.rank, s.whereabouts()?)))
        .collect();
    Some(Diagnosis {
        collective: held,
        missing,
        stuck_inside,
        silent,
        waiting,
        waited_s,
        split,
        elsewhere,
    })
}

/// The collectives the reporting ranks wait in, each with its ranks, ordered by their
/// lowest rank: more than one when the ranks are in different calls (another number,
/// or the same number with another kind or detail).
fn split_by_collective(statuses: &[RankStatus]) -> Vec<(Record, Vec<usize>)> {
    let mut groups: Vec<(Record, Vec<usize>)> = Vec::new();
    let mut live: Vec<&RankStatus> = statuses.iter().filter(|s| s.silent_s == 0.0).collect();
    live.sort_by_key(|s| s.rank);
    for s in live {
        let Some(p) = s.pending.as_ref().filter(|p| p.state == State::Started) else {
            continue;
        };
        match groups.iter_mut().find(|(rec, _)| rec.same_call(p)) {
            Some((_, ranks)) => ranks.push(s.rank),
            None => groups.push((p.clone(), vec![s.rank])),
        }
    }
    groups
}

/// The ranks that report and whose main thread has been in one phase longer than
/// `limit_s` with no collective pending ([`Activity`](super::Activity)), lowest rank first.
pub(crate) fn stalled(all: &[RankStatus], limit_s: f64) -> Vec<&RankStatus> {
    let mut out: Vec<&RankStatus> = all.iter().filter(|s| s.stalled(limit_s)).collect();
    out.sort_by_key(|s| s.rank);
    out
}

/// `rank 1 on node2 has made no progress for 12 s: it is in forward of epoch 0 step 3
/// (no collective pending; the watchdog's limit is 10 s)`; without `limit_s` (read back
/// from flight records) the limit is left out.
pub(crate) fn stall_message(stalled: &[&RankStatus], limit_s: Option<f64>) -> String {
    let parts: Vec<String> = stalled
        .iter()
        .take(WHEREABOUTS_LISTED)
        .map(|s| {
            let ph = s.phase.as_ref().map(PhaseStatus::describe).unwrap_or_default();
            let for_s = s.phase.as_ref().map_or(0.0, |p| p.for_s);
            format!("rank {} on {} has made no progress for {for_s:.0} s: it is in {ph}", s.rank, s.host)
        })
        .collect();
    let more = stalled.len().saturating_sub(WHEREABOUTS_LISTED);
    let tail = if more > 0 {
        format!(" (and {more} more ranks)")
    } else {
        String::new()
    };
    let limit = limit_s.map(|l| format!("; the watchdog's limit is {l:.0} s")).unwrap_or_default();
    format!("{}{tail} (no collective pending{limit})", parts.join("; "))
}

/// `rank-NNNNN.flight.json`: a rank's recorder when its watchdog fired.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FlightDump {
    pub status: RankStatus,
    /// What the watchdog concluded, as it printed it.
    pub message: String,
    pub time_utc: String,
    pub records: Vec<Record>,
    /// Rank 0's last report from every other rank when it concluded (empty on other
    /// ranks): a rank stopped for good writes no record of its own, and this says where
    /// it was last seen.
    #[serde(default)]
    pub known: Vec<RankStatus>,
}

pub(crate) fn flight_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.flight.json")
}

impl FlightDump {
    /// This process's dump.
    pub(crate) fn here(rank: usize, host: &str, message: &str) -> FlightDump {
        FlightDump {
            status: RankStatus::here(rank, host),
            message: message.into(),
            time_utc: crate::record::rfc3339_utc(std::time::SystemTime::now()),
            records: recorder().snapshot(),
            known: Vec::new(),
        }
    }

    pub(crate) fn write(&self, dir: &Path) -> anyhow::Result<()> {
        crate::record::write_atomic(&dir.join(flight_file_name(self.status.rank)), &serde_json::to_string_pretty(self)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, state: State) -> Record {
        Record {
            seq,
            kind: "all-reduce".into(),
            detail: "bucket 2".into(),
            epoch: Some(3),
            step: Some(120),
            state,
            scheduled_s: 0.0,
            started_s: None,
            completed_s: None,
            teardown: false,
        }
    }

    fn status(rank: usize, pending: Option<Record>, waited_s: f64, last: Option<u64>) -> RankStatus {
        RankStatus {
            rank,
            host: format!("node{}", rank / 4 + 1),
            pending,
            waited_s,
            last_completed: last,
            silent_s: 0.0,
            idle: false,
            phase: None,
            finalized: false,
        }
    }

    fn in_phase(name: &str, step: usize, for_s: f64) -> Option<PhaseStatus> {
        Some(PhaseStatus {
            name: name.into(),
            epoch: Some(0),
            step: Some(step),
            teardown: false,
            for_s,
        })
    }

    #[test]
    fn ranks_sitting_out_a_study_point_are_never_blamed() {
        // Ranks 0 and 1 run a point and rank 1 never enters collective 7; ranks 2 and 3
        // sit the point out (their numbers lag): only rank 1 is named.
        let held = |seq| Some(rec(seq, State::Started));
        let mut idle2 = status(2, None, 0.0, Some(3));
        idle2.idle = true;
        let mut idle3 = status(3, None, 0.0, None);
        idle3.idle = true;
        let d = diagnose(&[status(0, held(7), 90.0, Some(6)), status(1, None, 0.0, Some(6)), idle2, idle3], 4).unwrap();
        assert_eq!(d.missing.iter().map(|m| m.0).collect::<Vec<_>>(), vec![1]);
        assert!(d.silent.is_empty(), "{:?}", d.silent);
    }

    #[test]
    fn a_rank_that_went_silent_while_sitting_out_a_point_is_named() {
        // Rank 1 sat out a 1-rank point and was stopped; rank 0 finished the point and
        // waits for it in the study's next collective (a higher part's number).
        let mut stopped = status(1, Some(rec(5, State::Started)), 3.0, Some(4));
        stopped.idle = true;
        stopped.silent_s = 20.0;
        let d = diagnose(
            &[status(0, Some(rec(1 << 33, State::Started)), 21.0, Some((1 << 33) - 1)), stopped],
            2,
        )
        .unwrap();
        assert_eq!(d.missing, vec![(1, "node1".to_string(), 20.0)]);
        assert!(
            d.message().starts_with("rank 1 on node1 (silent for 20 s) has not entered"),
            "{}",
            d.message()
        );
    }

    #[test]
    fn names_the_rank_that_never_entered() {
        // 8 ranks; rank 5 stopped after completing #4811; the others wait in #4812.
        let mut s: Vec<RankStatus> = (0..8)
            .filter(|&r| r != 5)
            .map(|r| status(r, Some(rec(4812, State::Started)), 300.0 + r as f64, Some(4811)))
            .collect();
        s.push(status(5, None, 0.0, Some(4811)));
        let d = diagnose(&s, 8).unwrap();
        assert_eq!(d.missing, vec![(5, "node2".to_string(), 0.0)]);
        assert!(d.silent.is_empty());
        assert_eq!(d.waited_s, 307.0);
        assert_eq!(
            d.message(),
            "rank 5 on node2 has not entered all-reduce #4812 (bucket 2, epoch 3 step 120); ranks 0-4, 6-7 waited 307 s"
        );
    }

    #[test]
    fn millions_of_silent_ranks_are_one_line() {
        // One report from a world of 2^22 ranks: every other rank is silent.
        let s = vec![status(0, Some(rec(10, State::Started)), 12.0, Some(9))];
        let d = diagnose(&s, 1 << 22).unwrap();
        assert_eq!(d.silent.len(), (1 << 22) - 1);
        let text = d.message();
        assert!(
            text.starts_with(&format!(
                "ranks 1-64 and {} more (no report) have not entered all-reduce #10",
                (1 << 22) - 65
            )),
            "{text}"
        );
        assert!(text.len() < 200, "{text}");
    }

    #[test]
    fn a_rank_with_a_scheduled_bucket_has_not_entered_and_a_silent_one_is_named() {
        let s = vec![
            status(0, Some(rec(10, State::Started)), 12.0, Some(9)),
            status(1, Some(rec(10, State::Scheduled)), 12.0, Some(9)),
        ];
        let d = diagnose(&s, 3).unwrap();
        assert_eq!(d.missing, vec![(1, "node1".to_string(), 0.0)]);
        assert_eq!(d.silent, vec![2]);
        assert!(d
            .message()
            .starts_with("rank 1 on node1, rank 2 (no report) have not entered all-reduce #10"));
        // A rank that went silent inside the collective is named as such.
        let mut stuck = status(1, Some(rec(10, State::Started)), 3.0, Some(9));
        stuck.silent_s = 40.0;
        let d = diagnose(&[status(0, Some(rec(10, State::Started)), 50.0, Some(9)), stuck], 2).unwrap();
        assert!(d.missing.is_empty());
        assert_eq!(
            d.message(),
            "every rank entered all-reduce #10 (bucket 2, epoch 3 step 120); rank 1 on node1 (silent for 40 s) stopped inside it; rank 0 waited 50 s"
        );
        // Rank 0 completed #10 (a ring's rank 0 can, before rank 1 is done) and waits in
        // #11; rank 1 stopped inside #10: the job is held in #11, which rank 1 never entered.
        let mut inside = status(1, Some(rec(10, State::Started)), 3.0, Some(9));
        inside.silent_s = 6.0;
        let d = diagnose(&[status(0, Some(rec(11, State::Started)), 7.0, Some(10)), inside.clone()], 2).unwrap();
        assert_eq!(
            d.message(),
            "rank 1 on node1 (silent for 6 s) has not entered all-reduce #11 (bucket 2, epoch 3 step 120); \
             rank 1 last reported being in all-reduce #10 (bucket 2, epoch 3 step 120), before it went silent; \
             rank 0 waited 7 s"
        );
        // With no rank waiting in it, the message names no waiters.
        let mut alone = inside;
        alone.rank = 0;
        let d = diagnose(&[alone], 1).unwrap();
        assert_eq!(
            d.message(),
            "every rank entered all-reduce #10 (bucket 2, epoch 3 step 120); rank 0 on node1 (silent for 6 s) stopped inside it"
        );
        // Nobody waits: nothing to diagnose.
        assert_eq!(diagnose(&[status(0, None, 0.0, Some(9))], 1), None);
    }

    #[test]
    fn ranks_in_different_calls_under_one_number_are_said_to_be_split() {
        // Rank 0 ended its steps and waits in the epoch's all-reduce #49; rank 1 still
        // trains and waits in bucket 0's all-reduce #49: not "every rank entered".
        let mut epoch_end = rec(49, State::Started);
        epoch_end.detail = "epoch time and loss".into();
        epoch_end.step = None;
        let mut bucket = rec(49, State::Started);
        bucket.detail = "bucket 0".into();
        bucket.step = Some(10);
        let d = diagnose(
            &[status(0, Some(epoch_end), 30.0, Some(48)), status(1, Some(bucket), 29.0, Some(48))],
            2,
        )
        .unwrap();
        let text = d.message();
        assert!(!text.contains("every rank entered"), "{text}");
        assert_eq!(
            text,
            "the ranks wait in different collectives: rank 0 in all-reduce #49 (epoch time and loss, epoch 3); \
             rank 1 in all-reduce #49 (bucket 0, epoch 3 step 10): the same call number in different calls, so the \
             ranks no longer make the same calls (were they started with different flags?); ranks 0-1 waited 30 s"
        );
        // Two ranks in one call and one in another: grouped, lowest rank first.
        let mut barrier = rec(50, State::Started);
        barrier.kind = "barrier".into();
        barrier.detail = "end of the run".into();
        let s = vec![
            status(0, Some(barrier.clone()), 12.0, Some(49)),
            status(1, Some(rec(49, State::Started)), 11.0, Some(48)),
            status(2, Some(barrier), 12.0, Some(49)),
        ];
        let text = diagnose(&s, 3).unwrap().message();
        assert!(
            text.starts_with(
                "the ranks wait in different collectives: ranks 0, 2 in barrier #50 (end of the run, epoch 3 step 120); \
                 rank 1 in all-reduce #49 (bucket 2, epoch 3 step 120); ranks 0-2 waited 12 s"
            ),
            "{text}"
        );
        // One call on every rank: as before.
        let s = vec![
            status(0, Some(rec(7, State::Started)), 9.0, Some(6)),
            status(1, Some(rec(7, State::Started)), 9.0, Some(6)),
        ];
        assert!(diagnose(&s, 2).unwrap().message().starts_with("every rank entered all-reduce #7"));
    }

    #[test]
    fn a_missing_rank_is_said_to_be_in_its_phase_and_a_stall_without_collectives_is_named() {
        // Rank 1's forward never returns; rank 0 waits for it in bucket 0's all-reduce.
        let mut slow = status(1, None, 0.0, Some(11));
        slow.phase = in_phase("forward", 3, 12.0);
        let d = diagnose(&[status(0, Some(rec(12, State::Started)), 11.0, Some(11)), slow.clone()], 2).unwrap();
        assert_eq!(
            d.message(),
            "rank 1 on node1 has not entered all-reduce #12 (bucket 2, epoch 3 step 120); \
             rank 1 is in forward of epoch 0 step 3 for 12 s; rank 0 waited 11 s"
        );
        // Alone (one rank, or every rank in it), no collective is pending: the stall.
        assert_eq!(diagnose(std::slice::from_ref(&slow), 1), None);
        let all = [slow.clone()];
        let stalled = stalled(&all, 10.0);
        assert_eq!(stalled.len(), 1);
        assert_eq!(
            stall_message(&stalled, Some(10.0)),
            "rank 1 on node1 has made no progress for 12 s: it is in forward of epoch 0 step 3 \
             (no collective pending; the watchdog's limit is 10 s)"
        );
        // Within the limit, waiting in a collective, sitting out a point or silent: no stall.
        assert!(stalled_ranks(&[slow.clone()], 12.5).is_empty());
        let mut waiting = slow.clone();
        waiting.pending = Some(rec(12, State::Started));
        let mut idle = slow.clone();
        idle.idle = true;
        let mut silent = slow;
        silent.silent_s = 5.0;
        assert!(stalled_ranks(&[waiting, idle, silent], 10.0).is_empty());
    }

    fn stalled_ranks(all: &[RankStatus], limit_s: f64) -> Vec<usize> {
        stalled(all, limit_s).iter().map(|s| s.rank).collect()
    }
}
