//! Set-up checks of a TorchScript model (`--model net.pt`) that need the group: the
//! same file on every rank, and a first forward and backward at the batches a step sees,
//! so that a module that does not fit the data stops every rank with one message.

use super::config::TrainConfig;
use crate::data::Dataset;
use crate::model::{self, ModelSpec};
use crate::world::{agree, Group};
use anyhow::Result;

/// Err when this rank read another file than rank 0 (a collective: every rank takes part).
pub(super) fn same_file_everywhere(g: &Group, sha256: &str) -> Result<()> {
    let all = crate::world::all_strings(g, sha256);
    match all.first() {
        Some(first) if first != sha256 => anyhow::bail!(
            "rank {} ({}) read a --model file whose SHA-256 is {sha256}, rank 0's is {first}: every rank must \
             read the same file (copy it to every node, or put it on a shared file system)",
            g.rank,
            g.host
        ),
        _ => Ok(()),
    }
}

/// A TorchScript model's first forward and backward, on every rank alike, at each batch a
/// step will see (the per-rank batch, and the shorter last batch of an epoch when there is
/// one): the module takes the data's shape and returns what the loss needs, or every rank
/// stops with the one message.
pub(super) fn check_script(
    g: &Group,
    cfg: &TrainConfig,
    script: &model::script::ScriptNet,
    spec: &ModelSpec,
    dataset: &Dataset,
    device: tch::Device,
) -> Result<()> {
    let batch = cfg.schedule.batch_size;
    let mut batches = vec![batch];
    if dataset.stream.is_none() {
        let last = dataset.train.len().div_ceil(g.size) % batch;
        if last > 0 {
            batches.push(last);
        }
    }
    if dataset.classes > spec.classes {
        return agree(
            g,
            Err(anyhow::anyhow!(
                "--dataset {} has {} classes; --num-classes {} is fewer: the labels would fall outside the logits",
                dataset.name,
                dataset.classes,
                spec.classes
            )),
        );
    }
    for b in batches {
        agree(g, model::script::check_first_forward(script, &spec.input, b as i64, device))?;
    }
    Ok(())
}
