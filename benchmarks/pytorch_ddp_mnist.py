#!/usr/bin/env python3
"""PyTorch DDP reference for ddpbench's mnist-cnn: the peer a user would pick instead.

Same network (PyTorch examples/mnist Net), same data (Fashion-MNIST IDX from Debian's
dataset-fashion-mnist, normalised and held in one tensor, as ddpbench does), same
sharding (DistributedSampler), same batch per rank, same threads per rank, SGD with
momentum. Launch with torchrun (or with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT set per process, as `ddpbench study` with `peer = "pytorch-ddp"` does);
backend gloo on CPU, nccl on GPU. Every step is timed by ddpbench_record's Recorder
(python/ddpbench_record: hooks on the DDP model, its optimizer and its all-reduce), which
writes `rank-NNNNN.csv` in ddpbench's columns into --out; with --peer-json, rank 0 also
writes what the run found (torch version, backend, device, parameters, gradient bytes,
bucket bytes) there:

  torchrun --nproc_per_node 2 benchmarks/pytorch_ddp_mnist.py --max-steps 200 --out DIR
  ddpbench reduce DIR

With --no-ddp there is no DDP model to hook: each process trains alone (the floor under
DDP) and writes `rank-NNNNN.csv` with rank, global_step and step_s only.
"""
import argparse, csv, gzip, json, os, struct, sys, time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, dropout=True):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25 if dropout else 0.0)
        self.dropout2 = nn.Dropout(0.5 if dropout else 0.0)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    nd = magic & 0xFF
    dims = struct.unpack(">" + "I" * nd, data[4 : 4 + 4 * nd])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


def import_recorder():
    """ddpbench_record as this script finds it: beside it (a study's run copies the
    package into the run's peer/ folder, next to this script), installed, or in the
    repository's python/ folder."""
    try:
        import ddpbench_record
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import ddpbench_record
    return ddpbench_record


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--synthetic", action="store_true", help="random data instead of files")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--warmup-steps", type=int, default=5, help="first steps marked warm-up in the rank files")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--no-dropout", action="store_true", help="dropout off, as ddpbench --no-dropout")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-ddp", action="store_true", help="no DDP wrapper: each process trains alone (the floor under DDP)")
    p.add_argument("--node-type", default=None, help="the node type the rank files name (default: the recorder's own)")
    p.add_argument("--caller-holds-folder", action="store_true",
                   help="--out exists, locked, with its manifest written by the caller (ddpbench study)")
    p.add_argument("--peer-json", default=None, help="rank 0 writes what the run found here (JSON)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    torch.manual_seed(a.seed)

    if a.synthetic:
        x = torch.randn(60000, 1, 28, 28)
        y = torch.randint(0, 10, (60000,))
    else:
        name = lambda s: os.path.join(a.data_dir, s + ".gz") if os.path.exists(os.path.join(a.data_dir, s + ".gz")) else os.path.join(a.data_dir, s)
        x = torch.from_numpy(read_idx(name("train-images-idx3-ubyte")).copy()).float().div_(255).sub_(0.2860).div_(0.3530).unsqueeze(1)
        y = torch.from_numpy(read_idx(name("train-labels-idx1-ubyte")).astype(np.int64))

    model = Net(dropout=not a.no_dropout).to(device)
    ddp = model if a.no_ddp else nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    sampler = torch.utils.data.distributed.DistributedSampler(range(len(y)), num_replicas=world, rank=rank, shuffle=True, seed=a.seed)

    def epochs():
        """Per epoch, its batches (the rank's shard in batches, on the host), up to --max-steps in all."""
        left, epoch = a.max_steps, 0
        while left > 0:
            sampler.set_epoch(epoch)
            chunks = torch.tensor(list(iter(sampler))).split(a.batch_size)[:left]
            left -= len(chunks)
            epoch += 1
            yield ((x.index_select(0, c), y.index_select(0, c)) for c in chunks)

    if a.no_ddp:
        floor(a, rank, ddp, opt, epochs(), device)
    else:
        record(a, rank, ddp, model, opt, epochs(), device)
    dist.destroy_process_group()


def record(a, rank, ddp, model, opt, epochs, device):
    """Trains through the recorder, which times every step into --out."""
    ddpbench_record = import_recorder()
    print(f"ddpbench_record from {os.path.dirname(ddpbench_record.__file__)}", flush=True)
    rec = ddpbench_record.Recorder(
        ddp, opt, out=a.out, batch_size=a.batch_size, model_name="mnist-cnn",
        dataset_name="synthetic" if a.synthetic else "fashion-mnist", node_type=a.node_type,
        warmup_steps=a.warmup_steps, caller_holds_folder=a.caller_holds_folder,
    )
    for batches in epochs:
        for xb, yb in rec.batches(batches, device=device):
            loss = F.nll_loss(ddp(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.loss(loss)
    rec.close()
    if rank == 0 and a.peer_json:
        with open(a.peer_json, "w") as pj:
            json.dump({"torch_version": torch.__version__, "backend": dist.get_backend(), "device": str(device),
                       "parameters": sum(t.numel() for t in model.parameters()),
                       "gradient_bytes": rec.gradient_bytes, "bucket_bytes": rec.bucket_bytes}, pj)


def floor(a, rank, net, opt, epochs, device):
    """Trains without DDP, timing each step itself (no all-reduce, nothing to hook)."""
    os.makedirs(a.out, exist_ok=True)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with open(os.path.join(a.out, f"rank-{rank:05d}.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rank", "global_step", "step_s"])
        step = 0
        dist.barrier()
        for batches in epochs:
            t0 = time.perf_counter()
            for xb, yb in batches:
                xb, yb = xb.to(device), yb.to(device)
                F.nll_loss(net(xb), yb).backward()
                opt.step()
                opt.zero_grad()
                sync()
                t1 = time.perf_counter()
                w.writerow([rank, step, f"{t1 - t0:.9f}"])
                step, t0 = step + 1, t1


if __name__ == "__main__":
    main()
