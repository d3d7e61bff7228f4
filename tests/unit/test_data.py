import os
import pickle

import numpy as np
import pytest
import torch

from harness.config.schema import DataConfig
from harness.core import data
from harness.core.data import BatchOrder, check_available, load, train_size, write_cifar100
from harness.core.errors import ConfigError
from harness.core.training import replica_slice


def test_synthetic_is_cifar_shaped_and_deterministic():
    cfg = DataConfig(name="synthetic", train_size=300, test_size=100)
    a, b = load(cfg, seed=0), load(cfg, seed=0)
    assert a.train.images.shape == (300, 3, 32, 32) and a.train.images.dtype == torch.uint8
    assert a.test.images.shape == (100, 3, 32, 32)
    assert int(a.train.labels.max()) < 100 and a.num_classes == 100
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.test.labels, b.test.labels)
    assert not torch.equal(load(cfg, seed=1).train.images, a.train.images)
    x, y = a.train.batch(torch.arange(8))
    assert x.dtype == torch.float32 and x.shape == (8, 3, 32, 32) and y.shape == (8,)


def test_batch_order_covers_each_epoch_once_and_depends_only_on_seed():
    order = BatchOrder(100, 10, seed=5)
    epoch = torch.cat([order.indices(s) for s in range(10)])
    assert sorted(epoch.tolist()) == list(range(100))
    assert torch.equal(order.indices(3), BatchOrder(100, 10, seed=5).indices(3))
    assert not torch.equal(order.indices(0), order.indices(10))  # a new permutation per epoch


@pytest.mark.parametrize("batch,n", [(16, 2), (17, 2), (10, 3), (7, 7)])
def test_replica_slices_partition_the_batch(batch, n):
    slices = [replica_slice(batch, n, r) for r in range(n)]
    covered = [i for s in slices for i in range(batch)[s]]
    assert covered == list(range(batch))
    assert [s.stop - s.start for s in slices] == [(batch + r) // n for r in range(n)]


def write_fake_cifar100(root: str, n_train: int = 50, n_test: int = 20) -> str:
    """A tiny archive in the official CIFAR-100 python format (pickled dicts, 3072-byte rows)."""
    rng = np.random.default_rng(0)
    splits = {
        name: (rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), rng.integers(0, 100, n).tolist())
        for name, n in (("train", n_train), ("test", n_test))
    }
    return write_cifar100(root, splits, [f"c{i}" for i in range(100)])


def test_cifar100_loader_reads_the_official_format(tmp_path):
    folder = write_fake_cifar100(str(tmp_path))
    ds = load(DataConfig(name="cifar100", root=str(tmp_path), verify_md5=False), seed=0)
    assert ds.train.images.shape == (50, 3, 32, 32) and ds.test.images.shape == (20, 3, 32, 32)
    with open(os.path.join(folder, "train"), "rb") as f:
        raw = pickle.load(f, encoding="latin1")
    # CHW layout matches the official row layout (1024 R, then G, then B)
    assert torch.equal(ds.train.images[3].flatten(), torch.from_numpy(raw["data"][3]))
    assert ds.train.labels.tolist() == raw["fine_labels"]


def test_missing_cifar100_names_the_path_and_the_fix(tmp_path):
    cfg = DataConfig(name="cifar100", root=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"nowhere.*data.download=true"):
        check_available(cfg)


@pytest.mark.parametrize("verify", [True, False])
def test_truncated_cifar100_file_is_named(tmp_path, verify):
    folder = write_fake_cifar100(str(tmp_path))
    path = os.path.join(folder, "test")
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ConfigError, match=r"cifar-100-python/(train|test) is corrupt") as e:
        check_available(DataConfig(name="cifar100", root=str(tmp_path), verify_md5=verify))
    # a checksum failure says how to use a copy made on purpose; an unreadable file cannot be used at all
    assert ("data.verify_md5=false" in str(e.value)) == verify


def test_augmented_batches_depend_on_seed_and_step_only_and_crop_and_flip_the_images():
    cfg = DataConfig(name="synthetic", train_size=200, test_size=50, augment=True)
    a, b = load(cfg, seed=3), load(cfg, seed=3)
    order = BatchOrder(200, 16, seed=3)
    x, y = a.train_batch(order, 5)
    x2, y2 = b.train_batch(order, 5)  # another rank, strategy or layout: the same batch
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, a.train.batch(order.indices(5))[0])  # augmented
    assert not torch.equal(a.train_batch(order, 5 + order.steps_per_epoch)[0], x)  # another step, other crops
    # each augmented image is its own image padded by 4, cropped back to 32x32, maybe mirrored
    raw = torch.nn.functional.pad(a.train.images[order.indices(5)], (4, 4, 4, 4))
    pixels = ((x * data._STD + data._MEAN) * 255).round().to(torch.uint8)
    for i in range(16):
        crops = [raw[i, :, t : t + 32, l : l + 32] for t in range(9) for l in range(9)]
        assert any(torch.equal(c, pixels[i]) or torch.equal(c.flip(-1), pixels[i]) for c in crops), i
    assert not load(DataConfig(name="synthetic", train_size=200, test_size=50), seed=3).augment  # off by default


def test_digits_in_cifar100_format_are_read_by_the_real_loader(tmp_path):
    from harness.commands import main

    assert main(["digits", "--root", str(tmp_path)]) == 0
    cfg = DataConfig(name="cifar100", root=str(tmp_path), verify_md5=False, label="digits")
    ds = load(cfg, seed=0)
    assert len(ds.train) == train_size(cfg) == 1438 and len(ds.test) == 359  # the epoch's length from the file
    assert set(ds.train.labels.tolist()) == set(range(10)) and ds.train.images.shape[1:] == (3, 32, 32)
    # grey images: the three channels equal; strokes bright on a dark ground
    assert torch.equal(ds.train.images[:, 0], ds.train.images[:, 2]) and ds.train.images.max() == 255
    assert ds.augment  # augmented as CIFAR-100 is
