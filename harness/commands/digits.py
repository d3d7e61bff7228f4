"""Write scikit-learn's digits in CIFAR-100's format, a real-image set that needs no download.

``pipebench digits [--root data/digits]`` writes scikit-learn's 1,797 handwritten digits
(8x8 grey images of 10 classes, shipped inside the package: no download) as 32x32 RGB images
in CIFAR-100's python archive, split 80/20 by a fixed permutation, so the real CIFAR-100 loader
reads them (``data=digits``, which is ``data=cifar100 data.root=data/digits
data.verify_md5=false``). An accuracy study on it runs where CIFAR-100 cannot be fetched.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from harness.core.data import write_cifar100

TEST_FRACTION = 0.2


def digits_splits(seed: int = 0) -> dict[str, tuple[np.ndarray, list[int]]]:
    """scikit-learn's digits as uint8 N x 3 x 32 x 32 images (bilinear upsampling of the 0-16
    grey levels to 0-255, the same in every channel) with their labels, split train/test."""
    from sklearn.datasets import load_digits  # an optional, heavy import: only this command needs it

    digits = load_digits()
    grey = torch.from_numpy(digits.images).float().unsqueeze(1) / 16.0  # N x 1 x 8 x 8 in [0, 1]
    big = F.interpolate(grey, size=(32, 32), mode="bilinear", align_corners=False)
    images = (big.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous().numpy()
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(round(TEST_FRACTION * len(images)))
    test, train = order[:n_test], order[n_test:]
    return {
        "train": (images[train], digits.target[train].tolist()),
        "test": (images[test], digits.target[test].tolist()),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="data/digits", help="folder to write cifar-100-python/ into")


def main(args: argparse.Namespace) -> int:
    splits = digits_splits()
    folder = write_cifar100(args.root, splits, [f"digit_{d}" for d in range(10)])
    print(f"wrote {len(splits['train'][1])} training and {len(splits['test'][1])} test images to {folder}")
    return 0
