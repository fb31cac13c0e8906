//! `--allreduce none`: gradients live in the same flat buckets as with a real
//! all-reduce, but nothing leaves the rank. The step then costs what it costs without
//! communication, the reference for the trainer's own overhead.

use super::{BucketPlan, CommStats, FlatGrads, GradientReducer};
use anyhow::{anyhow, Result};
use std::time::Instant;
use tch::Tensor;

/// Keeps every rank's gradients to itself.
pub(crate) struct NoReduce {
    plan: BucketPlan,
    flat: Option<FlatGrads>,
}

impl NoReduce {
    pub(crate) fn new(plan: BucketPlan) -> NoReduce {
        NoReduce { plan, flat: None }
    }
}

impl GradientReducer for NoReduce {
    fn attach(&mut self, params: &[Tensor]) -> Result<()> {
        self.flat = Some(FlatGrads::attach(&self.plan, params)?);
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        let flat = self.flat.as_mut().ok_or_else(|| anyhow!("gradient buckets used before attach"))?;
        flat.claim(b);
        Ok(())
    }

    fn finish(&mut self, _params: &[Tensor], _backward_end: Instant) -> Result<CommStats> {
        let flat = self.flat.as_mut().ok_or_else(|| anyhow!("gradient buckets used before attach"))?;
        for b in 0..self.plan.buckets.len() {
            flat.claim(b);
        }
        let (first_launch, last_launch) = flat.claim_times();
        let launches = flat.claim_instants();
        flat.keep();
        Ok(CommStats {
            first_launch,
            last_launch,
            launches,
            ..CommStats::default()
        })
    }

    fn reduced(&self) -> &[Tensor] {
        self.flat.as_ref().expect("attached").current_set()
    }

    fn layout(&self) -> Option<crate::optim::FlatLayout> {
        self.flat.as_ref().map(FlatGrads::layout)
    }

    fn zero_grads(&mut self) {
        if let Some(flat) = self.flat.as_mut() {
            flat.zero();
        }
    }
}
