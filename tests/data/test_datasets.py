"""The datasets the data modules build (``cloc_lightning.data.datasets``): in-memory and file images, transformed subsets."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.data.datasets import ImageFileDataset, TensorImageDataset, TransformedSubset, to_rgb


def _seeded_train_set() -> TransformedSubset:
    """A training set with per-sample seeded augmentations, as the data modules build it."""
    dm = OrdinalShapesDataModule(
        num_classes=4, train_size=24, val_size=8, test_size=8, batch_size=6, num_workers=0, augment="crop_flip", seed=0
    )
    dm.setup("fit")
    assert dm.train_set is not None
    return dm.train_set


# ---------------------------------------------------------------- base sets
def test_tensor_images_must_be_uint8_nchw() -> None:
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).reshape(2, 3, 4, 4)
    ds = TensorImageDataset(images, [1, 0])
    assert len(ds) == 2 and ds.targets == [1, 0] and ds.labelled
    assert torch.equal(ds[1][0], images[1]) and ds[1][1] == 0 and ds.describe(1) == "sample 1"
    with pytest.raises(ValueError, match=r"images must be uint8 \[N, 3, H, W\], got torch.float32 \(2, 3, 4, 4\)"):
        TensorImageDataset(images.float(), [1, 0])
    with pytest.raises(ValueError, match=r"got torch.uint8 \(3, 4, 4\)"):
        TensorImageDataset(images[0], [1])


def test_sixteen_bit_png_loads_by_its_range(tmp_path: Path) -> None:
    """Before: a 16-bit PNG loaded as (almost) all white."""
    gray = np.random.default_rng(0).integers(0, 256, (10, 10), dtype=np.uint8)
    Image.fromarray(gray.astype(np.uint16) * 257).save(tmp_path / "deep.png")
    Image.fromarray(gray).save(tmp_path / "flat.png")
    with Image.open(tmp_path / "deep.png") as img:
        assert img.mode.startswith("I")
    ds = ImageFileDataset([str(tmp_path / "deep.png"), str(tmp_path / "flat.png")], [0, 0])
    deep, flat = np.asarray(ds.load(0)), np.asarray(ds.load(1))
    assert deep.shape == flat.shape == (10, 10, 3) and np.array_equal(deep, flat)
    # values using 12 of the 16 bits are scaled as stored (divided by 257: dark, as a viewer shows them), not clipped
    Image.fromarray(gray.astype(np.uint16) * 16).save(tmp_path / "twelve.png")
    twelve = np.asarray(ImageFileDataset([str(tmp_path / "twelve.png")], [0]).load(0))
    assert twelve.max() < 64 and np.array_equal(twelve[..., 0], np.round(gray.astype(np.float64) * 16 / 257).astype(np.uint8))


def test_to_rgb_scales_32_bit_integer_images_by_their_range() -> None:
    """Mode ``I`` beyond 16 bits (a 32-bit TIFF) is scaled from 2**31 - 1; within 16 bits (not a PNG) from 65535."""
    wide = Image.fromarray(np.array([[0, 2**30, 2**31 - 1]], dtype=np.int32))
    narrow = Image.fromarray(np.array([[0, 257 * 100, 65535]], dtype=np.int32))
    assert wide.mode == narrow.mode == "I"
    assert np.asarray(to_rgb(wide))[0, :, 0].tolist() == [0, 128, 255]
    assert np.asarray(to_rgb(narrow))[0, :, 0].tolist() == [0, 100, 255]
    assert to_rgb(Image.new("L", (2, 2), 7)).mode == "RGB"


def test_image_files_need_one_label_each_and_a_known_bad_files_choice(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="files and targets differ in length"):
        ImageFileDataset(["a.png", "b.png"], [0])
    unlabelled = ImageFileDataset(["a.png", "b.png"], None)
    assert not unlabelled.labelled and unlabelled.targets == [-1, -1] and unlabelled.describe(1) == "b.png"
    with pytest.raises(ValueError, match="bad_files"):
        ImageFileDataset(["a.png"], [0], "ignore")  # type: ignore[arg-type]


# ---------------------------------------------------------------- transformed subsets
def test_transformed_subset_keeps_indices_and_yields_label_tensors_or_images_alone() -> None:
    images = torch.arange(4 * 3 * 2 * 2, dtype=torch.uint8).reshape(4, 3, 2, 2)
    base = TensorImageDataset(images, [0, 1, 2, 3])
    raw = TransformedSubset(base, [3, 1])
    assert raw.targets == [3, 1] and len(raw) == 2 and raw.describe(0) == "sample 3"
    assert torch.equal(raw[0][0], images[3]) and raw[0][1] == 3  # no transform: itself a base set
    scaled = TransformedSubset(base, [3, 1], lambda x: x.float() / 255)
    x, y = scaled[1]
    assert torch.equal(x, images[1].float() / 255) and y.dtype == torch.long and int(y) == 1
    base.labelled = False
    assert torch.equal(TransformedSubset(base, [2], lambda x: x.float())[0], images[2].float())
    assert scaled.seed is None and scaled.epoch == 0  # unseeded: no shared epoch
    scaled.set_epoch(5)
    assert scaled.epoch == 0


def test_epoch_stays_shared_through_pickling_and_copies() -> None:
    ds = _seeded_train_set()
    assert ds._epoch is not None and ds._epoch.is_shared()
    ds.set_epoch(3)
    for copied in (pickle.loads(pickle.dumps(ds)), copy.deepcopy(ds)):
        assert copied.epoch == 3 and copied._epoch.is_shared()
        assert torch.equal(copied[5][0], ds[5][0])
        copied.set_epoch(4)  # a copy is independent of the original
        assert ds.epoch == 3
    # a copy unpickled in another process (a ddp_spawn rank) takes its own shared epoch when it sets one
    other = pickle.loads(pickle.dumps(ds))
    other._epoch_owner, before = -1, other._epoch
    other.set_epoch(7)
    assert other.epoch == 7 and other._epoch is not before and other._epoch.is_shared() and int(before) == 3
    other.set_epoch(8)
    assert other.epoch == 8 and ds.epoch == 3
