//! report.json's `per_step`: a run's mean seconds per rank-step of each phase, as the
//! phase plots and `compare` show it too: the parts of [`StepPhases::parts`], laid out by
//! each phase's [`PhaseRole`], so a new phase is in all three with no edit here.

use crate::record::{Phase, PhaseRole, PhaseTimes};
use serde::{Serialize, Serializer};

/// Mean seconds per rank-step of each phase, and the communication phases' time split
/// into the transfer and the wait for a late rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepPhases {
    pub phases: PhaseTimes,
    /// The communication phases' time after the last rank entered the all-reduce.
    pub comm_transfer_s: f64,
    /// The communication phases' time spent waiting for a late rank.
    pub comm_wait_s: f64,
}

/// One part of the step as report.json's `per_step`, the phase plots and `compare`
/// name it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepPart {
    /// report.json's key, and `compare`'s column stem.
    pub key: &'static str,
    /// The phase plots' legend.
    pub label: String,
    /// `compare`'s description ("… per step (s)").
    pub what: String,
}

impl StepPart {
    fn new(key: &'static str, label: &str, what: &str) -> StepPart {
        StepPart {
            key,
            label: label.into(),
            what: what.into(),
        }
    }
}

impl StepPhases {
    /// The parts in the step's order ([`Phase::ALL`]), each with its seconds: the
    /// phases of the data role together as `data_s` (at the first of them), the
    /// communication role as `comm_transfer_s` and `comm_wait_s`, and each compute phase
    /// under its own column. They add up to the step.
    pub(crate) fn parts(&self) -> Vec<(StepPart, f64)> {
        let mut out = Vec::with_capacity(Phase::COUNT + 1);
        let mut done: Vec<PhaseRole> = Vec::new();
        for p in Phase::ALL {
            let role = p.role();
            match role {
                PhaseRole::Compute => {
                    let stem = p.column().strip_suffix("_s").unwrap_or(p.column());
                    out.push((StepPart::new(p.column(), stem, stem), self.phases[p]));
                }
                _ if done.contains(&role) => {}
                PhaseRole::Data => {
                    let data_s = Phase::ALL.iter().filter(|q| q.role() == role).map(|q| self.phases[*q]).sum();
                    out.push((StepPart::new("data_s", "data", "data"), data_s));
                }
                PhaseRole::Communication => {
                    out.push((
                        StepPart::new("comm_transfer_s", "comm: transfer", "all-reduce transfer"),
                        self.comm_transfer_s,
                    ));
                    let wait = StepPart::new("comm_wait_s", "comm: waiting for a late rank", "all-reduce wait");
                    out.push((wait, self.comm_wait_s));
                }
            }
            done.push(role);
        }
        out
    }

    /// What [`StepPhases::parts`] holds, without the seconds.
    pub(crate) fn layout() -> Vec<StepPart> {
        StepPhases::default().parts().into_iter().map(|(part, _)| part).collect()
    }
}

impl Serialize for StepPhases {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let parts = self.parts();
        let mut st = s.serialize_struct("StepPhases", parts.len())?;
        for (part, seconds) in &parts {
            st.serialize_field(part.key, seconds)?;
        }
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::PhaseArray;

    /// The keys report.json has always written stay, in their order, and every phase's
    /// time is in exactly one part.
    #[test]
    fn per_step_groups_the_phases_by_role_in_step_order() {
        // Powers of two: every sum below is exact.
        let p = StepPhases {
            phases: PhaseArray::from_fn(|q| f64::from(1u32 << q.index()) / 16.0),
            comm_transfer_s: 1.0,
            comm_wait_s: 0.5,
        };
        let parts = p.parts();
        let keys: Vec<&str> = parts.iter().map(|(part, _)| part.key).collect();
        let kept = [
            "data_s",
            "forward_s",
            "backward_s",
            "comm_transfer_s",
            "comm_wait_s",
            "optimizer_s",
            "other_s",
        ];
        let mut rest = keys.iter();
        assert!(kept.iter().all(|k| rest.any(|key| key == k)), "{keys:?}");
        let of = |key: &str| parts.iter().find(|(part, _)| part.key == key).unwrap().clone();
        assert_eq!(of("data_s").1, p.phases[Phase::Data] + p.phases[Phase::BatchCopy]);
        assert_eq!(of("forward_s").1, p.phases[Phase::Forward]);
        assert_eq!((of("comm_transfer_s").1, of("comm_wait_s").1), (1.0, 0.5));
        let comm: f64 = Phase::ALL
            .iter()
            .filter(|q| q.role() == PhaseRole::Communication)
            .map(|q| p.phases[*q])
            .sum();
        let total: f64 = parts.iter().map(|(_, s)| s).sum();
        assert_eq!(total, p.phases.values().sum::<f64>() - comm + 1.5);
        let labels: Vec<(&str, String)> = StepPhases::layout().into_iter().map(|part| (part.key, part.label)).collect();
        assert!(labels.contains(&("data_s", "data".into())) && labels.contains(&("optimizer_s", "optimizer".into())));
        assert!(labels.contains(&("comm_wait_s", "comm: waiting for a late rank".into())));
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.starts_with(r#"{"data_s":0.1875,"forward_s":0.25,"#), "{json}");
    }
}
