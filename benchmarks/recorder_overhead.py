#!/usr/bin/env python3
"""The recorder's cost: benchmarks/pytorch_ddp_mnist.py's network and data (mnist-cnn on
Fashion-MNIST, SGD with momentum, DDP over gloo on CPU), trained with or without
ddpbench_record. Two designs:

--design pairs (one side per run): rank 0 prints one line of JSON, the mean step over the
steps after the warm-up, from a barrier before them to a barrier after them, timed the
same way in both modes (the recorder's construction and close are outside it).

  torchrun --nproc-per-node 2 benchmarks/recorder_overhead.py --recorder on --out DIR

--design blocks (both sides in one run): two DDP replicas of the same initial network on
the one process group, one with the recorder, one plain, each with its own optimizer.
The run trains blocks of --block-steps steps, alternating between them; a pair of blocks
trains both replicas on the same batches, in the order on-off, off-on, on-off, ... from
pair to pair. Each block runs between two barriers and rank 0 times it, the same code for
both replicas. Every block of the recorded replica is one `rec.batches()` call, so its
steps end inside the block and the other replica's block falls between two of its epochs,
in no step. With --both-plain neither replica is recorded: the ratios then show what
the design itself reads between two identical replicas. Rank 0 prints one JSON line per pair after the warm-up pairs, then one line
checking the run folder (rows per rank, phases adding up to step_s, and each block's rows
against the block's own time).

  torchrun --nproc-per-node 2 benchmarks/recorder_overhead.py --design blocks --out DIR
"""
import argparse
import copy
import csv
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
    idx = torch.tensor(list(iter(sampler)))

    def batches(first=0, count=None):
        """The batches of steps first .. first+count-1 (a.steps steps by default), the
        shard taken again from its start when the steps outrun it."""
        count = a.steps if count is None else count
        start, n = first * a.batch_size % len(idx), count * a.batch_size
        order = idx.repeat(-(-(start + n) // len(idx)))[start : start + n]
        for chunk in order.split(a.batch_size):
            yield x.index_select(0, chunk), y.index_select(0, chunk)

    return ddp, opt, batches


def recorder(a, ddp, opt, warmup):
    import ddpbench_record

    # Clock offsets at the start and close only: an epoch-end estimate would fall inside
    # the timed blocks (and the pairs design's timed loop), which the plain replica lacks.
    return ddpbench_record.Recorder(ddp, opt, out=a.out, batch_size=a.batch_size, model_name="mnist-cnn",
                                    dataset_name="fashion-mnist", warmup_steps=warmup, clock_sync="ends")


def pairs_design(a):
    """One side of a pair: this run with or without the recorder."""
    ddp, opt, batches = workload(a)
    rank = dist.get_rank()
    rec = recorder(a, ddp, opt, a.warmup) if a.recorder == "on" else None
    loop = rec.batches(batches()) if rec else batches()
    start = None
    for step, (xb, yb) in enumerate(loop):
        if step == a.warmup:
            dist.barrier()
            start = time.perf_counter()
        train_step(ddp, opt, xb, yb, rec)
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rec:
        rec.close()
    if rank == 0:
        print(json.dumps({"recorder": a.recorder, "steps": a.steps - a.warmup, "mean_step_s": elapsed / (a.steps - a.warmup)}))


def train_step(ddp, opt, xb, yb, rec):
    """One step, the same with and without the recorder: with it the loss is handed to
    `rec` (read when its row is written), without it read here, so both read it once."""
    opt.zero_grad()
    loss = F.nll_loss(ddp(xb), yb)
    loss.backward()
    opt.step()
    if rec:
        rec.loss(loss)
    else:
        loss.item()


def timed_block(ddp, opt, loop, rec):
    """Seconds from a barrier before the block's steps to a barrier after them: the same
    code for both replicas, `rec` None for the plain one."""
    dist.barrier()
    t = time.perf_counter()
    for xb, yb in loop:
        train_step(ddp, opt, xb, yb, rec)
    dist.barrier()
    return time.perf_counter() - t


def check_folder(out, world, steps, on_blocks):
    """What the run folder holds: rows per rank, the largest |sum of phases - step_s|,
    and per block of the recorded replica, rank 0's summed step_s over the block's time."""
    from ddpbench_record.columns import PHASES

    rows, worst = [], 0.0
    step_sum = {}
    for r in range(world):
        with open(os.path.join(out, f"rank-{r:05d}.csv")) as f:
            got = list(csv.DictReader(f))
        rows.append(len(got))
        for row in got:
            step_s = float(row["step_s"])
            worst = max(worst, abs(sum(float(row[p]) for p in PHASES) - step_s))
            if r == 0:
                step_sum[int(row["epoch"])] = step_sum.get(int(row["epoch"]), 0.0) + step_s
    cover = sorted(step_sum[e] / block_s for e, block_s in on_blocks.items())
    return {
        "check": "run folder", "rows_per_rank": rows, "rows_expected": steps,
        "max_phase_sum_error_s": worst,
        "rows_over_block_min": cover[0], "rows_over_block_median": cover[len(cover) // 2],
        "rows_over_block_max": cover[-1],
    }


def blocks_design(a):
    """Both sides in one run: blocks of steps alternating between a recorded and a plain
    replica (see the module's docstring)."""
    total = a.warmup_pairs + a.pairs
    a.steps = total * a.block_steps
    ddp, opt, batches = workload(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    # The plain replica starts from the recorded one's weights; each has its own
    # optimizer and state, and DDP's construction broadcasts rank 0's weights.
    plain = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(ddp.module))
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
    rec = None if a.both_plain else recorder(a, ddp, opt, a.warmup_pairs * a.block_steps)
    on_blocks = {}
    for pair in range(total):
        # The pair's batches, built before its blocks and given to both replicas.
        block = list(batches(pair * a.block_steps, a.block_steps))
        seconds = {}
        for mode in (("on", "off") if pair % 2 == 0 else ("off", "on")):
            if mode == "on" and rec is None:
                seconds["on"] = timed_block(ddp, opt, iter(block), None)
            elif mode == "on":
                seconds["on"] = timed_block(ddp, opt, rec.batches(block), rec)
                on_blocks[rec.epoch] = seconds["on"]
            else:
                seconds["off"] = timed_block(plain, plain_opt, iter(block), None)
        if rank == 0 and pair >= a.warmup_pairs:
            print(json.dumps({"pair": pair - a.warmup_pairs + 1, "first": "on" if pair % 2 == 0 else "off",
                              "steps": a.block_steps, "on_s": seconds["on"], "off_s": seconds["off"]}), flush=True)
    if rec is None:
        return
    rec.close()
    if rank == 0:
        kept = {e: s for e, s in on_blocks.items() if e >= a.warmup_pairs}
        print(json.dumps(check_folder(rec.dir, world, a.steps, kept)), flush=True)


def main():
    p = arguments(150)
    p.add_argument("--design", choices=["pairs", "blocks"], default="pairs",
                   help="pairs: one side per run (--recorder); blocks: both sides alternating in this run")
    p.add_argument("--recorder", choices=["on", "off"], help="with --design pairs: this run's side")
    p.add_argument("--pairs", type=int, default=60, help="with --design blocks: pairs of blocks timed")
    p.add_argument("--block-steps", type=int, default=10, help="with --design blocks: steps per block")
    p.add_argument("--warmup-pairs", type=int, default=3, help="with --design blocks: first pairs left out")
    p.add_argument("--both-plain", action="store_true",
                   help="with --design blocks: the 'on' replica without the recorder too, to see the design's own bias")
    a = p.parse_args()
    if a.design == "pairs":
        if a.recorder is None:
            p.error("--design pairs needs --recorder on or --recorder off")
        pairs_design(a)
    else:
        blocks_design(a)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
