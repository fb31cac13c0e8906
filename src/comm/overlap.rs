//! Overlap of the all-reduce with backward. The forward pass is cut into stages (the
//! model's stem, each residual block or encoder layer, its head: [`crate::model::Net::forward_cut`]);
//! backward then runs stage by stage from the loss, and each gradient bucket is handed
//! to the all-reduce as soon as the stage that makes its last gradient has finished.
//!
//! A cut makes the next stage start from a leaf copy of the activation; backward is
//! carried across it by sending the gradient that arrived at the leaf into the
//! activation, d(sum(out·g))/d(out) = g, so the gradients are those of one whole
//! backward, bit for bit.
//!
//! [`discover_stages`] finds which stage makes each parameter's gradient (once, before
//! training), buckets are filled in that order (as PyTorch DDP rebuilds its buckets
//! after the first iteration), and [`LaunchPlan`] says after which stage each bucket
//! leaves and where backward must be cut.

use super::{BucketPlan, GradientReducer};
use crate::model::{self, Net};
use anyhow::Result;
use tch::{Device, Kind, Tensor};

/// An activation cut out of the graph: (the stage's output, the next stage's leaf input).
type Cut = (Tensor, Tensor);

/// Cuts the graph at activation `h`: the next stage starts from a leaf copy of it, and
/// the pair is kept so backward can be carried across the cut ([`backward_through_cut`]).
fn cut(h: Tensor, cuts: &mut Vec<Cut>) -> Tensor {
    let leaf = h.detach().set_requires_grad(true);
    cuts.push((h, leaf.shallow_clone()));
    leaf
}

/// Backward through one stage: the gradient that arrived at the next stage's input
/// leaf is sent into this stage's output.
fn backward_through_cut((out, leaf): &Cut) {
    let g = leaf.grad();
    if g.defined() && out.requires_grad() {
        (out * g).sum(Kind::Float).backward();
    }
}

/// Runs one forward and a staged backward on a dummy batch in eval mode (BatchNorm
/// statistics and dropout untouched) and returns, per parameter, the stage whose
/// backward made its gradient (the loss's stage is the last), and the stage count.
/// Leaves every gradient defined.
pub(crate) fn discover_stages(net: &dyn Net, spec: &model::ModelSpec, device: Device, params: &[Tensor]) -> (Vec<usize>, usize) {
    let x = match spec.input {
        model::Input::Image([c, h, w]) => Tensor::zeros([2, c, h, w], (Kind::Float, device)),
        model::Input::Tokens { seq_len, .. } => Tensor::full([2, seq_len], model::UNK_TOKEN, (Kind::Int64, device)),
    };
    let y = Tensor::zeros([2], (Kind::Int64, device));
    let mut cuts: Vec<Cut> = Vec::new();
    let out = net.forward_cut(&x, false, &mut |h| cut(h, &mut cuts));
    let mut stage = vec![usize::MAX; params.len()];
    let mut mark = |k: usize| {
        for (i, p) in params.iter().enumerate() {
            if stage[i] == usize::MAX && p.grad().defined() {
                stage[i] = k;
            }
        }
    };
    out.nll_loss(&y).backward();
    mark(cuts.len());
    for k in (0..cuts.len()).rev() {
        backward_through_cut(&cuts[k]);
        mark(k);
    }
    // A parameter no stage reached is reduced last (FlatGrads::attach then names it).
    let stages = cuts.len() + 1;
    (stage.into_iter().map(|s| if s == usize::MAX { 0 } else { s }).collect(), stages)
}

/// The order in which parameters' gradients become final: later stages first, and
/// within a stage the later-registered parameter first.
pub(crate) fn ready_order(stage_of: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..stage_of.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(stage_of[i]), std::cmp::Reverse(i)));
    order
}

/// When each bucket leaves, and where backward is cut for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LaunchPlan {
    /// Stages of the model's forward pass.
    pub stages: usize,
    /// `launch_after[k]`: the buckets whose last gradient is made by stage k's backward.
    pub launch_after: Vec<Vec<usize>>,
    /// Stage boundaries backward is cut at (ascending): only those where a bucket becomes
    /// ready, since every other cut would cost an extra pass over an activation and hide
    /// nothing. Buckets ready only when backward ends (stage 0) go in `finish`.
    pub cut_at: Vec<usize>,
}

