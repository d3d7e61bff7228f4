"""Datasets and the global batch order every strategy shares.

Both data sets are held in memory as uint8 images (CIFAR-100 is 150 MB) and
normalised per batch, so every rank can index any global batch cheaply and the
same seed gives the same batches under every strategy and layout. Training batches
may be augmented as CIFAR models are trained (a random 32x32 crop of the image padded
by 4, a horizontal flip half of the time; ``data.augment``, on by default for
CIFAR-100), by torchvision's ``transforms.v2`` functions with parameters drawn from a
generator seeded by (seed, step): sample j of the global batch of step k gets the same
crop and flip on every rank, under every strategy and layout. ``cfg`` is the run
config's ``data`` node (:class:`harness.config.schema.DataConfig`); this module only
reads its fields.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import torch

from harness.core.errors import ConfigError

# torchvision is imported where it is used: it takes about 1.8 s to import (it pulls in
# torch._dynamo), which a command on the synthetic data would pay for nothing
FOLDER = "cifar-100-python"  # the official archive's folder (torchvision's CIFAR100.base_folder)

# CIFAR-100 channel statistics (used for both data sets, so inputs look alike)
_MEAN = torch.tensor([0.5071, 0.4865, 0.4409]).view(1, 3, 1, 1)
_STD = torch.tensor([0.2673, 0.2564, 0.2762]).view(1, 3, 1, 1)


@dataclass
class Split:
    images: torch.Tensor  # uint8, N x 3 x H x W
    labels: torch.Tensor  # int64, N

    def __len__(self) -> int:
        return self.labels.shape[0]

    def batch(self, indices: torch.Tensor, augment: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at ``indices``, normalised; augmented (see the module docstring) with
        parameters drawn from ``augment`` in sample order, when given."""
        images = self.images[indices]
        if augment is not None:
            images = _crop_and_flip(images, augment)
        x = images.float().div_(255.0)
        return (x - _MEAN) / _STD, self.labels[indices]


PAD = 4  # the crop's padding, as CIFAR models are trained


