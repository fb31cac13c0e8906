//! `link_model.json`: the link models `ddpbench allreduce` fitted, one per route swept,
//! as `reduce` and `study` read them back.

use super::model::LinkModel;
use crate::record::{Backend, DeviceKind, Memory};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What one part of an all-reduce sweep runs with: a backend (the one training names the
/// same way) and where the buffers live. MPI on device memory is the CPU-staged path
/// (device → pinned host → MPI → device) that `train --allreduce mpi` runs on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub backend: Backend,
    pub memory: Memory,
}

impl Route {
    /// In a sentence: `mpi on host memory`.
    pub(crate) fn label(self) -> String {
        format!("{} on {} memory", self.backend, self.memory.name())
    }
}

/// `link_model.json` (`allreduce_model.json` before schema 4): the link model, α–β fits
/// per level, of each route swept. "Model" alone is the network trained.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkModelFile {
    pub formula: String,
    pub models: Vec<RouteLinkModel>,
}

/// The fits of one all-reduce path: a backend, and where its buffers lived.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "RouteLinkModelAsRead")]
pub struct RouteLinkModel {
    pub backend: Backend,
    pub memory: Memory,
    #[serde(flatten)]
    pub model: LinkModel,
}

impl RouteLinkModel {
    pub(crate) fn route(&self) -> Route {
        Route {
            backend: self.backend,
            memory: self.memory,
        }
    }
}

/// A [`RouteLinkModel`] as any schema wrote it: before schema 4, `backend` was `mpi` (host
/// buffers), `staged` (device buffers through host) or `nccl`, and `memory` was absent.
#[derive(Deserialize)]
struct RouteLinkModelAsRead {
    backend: String,
    memory: Option<Memory>,
    #[serde(flatten)]
    model: LinkModel,
}

impl TryFrom<RouteLinkModelAsRead> for RouteLinkModel {
    type Error = String;

    fn try_from(m: RouteLinkModelAsRead) -> std::result::Result<RouteLinkModel, String> {
        let backend = Backend::from_name(&m.backend).map_err(|e| format!("backend {e}"))?;
        let memory = match (m.memory, m.backend.as_str(), backend) {
            (Some(memory), _, _) => memory,
            (None, "staged", _) | (None, _, Backend::Nccl) => Memory::Device,
            (None, _, _) => Memory::Host,
        };
        Ok(RouteLinkModel {
            backend,
            memory,
            model: m.model,
        })
    }
}

impl LinkModelFile {
    /// Reads `link_model.json` (or a folder's `allreduce_model.json`, its name before
    /// schema 4) from a file or a sweep folder, no larger than
    /// [`crate::bounds::LINK_MODEL`], and checks every fit ([`LinkModel::check`]);
    /// Err names the file, and the key that no link has.
    pub(crate) fn read(path: &Path) -> Result<LinkModelFile> {
        let file = if path.is_dir() {
            link_model_path(path).unwrap_or_else(|| path.join(LINK_MODEL_FILE))
        } else {
            path.to_path_buf()
        };
        let text = crate::bounds::read_json_text(&file, crate::bounds::LINK_MODEL)
            .map_err(|e| anyhow::anyhow!("{e} (a folder written by `ddpbench allreduce` holds it)"))?;
        let mf: LinkModelFile = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a link model written by `ddpbench allreduce`", file.display()))?;
        for (i, m) in mf.models.iter().enumerate() {
            m.model
                .check()
                .map_err(|e| anyhow::anyhow!("{}: models[{i}] ({}): {e}: the file is damaged", file.display(), m.backend))?;
        }
        Ok(mf)
    }

    /// The model for a run that all-reduced with `backend` from gradients on `device`.
    pub(crate) fn for_run(&self, backend: Backend, device: DeviceKind) -> Option<&RouteLinkModel> {
        let memory = Memory::of_device(device);
        self.models.iter().find(|m| m.backend == backend && m.memory == memory)
    }

    /// The model for the run of `manifest`: its backend, from rank 0's device; else what
    /// is missing and the sweep that measures it.
    pub(crate) fn for_manifest(&self, manifest: &crate::record::Manifest) -> Result<&RouteLinkModel, String> {
        let device = DeviceKind::of_ranks(manifest.ranks.get(..1).unwrap_or_default());
        self.for_run(manifest.comm_backend, device).ok_or_else(|| {
            let (backend, memory) = (manifest.comm_backend, Memory::of_device(device));
            let flag = if memory == Memory::Device { " --device cuda" } else { "" };
            format!(
                "no link model for its all-reduce ({backend} on {} memory): sweep it with `ddpbench allreduce --backends {backend}{flag}`",
                memory.name()
            )
        })
    }
}

/// The link model's file in a sweep folder.
pub const LINK_MODEL_FILE: &str = "link_model.json";

/// The link model's file in sweep folder `dir`, under its name or the one before schema 4
/// (`allreduce_model.json`); None when there is neither.
pub fn link_model_path(dir: &Path) -> Option<PathBuf> {
    [LINK_MODEL_FILE, "allreduce_model.json"]
        .iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link model file of the schema-3 binary (`mpi` on host memory, `staged` from a
    /// GPU's memory) joins runs as before: a CPU run to the host fit, a GPU run with
    /// `--allreduce mpi` to the staged one; a new file says `memory` itself.
    #[test]
    fn old_model_files_map_staged_to_mpi_on_device_memory() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/sweep/allreduce_model.json");
        let mut file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        let mut staged = file["models"][0].clone();
        staged["backend"] = "staged".into();
        staged["intra"]["backend"] = "staged".into();
        staged["ranks_per_node"] = 7.into();
        file["models"].as_array_mut().unwrap().push(staged);
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("allreduce_model.json"), file.to_string()).unwrap();
        let mf = LinkModelFile::read(d.path()).unwrap();
        let cpu = mf.for_run(Backend::Mpi, DeviceKind::Cpu).unwrap();
        assert_eq!((cpu.memory, cpu.model.ranks_per_node), (Memory::Host, 2));
        let gpu = mf.for_run(Backend::Mpi, DeviceKind::Cuda).unwrap();
        assert_eq!((gpu.memory, gpu.model.ranks_per_node), (Memory::Device, 7));
        assert_eq!(gpu.model.intra.as_ref().unwrap().backend, Backend::Mpi);
        assert!(mf.for_run(Backend::Nccl, DeviceKind::Cuda).is_none());
        let written = serde_json::to_value(gpu).unwrap();
        assert_eq!(
            (written["backend"].as_str(), written["memory"].as_str()),
            (Some("mpi"), Some("device"))
        );
        // A name no schema wrote is refused, named.
        file["models"][0]["backend"] = "gloo".into();
        std::fs::write(d.path().join("allreduce_model.json"), file.to_string()).unwrap();
        let e = format!("{:#}", LinkModelFile::read(d.path()).unwrap_err());
        assert!(e.contains("\"gloo\": not an all-reduce"), "{e}");
    }
}
