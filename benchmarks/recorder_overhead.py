#!/usr/bin/env python3
"""The recorder's cost: benchmarks/pytorch_ddp_mnist.py's network and data (mnist-cnn on
Fashion-MNIST, SGD with momentum, DDP over gloo on CPU), trained with or without
ddpbench_record. Rank 0 prints one line of JSON: the mean step over the steps after the
warm-up, from a barrier before them to a barrier after them, timed the same way in both
modes (the recorder's construction and close are outside it).

  torchrun --nproc-per-node 2 benchmarks/recorder_overhead.py --recorder on --out DIR
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_ddp_mnist import Net, read_idx  # noqa: E402


def arguments(steps):
    """The workload's flags; `steps` is the default number of steps."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="the run folder (with the recorder)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--warmup", type=int, default=20)
    return p


def workload(a):
    """One thread, the gloo process group, and on this rank: the DDP model, its
    optimizer and a function giving the rank's batches (its shard of the data)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    path = lambda s: os.path.join(a.data_dir, s + ".gz")  # noqa: E731
    x = torch.from_numpy(read_idx(path("train-images-idx3-ubyte")).copy()).float().div_(255).sub_(0.2860).div_(0.3530).unsqueeze(1)
    y = torch.from_numpy(read_idx(path("train-labels-idx1-ubyte")).astype(np.int64))
    ddp = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    sampler = torch.utils.data.distributed.DistributedSampler(range(len(y)), num_replicas=world, rank=rank, seed=1)
    idx = torch.tensor(list(iter(sampler)))[: a.steps * a.batch_size]

    def batches():
        for chunk in idx.split(a.batch_size):
            yield x.index_select(0, chunk), y.index_select(0, chunk)

    return ddp, opt, batches


def main():
    p = arguments(150)
    p.add_argument("--recorder", choices=["on", "off"], required=True)
    a = p.parse_args()
    ddp, opt, batches = workload(a)
    rank = dist.get_rank()
    rec = None
    if a.recorder == "on":
        import ddpbench_record

        rec = ddpbench_record.Recorder(ddp, opt, out=a.out, batch_size=a.batch_size, model_name="mnist-cnn",
                                       dataset_name="fashion-mnist", warmup_steps=a.warmup)
    loop = rec.batches(batches()) if rec else batches()
    start = None
    for step, (xb, yb) in enumerate(loop):
        if step == a.warmup:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        loss = F.nll_loss(ddp(xb), yb)
        loss.backward()
        opt.step()
        if rec:
            rec.loss(loss)
        else:
            loss.item()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rec:
        rec.close()
    if rank == 0:
        print(json.dumps({"recorder": a.recorder, "steps": a.steps - a.warmup, "mean_step_s": elapsed / (a.steps - a.warmup)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
