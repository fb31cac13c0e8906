#!/usr/bin/env python3
"""PyTorch DataLoader reference over the same bigMNIST shard files ddpbench streams.

A map-style Dataset over np.memmap'd shards (the usual way to read a big
fixed-record file in PyTorch), returning normalised 1×28×28 tensors and labels,
DataLoader(batch_size, num_workers, shuffle=False): sequential like ddpbench's stream.

  python benchmarks/pytorch_bigmnist_loader.py DIR [--workers 1] [--batch-size 64]
"""
import argparse, json, os, resource, time

import numpy as np
import torch

REC = 785


class BigMnist(torch.utils.data.Dataset):
    def __init__(self, root):
        self.index = json.load(open(os.path.join(root, "index.json")))
        self.root = root
        self.starts = [s["first"] for s in self.index["shards"]]
        self.maps = None
        self.mean, self.std = self.index["mean"], self.index["std"]

    def __len__(self):
        return self.index["samples"]

    def __getitem__(self, i):
        if self.maps is None:  # opened lazily in each worker
            self.maps = [np.memmap(os.path.join(self.root, s["file"]), dtype=np.uint8, mode="r").reshape(-1, REC) for s in self.index["shards"]]
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        rec = self.maps[k][i - self.starts[k]]
        x = (torch.from_numpy(rec[1:].astype(np.float32)).view(1, 28, 28) / 255.0 - self.mean) / self.std
        return x, int(rec[0])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(1)
    ds = BigMnist(a.root)
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers, shuffle=False)
    t = time.perf_counter()
    n = 0
    for x, y in dl:
        n += y.shape[0]
    s = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"pytorch DataLoader: {n} samples in {s:.2f} s = {n / s:.0f} samples/s ({a.workers} worker(s), batch {a.batch_size}); main process peak {rss:.0f} MiB")


if __name__ == "__main__":
    main()
