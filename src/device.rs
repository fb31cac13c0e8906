//! Where a rank computes: the device choice, loading libtorch's CUDA backend, and
//! the synchronisation that makes a phase's wall time cover its device work.
use clap::ValueEnum;
use serde::Serialize;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceChoice {
    /// CUDA if libtorch sees a GPU, else CPU.
    Auto,
    Cpu,
    Cuda,
}
