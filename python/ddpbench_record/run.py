"""What a run folder says about the run: each rank's placement, the manifest, and the
comparison key that keeps these runs apart from ddpbench's own and from the study's twin."""

import os
import platform
import socket
import sys

import torch

from . import __version__

TRAINER = "pytorch-ddp-script"
# The launcher's variables a rank records (ddpbench records OMPI_COMM_WORLD_*, SLURM_*).
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_RANK")
LAUNCHER_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def physical_cores():
    """Physical cores of this node: distinct (package, core) pairs of /proc/cpuinfo."""
    pairs, package = set(), "0"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("physical id"):
                    package = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    pairs.add((package, line.split(":", 1)[1].strip()))
    except OSError:
        pass
    return len(pairs) or os.cpu_count() or 1


def memory_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / (1 << 30))
    except (OSError, ValueError):
        pass
    return 0


def gpu_labels():
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        name = p.name
        for prefix in ("NVIDIA ", "Tesla "):
            name = name.removeprefix(prefix) if hasattr(name, "removeprefix") else name
        name = name.replace(" ", "-")
        if "GB" not in name:
            name += f"-{round(p.total_memory / 1e9)}GB"
        out.append(name)
    return out


def node_type(gpus):
    """As ddpbench's `NodeInfo::node_type`: `<cpu> <cores>c <mem>GiB[ <n>x<gpu>]`."""
    s = f"{cpu_model()} {physical_cores()}c {memory_gib()}GiB"
    if gpus:
        s += f" {len(gpus)}x{gpus[0]}" if all(g == gpus[0] for g in gpus) else " " + "+".join(gpus)
    return s


def rank_info(rank, local_rank, device, label):
    """This rank's entry of the manifest's `ranks`."""
    gpus = gpu_labels()
    env = [[k, v] for k, v in sorted(os.environ.items()) if k in LAUNCHER_NAMES or k.startswith(LAUNCHER_PREFIXES)]
    return {
        "rank": rank,
        "local_rank": local_rank,
        "host": socket.gethostname(),
        "node_type": label or node_type(gpus),
        "device": f"Cuda({device.index or 0})" if device.type == "cuda" else "Cpu",
        "binding": "none (torchrun binds no cores)",
        "threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "gpus": gpus,
        "launcher_env": env,
        "nccl_env": [[k, v] for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")],
    }


def key(model_name, dataset_name, ranks, device, backend, ddp_options, bucket_mb, workers, grad_dtype, noise_every=0):
    """The comparison key (src/record/key.rs, `ComparisonKey`): `peer` names this
    trainer, so its runs pool only with each other; what the recorder cannot know (the
    optimizer's kind among ddpbench's, AMP) is left unrecorded (null)."""
    k = {
        "model": model_name,
        "dataset": dataset_name,
        "device": "cuda" if device.type == "cuda" else "cpu",
        "threads": sorted({r["threads"] for r in ranks}),
        "optimizer": None,
        "grad_accum": 1,
        "bucket_mb": bucket_mb,
        # DDP all-reduces each bucket as backward finishes it, on the backend's own thread.
        "overlap": "on",
        "grad_dtype": grad_dtype,
        "amp": None,
        "backend": backend,
        "workers": workers,
        "seq_len": None,
        "vocab_size": None,
        "malloc": None,
        "deterministic": None,
        "ddp_options": ddp_options,
        "peer": TRAINER,
    }
    if noise_every > 0:
        # As ddpbench's `--noise-scale every:K`; a 1-rank run keeps it, taking no norms,
        # so that it stays the reference of the N-rank runs that asked for the same.
        k["noise_scale"] = f"every:{noise_every}"
    return k


def command_line():
    return [sys.executable] + sys.argv


def versions():
    return {
        "ddpbench_version": f"ddpbench-record {__version__}",
        "libtorch_version": torch.__version__,
        "python_version": platform.python_version(),
        "cuda_version": torch.version.cuda,
    }
