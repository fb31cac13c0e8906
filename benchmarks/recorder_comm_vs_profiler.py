#!/usr/bin/env python3
"""The recorder's all-reduce time against torch.profiler's, in one run: mnist-cnn on
Fashion-MNIST (benchmarks/pytorch_ddp_mnist.py's network and data), DDP over gloo on
CPU, with ddpbench_record, and torch.profiler recording the steps after the warm-up.
Each rank prints one line of JSON: the recorder's mean `comm_s` over those steps (its
rank file) and the profiler's, the union of the intervals of its all-reduce events
(gloo's `gloo:all_reduce`, from the call to the work's completion) per step.

  PYTHONPATH=python torchrun --nproc-per-node 2 benchmarks/recorder_comm_vs_profiler.py --out DIR
"""
import csv
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorder_overhead import arguments, workload  # noqa: E402


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
    a = arguments(60).parse_args()
    ddp, opt, batches = workload(a)
    rank = dist.get_rank()

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
