"""Writes an ImageNet-layout folder of photo-like JPEGs for the loader benchmark.

Photo-like: smooth gradients and a few soft blobs with mild noise, since pure noise
decodes several times slower than photographs. Sizes 500x375 to 640x480 (landscape and
portrait), quality 90, 4:2:0 as cameras and ImageNet's files mostly are.

    python benchmarks/make_jpegs.py OUT_DIR [images=384] [classes=4] [seed=0]
"""
import os
import sys

import numpy as np
from PIL import Image


def photo(rng, w, h):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    base = rng.uniform(40, 200, 3)
    gx, gy = rng.uniform(-0.15, 0.15, 2)
    for c in range(3):
        img[..., c] = base[c] + gx * x + gy * y
    for _ in range(6):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        r = rng.uniform(30, 160)
        amp = rng.uniform(-80, 80, 3)
        blob = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        img += blob[..., None] * amp
    img += rng.normal(0, 3, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 384
    classes = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    rng = np.random.default_rng(int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    sizes = [(500, 375), (640, 480), (500, 333), (375, 500), (480, 640), (600, 400)]
    for split, count in (("train", n), ("val", max(classes, n // 8))):
        for i in range(count):
            d = os.path.join(out, split, f"n{i % classes:08d}")
            os.makedirs(d, exist_ok=True)
            w, h = sizes[rng.integers(len(sizes))]
            photo(rng, w, h).save(os.path.join(d, f"img{i:05d}.JPEG"), quality=90)


if __name__ == "__main__":
    main()