impl LaunchPlan {
    pub(crate) fn new(stage_of: &[usize], stages: usize, plan: &BucketPlan) -> LaunchPlan {
        let mut launch_after: Vec<Vec<usize>> = vec![Vec::new(); stages];
        for (b, members) in plan.buckets.iter().enumerate() {
            launch_after[members.iter().map(|&p| stage_of[p]).min().unwrap_or(0)].push(b);
        }
        let cut_at = (1..stages).filter(|&k| !launch_after[k].is_empty()).collect();
        LaunchPlan {
            stages,
            launch_after,
            cut_at,
        }
    }

    /// True when some bucket is ready before backward ends, so there is something to overlap.
    pub(crate) fn can_overlap(&self) -> bool {
        !self.cut_at.is_empty()
    }

    /// Segments backward runs in with overlap.
    pub(crate) fn segments(&self) -> usize {
        self.cut_at.len() + 1
    }

    /// Why overlap has nothing to do, for the run's notes.
    pub(crate) fn why_not(&self, plan: &BucketPlan, bucket_mb: f64) -> String {
        if plan.buckets.len() == 1 {
            format!(
                "overlap off: all {:.1} MB of gradients fit one {} MiB bucket, ready only when backward ends; lower --bucket-mb to overlap",
                plan.total_bytes() as f64 / 1e6,
                bucket_mb
            )
        } else {
            "overlap off: every gradient bucket is ready only when backward ends (the first stage holds them all)".into()
        }
    }
}

/// One forward pass cut where [`LaunchPlan::cut_at`] says, and its staged backward.
pub(crate) struct StagedPass<'p> {
    plan: &'p LaunchPlan,
    cuts: Vec<Cut>,
}

impl<'p> StagedPass<'p> {
    pub(crate) fn new(plan: &'p LaunchPlan) -> StagedPass<'p> {
        StagedPass { plan, cuts: Vec::new() }
    }

    /// The forward pass, cut at the plan's boundaries.
    pub(crate) fn forward(&mut self, net: &dyn Net, x: &Tensor, train: bool) -> Tensor {
        let mut boundary = 0usize;
        let (cut_at, cuts) = (&self.plan.cut_at, &mut self.cuts);
        net.forward_cut(x, train, &mut |h| {
            boundary += 1;
            if cut_at.contains(&boundary) {
                cut(h, cuts)
            } else {
                h
            }
        })
    }

    /// Backward from `loss`, segment by segment from the last: the buckets a segment
    /// completed leave before the backward of the segment below it starts.
    pub(crate) fn backward(self, loss: &Tensor, reducer: &mut dyn GradientReducer) -> Result<()> {
        loss.backward();
        for j in (0..self.cuts.len()).rev() {
            let upper = self.plan.cut_at.get(j + 1).copied().unwrap_or(self.plan.stages);
            for &b in self.plan.launch_after[self.plan.cut_at[j]..upper].iter().flatten() {
                reducer.launch(b)?;
            }
            backward_through_cut(&self.cuts[j]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::ReduceDtype;

    #[test]
    fn buckets_leave_after_the_stage_that_completes_them() {
        // Parameters 0..5 made by stages [0, 0, 1, 2, 2, 3]; ready order: 5, 4, 3, 2, 1, 0.
        let stage_of = [0, 0, 1, 2, 2, 3];
        assert_eq!(ready_order(&stage_of), vec![5, 4, 3, 2, 1, 0]);
        let plan = BucketPlan::in_order(&[1; 6], &[ReduceDtype::Fp32; 6], &ready_order(&stage_of), 8);
        assert_eq!(plan.buckets, vec![vec![5, 4], vec![3, 2], vec![1, 0]]);
        let lp = LaunchPlan::new(&stage_of, 4, &plan);
        // Bucket 0 is complete once stage 2 ran backward, bucket 1 after stage 1, bucket 2 at the end.
        assert_eq!(lp.launch_after, vec![vec![2], vec![1], vec![0], vec![]]);
        assert_eq!(lp.cut_at, vec![1, 2]);
        assert!(lp.can_overlap());
        assert_eq!(lp.segments(), 3);
    }

    #[test]
    fn one_bucket_has_nothing_to_overlap_and_says_why() {
        let stage_of = [0, 1, 2];
        let plan = BucketPlan::in_order(&[1, 1, 1], &[ReduceDtype::Fp32; 3], &ready_order(&stage_of), 1 << 20);
        let lp = LaunchPlan::new(&stage_of, 3, &plan);
        assert!(!lp.can_overlap());
        assert!(lp.why_not(&plan, 25.0).contains("lower --bucket-mb"));
    }
}
