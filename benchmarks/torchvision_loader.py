"""torchvision's ImageNet input pipeline in one process, one thread: ImageFolder with
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize (train) or
Resize(256) + CenterCrop(224) + ToTensor + Normalize (val), every image once per pass,
no DataLoader (no collate, no worker processes). Prints images/s per pass.

    python benchmarks/torchvision_loader.py ROOT [split=train] [passes=1]
"""
import os
import sys
import time

import torch
from torchvision import datasets, transforms

torch.set_num_threads(1)
root = sys.argv[1]
split = sys.argv[2] if len(sys.argv) > 2 else "train"
passes = int(sys.argv[3]) if len(sys.argv) > 3 else 1
norm = transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
if split == "train":
    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), norm])
else:
    tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), norm])
ds = datasets.ImageFolder(os.path.join(root, split), transform=tf)
for _ in range(passes):
    t0 = time.perf_counter()
    for i in range(len(ds)):
        x, _ = ds[i]
    dt = time.perf_counter() - t0
    print(f"{len(ds) / dt:.1f}", flush=True)
