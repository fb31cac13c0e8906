#!/usr/bin/env python3
"""PyTorch DDP reference for ddpbench's mnist-cnn: the peer a user would pick instead.

Same network (PyTorch examples/mnist Net), same data (Fashion-MNIST IDX from Debian's
dataset-fashion-mnist, normalised and held in one tensor, as ddpbench does), same
sharding (DistributedSampler), same batch per rank, same threads per rank, SGD with
momentum. Launch with torchrun (or with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT set per process, as `ddpbench study` with `peer = "pytorch-ddp"` does);
backend gloo on CPU, nccl on GPU. Times every step (forward; backward with DDP's
all-reduce inside it; optimizer) and writes one CSV per rank, and on rank 0 peer.json
(torch version, backend, device, parameter count):

  torchrun --nproc_per_node 2 benchmarks/pytorch_ddp_mnist.py --max-steps 200 --out DIR
"""
import argparse, csv, gzip, json, os, struct, time

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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--synthetic", action="store_true", help="random data instead of files")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--no-dropout", action="store_true", help="dropout off, as ddpbench --no-dropout")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-ddp", action="store_true", help="no DDP wrapper: each process trains alone (the floor under DDP)")
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

    os.makedirs(a.out, exist_ok=True)
    if rank == 0:
        with open(os.path.join(a.out, "peer.json"), "w") as pj:
            json.dump({"torch_version": torch.__version__, "backend": dist.get_backend(), "device": str(device),
                       "parameters": sum(t.numel() for t in model.parameters()), "world_size": world}, pj)
    f = open(os.path.join(a.out, f"rank-{rank:05d}.csv"), "w", newline="")
    w = csv.writer(f)
    w.writerow(["rank", "epoch", "step", "global_step", "step_start_at_s", "samples", "data_s", "forward_s",
                "fwd_bwd_comm_s", "optimizer_s", "step_s", "loss"])
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    step = 0
    epoch = 0
    dist.barrier()
    start = time.perf_counter()
    while step < a.max_steps:
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)))
        for in_epoch, chunk in enumerate(idx.split(a.batch_size)):
            if step >= a.max_steps:
                break
            t0 = time.perf_counter()
            xb, yb = x.index_select(0, chunk).to(device), y.index_select(0, chunk).to(device)
            sync()
            t1 = time.perf_counter()
            loss = F.nll_loss(ddp(xb), yb)
            sync()
            tf = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad()
            sync()
            t3 = time.perf_counter()
            lv = loss.item()
            t4 = time.perf_counter()
            w.writerow([rank, epoch, in_epoch, step, f"{t0-start:.9f}", len(chunk), f"{t1-t0:.9f}", f"{tf-t1:.9f}",
                        f"{t2-t1:.9f}", f"{t3-t2:.9f}", f"{t4-t0:.9f}", f"{lv:.6f}"])
            step += 1
        epoch += 1
    f.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
