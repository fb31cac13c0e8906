"""PyTorch eager reference for ddpbench's GPU step time (issue 5's goal: ddpbench's
ResNet-50 AMP step <= 1.0x this). One process, one GPU, no DDP: the same network
(torchvision), batch, optimizer (SGD, momentum 0.9), synthetic data made on the CPU
and copied each step (as ddpbench --dataset synthetic), fp16 autocast with GradScaler
or bf16 autocast or fp32. Prints one JSON line: median and p95 step seconds.

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
    a = p.parse_args()

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    net = getattr(torchvision.models, a.model)(num_classes=1000).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=a.amp == "fp16")
    times = []
    for step in range(a.steps + a.warmup):
        t0 = time.perf_counter()
        x = torch.randn(a.batch_size, 3, 224, 224).to(dev)
        y = torch.randint(0, 1000, (a.batch_size,)).to(dev)
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss = F.nll_loss(F.log_softmax(net(x), dim=-1), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=False)
        loss.item()
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    print(json.dumps({
        "peer": "pytorch-eager", "model": a.model, "batch_size": a.batch_size, "amp": a.amp,
        "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
        "median_step_s": statistics.median(times), "p95_step_s": times[int(0.95 * (len(times) - 1))],
        "steps": len(times),
    }))


if __name__ == "__main__":
    main()
