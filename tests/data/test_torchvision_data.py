"""CIFAR-10/100 and STL-10 data modules on small fake files in torchvision's on-disk format, and the offline errors."""

from __future__ import annotations

import pickle
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from cloc_lightning.data import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    DataConfigError,
    STL10DataModule,
    SupConViews,
    torchvision_sets,
)
from cloc_lightning.methods import SupConModule
from cloc_lightning.probe import extract_features, labelled_loader
from tests.conftest import TINY_BACKBONE, cpu_trainer


# ------------------------------------------------------------ fake files
def _write_cifar10(root: Path, n_per_batch: int = 12, n_test: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """torchvision's layout: cifar-10-batches-py/data_batch_{1..5}, test_batch, batches.meta (latin1 pickles)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    arrays: dict[str, np.ndarray] = {}
    for name, n in [(f"data_batch_{i}", n_per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "labels": labels, "data": data, "filenames": [f"{i}.png" for i in range(n)]}, f)
        arrays[name] = data
        arrays[name + "_labels"] = np.array(labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)], "num_vis": 3072}, f)
    return arrays


def _write_stl10(root: Path, n_train: int = 10, n_test: int = 8, n_unlabeled: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """stl10_binary/*.bin: uint8 images stored column-major ([N, 3, W, H]), labels 1..10."""
    rng = np.random.default_rng(seed)
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    images: dict[str, np.ndarray] = {}
    for split, n in (("train", n_train), ("test", n_test), ("unlabeled", n_unlabeled)):
        imgs = rng.integers(0, 256, size=(n, 3, 96, 96), dtype=np.uint8)  # [N, 3, H, W]
        imgs.transpose(0, 1, 3, 2).tofile(folder / f"{split}_X.bin")
        images[split] = imgs
        if split != "unlabeled":
            labels = (np.arange(n) % 10 + 1).astype(np.uint8)
            labels.tofile(folder / f"{split}_y.bin")
            images[split + "_labels"] = labels.astype(np.int64) - 1
    (folder / "class_names.txt").write_text("\n".join(torchvision_sets.STL10_CLASSES) + "\n")
    return images


# ------------------------------------------------------------------ CIFAR
def test_cifar10_reads_torchvision_layout_and_splits(tmp_path: Path) -> None:
    arrays = _write_cifar10(tmp_path)
    dm = CIFAR10DataModule(str(tmp_path), download=False, val_fraction=0.2, batch_size=8, num_workers=0)
    dm.setup("fit")
    assert dm.class_names == [f"c{i}" for i in range(10)] and dm.num_classes == 10 and dm.task == "nominal"
    base = dm._ensure_base()
    assert len(base["train"]) + len(base["val"]) == 60 and len(base["test"]) == 10 and 4 <= len(base["val"]) <= 24
    # pixels and labels as written (HWC order of the pickle rows: 1024 R, 1024 G, 1024 B)
    test0 = base["test"].load(0)
    assert test0.dtype == torch.uint8 and test0.shape == (3, 32, 32)
    assert np.array_equal(test0.numpy(), arrays["test_batch"][0].reshape(3, 32, 32))
    assert base["test"].targets == arrays["test_batch_labels"].tolist()
    train_labels = np.concatenate([arrays[f"data_batch_{i}_labels"] for i in range(1, 6)])
    assert sorted(base["train"].targets + base["val"].targets) == sorted(train_labels.tolist())
    # deterministic split; val_fraction 0 validates on the test set
    dm2 = CIFAR10DataModule(str(tmp_path), download=False, val_fraction=0.2, num_workers=0)
    assert dm2._ensure_base()["val"].targets == base["val"].targets
    dm0 = CIFAR10DataModule(str(tmp_path), download=False, val_fraction=0.0, num_workers=0)
    assert dm0._ensure_base()["val"] is dm0._ensure_base()["test"]
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (8,)


def test_cifar10_matches_torchvision_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_cifar10(tmp_path)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)  # fake files: no md5
    tv = torchvision.datasets.CIFAR10(str(tmp_path), train=False, download=False)
    base = CIFAR10DataModule(str(tmp_path), download=False, num_workers=0)._ensure_base()
    for i in range(3):
        img, label = tv[i]
        assert np.array_equal(np.asarray(img), base["test"].load(i).permute(1, 2, 0).numpy()) and label == base["test"].targets[i]


def test_cifar100_fine_labels_and_multiview(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("train", 40), ("test", 10)):
        with open(folder / name, "wb") as f:
            pickle.dump(
                {
                    "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                    "fine_labels": [int(v) for v in rng.integers(0, 100, size=n)],
                    "coarse_labels": [0] * n,
                },
                f,
            )
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"f{i}" for i in range(100)], "coarse_label_names": ["x"] * 20}, f)
    dm = CIFAR100DataModule(str(tmp_path), download=False, batch_size=4, num_workers=0, train_views=SupConViews(3))
    dm.setup("fit")
    assert dm.num_classes == 100 and dm.class_names[7] == "f7"
    views, _y = next(iter(dm.train_dataloader()))
    assert len(views) == 3 and all(v.shape == (4, 3, 32, 32) for v in views)


# ----------------------------------------------------------------- STL-10
def test_stl10_splits_pixels_and_unlabelled(tmp_path: Path) -> None:
    images = _write_stl10(tmp_path)
    dm = STL10DataModule(str(tmp_path), download=False, val_fraction=0.0, num_workers=0, batch_size=4)
    base = dm._ensure_base()
    assert dm.num_classes == 10 and dm.class_names[2] == "car" and len(base["train"]) == 10 and len(base["test"]) == 8
    for i in (0, 5):  # stored column-major on disk, read back as [3, H, W]
        assert np.array_equal(base["train"].load(i).numpy(), images["train"][i])
    assert base["train"].targets == images["train_labels"].tolist()
    # torchvision's own reader (name-mangled private loader, no md5 check) as the reference
    tv = torchvision.datasets.STL10.__new__(torchvision.datasets.STL10)
    tv.root, tv.base_folder = str(tmp_path), "stl10_binary"
    tv_images, tv_labels = tv._STL10__loadfile("test_X.bin", "test_y.bin")
    assert np.array_equal(np.stack([base["test"].load(i).numpy() for i in range(8)]), tv_images)
    assert base["test"].targets == tv_labels.tolist()

    both = STL10DataModule(str(tmp_path), train_split="train+unlabeled", download=False, val_fraction=0.2, num_workers=0)
    b = both._ensure_base()
    assert len(b["train"]) + len(b["val"]) == 22 and b["train"].targets.count(-1) == 12
    assert all(t >= 0 for t in b["val"].targets)  # validation comes from the labelled images only
    assert np.array_equal(b["train"].load(len(b["train"]) - 1).numpy(), images["unlabeled"][-1])
    only = STL10DataModule(str(tmp_path), train_split="unlabeled", download=False, num_workers=0)
    assert only._ensure_base()["train"].targets == [-1] * 12
    # few_shot caps the labelled images per class and keeps every unlabelled one
    _write_stl10(tmp_path / "two_per_class", n_train=20)
    few = STL10DataModule(
        str(tmp_path / "two_per_class"),
        train_split="train+unlabeled",
        download=False,
        val_fraction=0.0,
        few_shot=1,
        num_workers=0,
        batch_size=2,
    )
    few.setup("fit")
    kept = few.train_set.targets
    assert kept.count(-1) == 12 and sorted(t for t in kept if t >= 0) == list(range(10))
    # probes see only the labelled images
    loader = labelled_loader(few.train_eval_dataloader())
    assert len(loader.dataset) == 10
    X, y = extract_features(torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()), few.train_eval_dataloader())
    assert X.shape == (10, 3) and (y >= 0).all()
    with pytest.raises(DataConfigError, match="train_split must be"):
        STL10DataModule(str(tmp_path), train_split="extra")  # type: ignore[arg-type]


def test_supcon_trains_on_stl10_with_unlabelled_images(tmp_path: Path) -> None:
    _write_stl10(tmp_path, n_train=20, n_test=10, n_unlabeled=20)
    dm = STL10DataModule(
        str(tmp_path),
        train_split="train+unlabeled",
        download=False,
        val_fraction=0.0,
        image_size=32,
        batch_size=8,
        num_workers=0,
        train_views=SupConViews(2),
    )
    model = SupConModule(method="supcon", backbone=TINY_BACKBONE)
    trainer = cpu_trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=1)
    trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    assert torch.isfinite(m["train/loss"]) and "val/online_probe/acc" in m and "val/online_probe/acc_top5" in m
    assert model.probe is not None and model.probe.num_classes == 10


# ---------------------------------------------------------- offline/bad input
def test_offline_download_fails_fast_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    t0 = time.perf_counter()
    with pytest.raises(DataConfigError, match=r"CIFAR-10 not found.*downloading https://.*failed.*data.root.*ImageFolderDataModule"):
        CIFAR10DataModule(str(tmp_path / "data"), download=True, num_workers=0).setup("fit")
    assert time.perf_counter() - t0 < 5
    with pytest.raises(DataConfigError, match=r"STL-10 not found.*data.download is false.*stl10_binary"):
        STL10DataModule(str(tmp_path), download=False, num_workers=0).setup("fit")
    # reachable host, but the transfer breaks: same advice, no hang, the socket timeout is restored
    monkeypatch.setattr(torchvision_sets, "_reachable", lambda url, timeout: None)

    def broken(*args, **kwargs):
        raise TimeoutError("timed out")

    import torchvision.datasets.utils as tv_utils

    monkeypatch.setattr(tv_utils, "download_and_extract_archive", broken)
    before = socket.getdefaulttimeout()
    with pytest.raises(DataConfigError, match=r"CIFAR-100 not found.*TimeoutError: timed out"):
        CIFAR100DataModule(str(tmp_path), download=True, num_workers=0).prepare_data()
    assert socket.getdefaulttimeout() == before


def test_corrupt_files_and_bad_arguments(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x00 not a pickle")
    with pytest.raises(DataConfigError, match="cannot read .*test_batch.*re-download"):
        CIFAR10DataModule(str(tmp_path), download=False, num_workers=0).setup("fit")
    stl = tmp_path / "s"
    _write_stl10(stl)
    with open(stl / "stl10_binary" / "train_X.bin", "ab") as f:
        f.write(b"\x01\x02")
    with pytest.raises(DataConfigError, match="not a multiple of one 96x96 RGB image"):
        STL10DataModule(str(stl), download=False, num_workers=0).setup("fit")
    with pytest.raises(DataConfigError, match="val_fraction must be in"):
        CIFAR10DataModule(str(tmp_path), val_fraction=1.0)
