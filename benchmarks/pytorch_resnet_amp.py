"""PyTorch eager reference for ddpbench's GPU step time (issue 5's goal: ddpbench's
ResNet-50 AMP step <= 1.0x this). One process, one GPU, no DDP: the same network
(torchvision), batch, optimizer (SGD, momentum 0.9), and ddpbench's synthetic data: a
pool of random-normal images held on the CPU (at most 256 MiB, as ddpbench's pool), each
step gathering a shuffled batch from it and copying it to the GPU inside the timed step;
fp16 autocast with GradScaler or bf16 autocast or fp32. Prints one JSON line: median, p95,
min and max step seconds, and the intra-op threads.

--memory-format channels-last (the default, as ddpbench's on a GPU) lays out the network
and each batch after its copy as torch.channels_last; --ddp wraps the network in
DistributedDataParallel on a 1-rank NCCL group (the peer of ddpbench --allreduce nccl at
1 rank); --pin-memory keeps the pool in page-locked memory and copies without blocking
(as ddpbench's batches prepared by --workers).

    python3 benchmarks/pytorch_resnet_amp.py --model resnet50 --batch-size 64 --amp fp16 --steps 60
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50", choices=["resnet18", "resnet50"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--amp", default="fp16", choices=["off", "fp16", "bf16"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--samples", type=int, default=4096, help="as ddpbench --synthetic-samples")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: PyTorch's default)")
    p.add_argument("--foreach", default="default", choices=["default", "on", "off"],
                   help="SGD's multi-tensor kernels (default: PyTorch's choice, on for CUDA)")
    p.add_argument("--phases", action="store_true",
                   help="synchronise the GPU at each phase's end and report phase medians, as ddpbench --phase-sync on")
    p.add_argument("--memory-format", default="channels-last", choices=["channels-last", "contiguous"],
                   help="layout of the network and the batch, as ddpbench --memory-format")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel on a 1-rank NCCL group")
    p.add_argument("--pin-memory", action="store_true", help="pool in page-locked memory, non-blocking copies")
    a = p.parse_args()
    fmt = torch.channels_last if a.memory_format == "channels-last" else torch.contiguous_format

    torch.backends.cudnn.benchmark = True
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rows = min(a.samples, (256 << 20) // (3 * 224 * 224 * 4))
    pool = torch.randn(rows, 3, 224, 224)
    labels = torch.randint(0, 1000, (rows,))
    if a.pin_memory:
        pool, labels = pool.pin_memory(), labels.pin_memory()
    order = torch.randperm(a.samples)
    dev = torch.device("cuda")
    net = getattr(torchvision.models, a.model)(num_classes=1000).to(dev, memory_format=fmt)
    if a.ddp:
        import os
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("nccl", rank=0, world_size=1)
        net = torch.nn.parallel.DistributedDataParallel(net, device_ids=[0], gradient_as_bucket_view=True)
    foreach = {"default": None, "on": True, "off": False}[a.foreach]
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, foreach=foreach)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=a.amp == "fp16")
    times = []
    names = ["data_s", "batch_copy_s", "forward_s", "backward_s", "optimizer_s"]
    phases = {n: [] for n in names}
    for step in range(a.steps + a.warmup):
        marks = [time.perf_counter()]

        def mark():
            if a.phases:
                torch.cuda.synchronize()
                marks.append(time.perf_counter())

        first = (step * a.batch_size) % max(a.samples - a.batch_size + 1, 1)
        idx = order[first:first + a.batch_size] % rows
        xc, yc = pool.index_select(0, idx), labels.index_select(0, idx)
        mark()
        if a.pin_memory:
            xc, yc = xc.pin_memory(), yc.pin_memory()
        x = xc.to(dev, non_blocking=a.pin_memory).contiguous(memory_format=fmt)
        y = yc.to(dev, non_blocking=a.pin_memory)
        mark()
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss = F.nll_loss(F.log_softmax(net(x), dim=-1), y)
        mark()
        scaler.scale(loss).backward()
        mark()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=False)
        loss.item()
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        if step >= a.warmup:
            times.append(marks[-1] - marks[0])
            if a.phases:
                for n, t0, t1 in zip(names, marks, marks[1:]):
                    phases[n].append(t1 - t0)
    times.sort()
    print(json.dumps({
        "peer": "pytorch-eager", "model": a.model, "batch_size": a.batch_size, "amp": a.amp,
        "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
        "median_step_s": statistics.median(times), "p95_step_s": times[int(0.95 * (len(times) - 1))],
        "min_step_s": times[0], "max_step_s": times[-1], "steps": len(times),
        "threads": torch.get_num_threads(), "samples": a.samples, "pool_rows": rows,
        "foreach": a.foreach, "memory_format": a.memory_format, "ddp": a.ddp, "pin_memory": a.pin_memory,
        "phase_medians_s": {n: statistics.median(v) for n, v in phases.items()} if a.phases else None,
    }))
    if a.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
