#!/usr/bin/env python3
"""A small torchrun DDP script with the recorder: a two-layer network on synthetic
data, SGD, gloo on CPU (NCCL on GPUs). ddpbench's tests run it; it is also the shortest
example of the lines docs/your-pytorch-job.md adds to a script.

  torchrun --nproc-per-node 2 python/examples/ddp_toy.py --out results/toy
  ddpbench reduce results/toy
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddpbench_record


def check_norms(path, step, net, x, y):
    """Appends this step's two squared gradient norms, computed apart from the recorder:
    this rank's (a copy of the network, its own backward) and the ranks' mean (the
    gradients DDP left in the parameters)."""
    import copy
    import json

    twin = copy.deepcopy(net)
    local = torch.autograd.grad(F.cross_entropy(twin(x), y), list(twin.parameters()))
    row = {
        "step": step,
        "local": sum(float(g.double().pow(2).sum()) for g in local),
        "mean": sum(float(p.grad.double().pow(2).sum()) for p in net.parameters()),
    }
    with open(f"{path}-{dist.get_rank()}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--bucket-mb", type=float, default=0.25, help="small, so the model spans several buckets")
    p.add_argument("--crash-at", type=int, default=-1, help="raise at this global step (tests a run that did not end)")
    p.add_argument("--hold-s", type=float, default=0.0, help="sleep this long after the recorder starts (tests its lock)")
    p.add_argument("--caller-holds-folder", action="store_true", help="tests the recorder in a folder its caller holds")
    p.add_argument("--noise-every", type=int, default=0, help="the gradient noise scale's norms every K-th step")
    p.add_argument("--check-norms", default="", help="write the norms the script computes itself to PATH-RANK.jsonl "
                   "(tests the recorder's noise scale)")
    p.add_argument("--clock-sync", default="epochs", help="the recorder's clock_sync")
    p.add_argument("--scaler", action="store_true", help="train through a torch.amp.GradScaler (initial scale 2**16)")
    p.add_argument("--overflow-at", default="", help="steps (e.g. 0,3) whose loss is multiplied by inf, so that "
                   "the scaler skips them")
    p.add_argument("--misuse", choices=["none", "no-ddp", "no-optimizer", "no-sync", "backward-twice", "bad-scaler"], default="none")
    a = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(64, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(), nn.Linear(a.hidden, 10))
    net = net.to(device)
    ddp = DistributedDataParallel(net, device_ids=[local] if cuda else None, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    n = a.steps * a.batch_size * dist.get_world_size()
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=a.batch_size, sampler=DistributedSampler(data, shuffle=True))

    model = {"no-ddp": net}.get(a.misuse, ddp)
    optimizer = None if a.misuse == "no-optimizer" else opt
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16) if a.scaler else None
    overflow_at = {int(k) for k in a.overflow_at.split(",") if k}
    scaler = "a GradScaler" if a.misuse == "bad-scaler" else scaler
    rec = ddpbench_record.Recorder(model, optimizer, out=a.out, batch_size=a.batch_size, model_name="toy-mlp",
                                   dataset_name="synthetic-64", caller_holds_folder=a.caller_holds_folder,
                                   noise_every=a.noise_every, clock_sync=a.clock_sync, scaler=scaler)
    if a.hold_s > 0:
        print("recorder started", flush=True)
        import time

        time.sleep(a.hold_s)
    for step, (x, y) in enumerate(rec.batches(loader, device=device)):
        if step == a.crash_at:
            raise RuntimeError(f"crashed on purpose at step {step}")
        opt.zero_grad()
        if a.misuse == "no-sync":
            with ddp.no_sync():
                F.cross_entropy(ddp(x), y).backward()
        loss = F.cross_entropy(ddp(x), y)
        if a.misuse == "backward-twice":
            loss.backward(retain_graph=True)
        if scaler is not None:
            scaler.scale(loss * float("inf") if step in overflow_at else loss).backward()
            scaler.step(opt)
            scaler.update()
            rec.loss(loss)
            continue
        loss.backward()
        if a.check_norms and a.noise_every > 0 and step % a.noise_every == 0:
            check_norms(a.check_norms, step, net, x, y)
        opt.step()
        rec.loss(loss)
    rec.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