def _crop_and_flip(images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A random crop of each padded image at its size, flipped half of the time."""
    from torchvision.transforms.v2 import functional as tvf

    n, _, h, w = images.shape
    padded = tvf.pad(images, [PAD])
    tops = torch.randint(0, 2 * PAD + 1, (n,), generator=g)
    lefts = torch.randint(0, 2 * PAD + 1, (n,), generator=g)
    flips = torch.rand(n, generator=g) < 0.5
    out = torch.empty_like(images)
    for i in range(n):
        crop = tvf.crop(padded[i], int(tops[i]), int(lefts[i]), h, w)
        out[i] = tvf.horizontal_flip(crop) if flips[i] else crop
    return out


@dataclass
class Dataset:
    train: Split
    test: Split
    num_classes: int
    augment: bool = False  # training batches are cropped and flipped
    seed: int = 0

    def train_batch(self, order: "BatchOrder", step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of ``step``, augmented as (seed, step) say when augmentation is on."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 1) if self.augment else None
        return self.train.batch(order.indices(step), augment=g)


def synthetic(cfg, seed: int) -> Dataset:
    """CIFAR-100-shaped images drawn around one smooth random prototype per class.

    A prototype is an 8x8 colour pattern upsampled to 32x32; each image is its
    class prototype under a random brightness/contrast change plus pixel noise.
    Classes are separable but not trivially so, which makes the data learnable
    (a micro ViT gets well above chance in a few dozen steps) without files.
    """
    g = torch.Generator().manual_seed(10_000 + seed)
    n_cls, size = cfg.num_classes, cfg.image_size
    coarse = torch.rand(n_cls, 3, 8, 8, generator=g)
    prototypes = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)

    def make(n: int) -> Split:
        labels = torch.randint(0, n_cls, (n,), generator=g)
        contrast = 0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=g)
        brightness = 0.2 * torch.randn(n, 1, 1, 1, generator=g)
        noise = cfg.noise * 0.25 * torch.randn(n, 3, size, size, generator=g)
        img = (prototypes[labels] - 0.5) * contrast + 0.5 + brightness + noise
        return Split((img.clamp_(0, 1) * 255).round_().to(torch.uint8), labels)

    return Dataset(train=make(cfg.train_size), test=make(cfg.test_size), num_classes=n_cls)


def _checked_cifar100(verify_md5: bool):
    """torchvision's CIFAR100 whose integrity check names the file at fault.

    torchvision only says "Dataset not found or corrupted"; a user needs to know
    which file. With ``verify_md5`` off (data you generated in the official
    format) each file is instead checked by unpickling it.
    """
    from torchvision.datasets import CIFAR100
    from torchvision.datasets.utils import check_integrity

    class CheckedCIFAR100(CIFAR100):
        def _check_integrity(self) -> bool:
            files = self.train_list + self.test_list + [[self.meta["filename"], self.meta["md5"]]]
            for name, md5 in files:
                path = os.path.join(self.root, self.base_folder, name)
                if not os.path.isfile(path):
                    raise ConfigError(
                        f"CIFAR-100 file missing: {path}; set data.root to the folder holding 'cifar-100-python', "
                        + (
                            "or pass data.download=true where the network allows"
                            if verify_md5
                            else "or write the set there first (data=digits: pipebench digits --root <data.root>)"
                        )
                    )
                if verify_md5:
                    ok = check_integrity(path, md5)
                else:
                    try:
                        with open(path, "rb") as f:
                            ok = isinstance(pickle.load(f, encoding="latin1"), dict)
                    except Exception:
                        ok = False
                if not ok:
                    raise ConfigError(
                        f"CIFAR-100 file {path} is corrupt or truncated"
                        + (" (checksum mismatch)" if verify_md5 else "")
                        + (
                            "; delete the 'cifar-100-python' folder and fetch it again (data.download=true), or, for "
                            "a copy you made or converted on purpose, pass data.verify_md5=false (each file is then "
                            "only checked to unpickle)"
                            if verify_md5
                            else " (cannot be unpickled); delete the 'cifar-100-python' folder and fetch it again "
                            "(data.download=true)"
                        )
                    )
            return True

        def _load_meta(self) -> None:
            if not verify_md5:
                self.meta = {**self.meta, "md5": None}
            super()._load_meta()

    return CheckedCIFAR100


def cifar100(cfg) -> Dataset:
    """CIFAR-100 read by torchvision from ``cfg.root`` (official python archive layout)."""
    cls = _checked_cifar100(cfg.verify_md5)
    root = os.path.abspath(os.path.expanduser(cfg.root))
    splits = {}
    for name, train in (("train", True), ("test", False)):
        try:
            ds = cls(root=root, train=train, download=cfg.download)
        except ConfigError:
            raise
        except Exception as e:  # download without network, unexpected archive content, ...
            raise ConfigError(f"CIFAR-100 under {root} could not be loaded ({type(e).__name__}: {e})") from None
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        splits[name] = Split(images, torch.tensor(ds.targets, dtype=torch.int64))
    return Dataset(train=splits["train"], test=splits["test"], num_classes=100)


def load(cfg, seed: int, num_classes: int | None = None) -> Dataset:
    """The data set; with ``num_classes`` (the model's), labels outside its classes are refused,
    naming the file."""
    if cfg.name == "synthetic":
        data = synthetic(cfg, seed)
    elif cfg.name == "cifar100":
        data = cifar100(cfg)
        if num_classes is not None:
            for name, split in (("train", data.train), ("test", data.test)):
                check_labels(
                    split.labels, num_classes, os.path.join(os.path.abspath(os.path.expanduser(cfg.root)), FOLDER, name)
                )
    else:
        raise ConfigError(f"unknown data set '{cfg.name}'; use data=synthetic or data=cifar100")
    data.augment, data.seed = augments(cfg), seed
    return data


def augments(cfg) -> bool:
    """Whether training batches are augmented: ``data.augment``, or by default for CIFAR-100 only."""
    return cfg.name == "cifar100" if cfg.augment is None else cfg.augment


def train_size(cfg) -> int:
    """Images in the training split (an epoch's length): known for the official CIFAR-100 archive,
    read from the file for one written in its format (``data.verify_md5=false``)."""
    if cfg.name == "synthetic":
        return cfg.train_size
    path = os.path.join(os.path.abspath(os.path.expanduser(cfg.root)), FOLDER, "train")
    if cfg.verify_md5 or (cfg.download and not os.path.isfile(path)):
        return 50000
    check_available(cfg)
    with open(path, "rb") as f:
        return len(pickle.load(f, encoding="latin1")["fine_labels"])


def write_cifar100(root: str, splits: dict[str, tuple], fine_label_names: list[str]) -> str:
    """Write images in CIFAR-100's python format under ``root``/cifar-100-python, for data made
    elsewhere to be read by the real loader (``data=cifar100 data.root=<root> data.verify_md5=false``).
    ``splits``: {"train": (images, labels), "test": (...)}, images uint8 N x 3 x 32 x 32, labels < 100."""
    folder = os.path.join(root, FOLDER)
    os.makedirs(folder, exist_ok=True)
    for name, (images, labels) in splits.items():
        n = len(labels)
        entry = {
            "filenames": [f"{name}_{i}.png" for i in range(n)],
            "batch_label": name,
            "fine_labels": [int(v) for v in labels],
            "coarse_labels": [int(v) % 20 for v in labels],
            "data": images.reshape(n, 3 * 32 * 32),
        }  # rows of 1024 R, then G, then B bytes
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(entry, f)
    names = list(fine_label_names) + [f"unused_{i}" for i in range(len(fine_label_names), 100)]
    with open(os.path.join(folder, "meta"), "wb") as f:
        pickle.dump({"fine_label_names": names, "coarse_label_names": [f"group_{i}" for i in range(20)]}, f)
    return folder


def check_available(cfg, num_classes: int | None = None) -> None:
    """Pre-launch check that the data set is there and intact, and that its labels are classes of a
    model with ``num_classes`` outputs, so workers never start on a bad one."""
    if cfg.name == "synthetic":
        if num_classes is not None and cfg.num_classes > num_classes:
            raise ConfigError(
                f"data.num_classes={cfg.num_classes} has labels the model's {num_classes} classes do not; "
                f"set model.num_classes>={cfg.num_classes} or data.num_classes<={num_classes}"
            )
        return
    if cfg.download:
        return  # checked when it is loaded
    cls = _checked_cifar100(cfg.verify_md5)
    probe = cls.__new__(cls)
    probe.root = os.path.abspath(os.path.expanduser(cfg.root))
    probe._check_integrity()
    if num_classes is None or num_classes >= 100 and cfg.verify_md5:
        return  # the official archive's labels are 0..99
    for name in ("train", "test"):
        path = os.path.join(probe.root, FOLDER, name)
        with open(path, "rb") as f:
            check_labels(pickle.load(f, encoding="latin1")["fine_labels"], num_classes, path)


def check_labels(labels, num_classes: int, source: str) -> None:
    """Refuse, naming ``source``, labels outside a model's ``num_classes`` classes (they would fail as
    an index error in a worker's loss, mid-run)."""
    labels = torch.as_tensor(labels)
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if len(bad):
        raise ConfigError(
            f"{source} holds label {int(bad[0])} ({len(bad)} sample(s) outside 0..{num_classes - 1}), "
            f"but the model has {num_classes} classes: set model.num_classes, or fix the file"
        )


class BatchOrder:
    """The sequence of global batches: a fresh permutation of the train split per epoch.

    Depends only on the seed, the split size and the global batch, so every
    strategy, world size and resume sees the same samples in the same order.
    """

    def __init__(self, n: int, global_batch: int, seed: int):
        if global_batch > n:
            raise ConfigError(f"train.global_batch={global_batch} exceeds the {n} training images")
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self.steps_per_epoch = n // global_batch

    def indices(self, step: int) -> torch.Tensor:
        epoch, k = divmod(step, self.steps_per_epoch)
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
        return perm[k * self.global_batch : (k + 1) * self.global_batch]
