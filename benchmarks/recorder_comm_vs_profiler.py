#!/usr/bin/env python3
"""The recorder's all-reduce time against torch.profiler's, in one run: mnist-cnn on
Fashion-MNIST (benchmarks/pytorch_ddp_mnist.py's network and data), DDP over gloo on
CPU, with ddpbench_record, and torch.profiler recording the steps after the warm-up.
Each rank prints one line of JSON: the recorder's mean `comm_s` over those steps (its
rank file) and the profiler's, the union of the intervals of its all-reduce events
(gloo's `gloo:all_reduce`, from the call to the work's completion) per step.

  PYTHONPATH=python torchrun --nproc-per-node 2 benchmarks/recorder_comm_vs_profiler.py --out DIR
"""
import argparse
import csv
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_ddp_mnist import Net, read_idx  # noqa: E402


def union_s(intervals):
    """Seconds covered by the (start_us, end_us) intervals, overlaps counted once."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="the run folder")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20)
    a = p.parse_args()
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

    import ddpbench_record

    rec = ddpbench_record.Recorder(ddp, opt, out=a.out, batch_size=a.batch_size, model_name="mnist-cnn",
                                   dataset_name="fashion-mnist", warmup_steps=a.warmup)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for step, (xb, yb) in enumerate(rec.batches(batches())):
        if step == a.warmup:
            prof.start()
        opt.zero_grad()
        loss = F.nll_loss(ddp(xb), yb)
        loss.backward()
        opt.step()
        rec.loss(loss)
    prof.stop()
    rec.close()
    events = [e for e in prof.events() if "all_reduce" in e.name]
    profiled = union_s([(e.time_range.start, e.time_range.end) for e in events]) / (a.steps - a.warmup)
    with open(os.path.join(a.out, f"rank-{rank:05d}.csv")) as f:
        rows = [r for r in csv.DictReader(f) if int(r["global_step"]) >= a.warmup]
    recorded = sum(float(r["comm_s"]) for r in rows) / len(rows)
    print(json.dumps({"rank": rank, "steps": len(rows), "profiler_events": len(events),
                      "profiler_allreduce_s_per_step": profiled, "recorder_comm_s_per_step": recorded,
                      "ratio": recorded / profiled if profiled else None}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
