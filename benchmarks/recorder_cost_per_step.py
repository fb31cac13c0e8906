#!/usr/bin/env python3
"""The recorder's own time per step, on a step that is almost nothing else: a 16x4
linear layer, batch 8, DDP over gloo with 1 rank, 3000 steps with and without
ddpbench_record, 6 pairs in alternating order. Prints each pair's mean step and the
difference, then the median difference: the recorder's hooks, row and generator per
step, in microseconds (an absolute cost, to set beside a workload's step).

  PYTHONPATH=python python benchmarks/recorder_cost_per_step.py
"""
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import ddpbench_record

STEPS = 3000
PAIRS = 6


def run(on, out, x, y):
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    rec = ddpbench_record.Recorder(ddp, opt, out=out, batch_size=8, model_name="lin", dataset_name="r",
                                   clock_sync="ends") if on else None
    batches = [(x, y)] * STEPS
    loop = rec.batches(batches) if rec else iter(batches)
    t = time.perf_counter()
    for xb, yb in loop:
        opt.zero_grad()
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        rec.loss(loss) if rec else loss.item()
    dt = (time.perf_counter() - t) / STEPS
    if rec:
        rec.close()
    return dt


def main():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29577"), RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    d = tempfile.mkdtemp()
    diffs = []
    for i in range(PAIRS):
        r = {}
        for on in ([False, True] if i % 2 == 0 else [True, False]):
            r[on] = run(on, f"{d}/r{i}", x, y)
        diffs.append(r[True] - r[False])
        print(f"pair {i + 1}: without {r[False] * 1e6:.1f} us, with {r[True] * 1e6:.1f} us, difference {diffs[-1] * 1e6:.1f} us")
    s = sorted(diffs)
    print(f"median difference {(s[PAIRS // 2 - 1] + s[PAIRS // 2]) / 2 * 1e6:.1f} us per step, range {s[0] * 1e6:.1f} to {s[-1] * 1e6:.1f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
