"""Decode once (``data.cache``) and augment on the device (``data.augment_on``): the data modules' side.

* The stored layout's rule, and stored pixels equal to torchvision's resize of the decoded file.
* ``memory``: one shared-memory tensor; ``disk``: a keyed memory-mapped store, reused, rebuilt when the
  files change, never read while partial, built once when two processes ask at the same time.
* ``bad_files`` while building: ``raise`` names the file and the fix, ``skip`` leaves it out (evaluation) or
  stands the next image in (training); a store that does not fit stops with the fix.
* Every data module kind gives the step the same batch structure on both paths; evaluation batches on the
  device equal the loader path's; the training views depend on (seed, epoch, index) alone, so a loader resumed
  mid-epoch, and a different batch size, draw the same views; a pipeline without a device form is refused.
* The Python API resumes exactly mid-epoch with the device path.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from cloc_lightning.data import CSVDataModule, ImageFolderDataModule, OrdinalShapesDataModule
from cloc_lightning.data import cache as cache_mod
from cloc_lightning.data.cache import StoreLayout, build_store, fit_store_size, store_image
from cloc_lightning.data.datasets import ImageFileDataset
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.stores import shm_root
from cloc_lightning.data.transforms import MultiCropViews, SupConViews, ViewTransform
from tests._reliability import SMALL, assert_same, fit_stopped_and_resumed
from tests.conftest import cpu_trainer


def _jpegs(folder: Path, n: int, size: tuple[int, int] = (40, 30), classes: int = 3, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    files = []
    for i in range(n):
        sub = folder / f"c{i % classes}"
        sub.mkdir(parents=True, exist_ok=True)
        arr = (rng.random((size[1], size[0], 3)) * 255).astype(np.uint8)
        path = sub / f"{i:03d}.png"
        Image.fromarray(arr).save(path)
        files.append(str(path))
    return files


# ----------------------------------------------------------------------------- the stored layout
def test_the_store_size_rule() -> None:
    square = 3 / 4  # torchvision's narrowest crop aspect
    assert fit_store_size([(64, 0.2, square)], None) == 166  # ceil(64 / sqrt(0.2 * 3/4)) = 165.3 -> 166
    assert fit_store_size([(64, 0.2, square)], 200) == 166
    assert fit_store_size([(64, 0.2, square)], 150) == 150  # never above the originals
    assert fit_store_size([(32, 0.1, square), (16, 0.05, square)], 32) == 32  # CIFAR
    assert fit_store_size([(64, 0.2, square)], 400, aspect=0.5) == 234  # a 2:1 image: its short side must carry the crop
    assert fit_store_size([(64, 1.0, 1.0)], 40) == 64  # never below the output


def test_stored_pixels_are_torchvisions_resize_of_the_decoded_image() -> None:
    img = (torch.rand(3, 30, 50) * 255).to(torch.uint8)
    slot, native, stored = store_image(img, StoreLayout("resize", 16))
    assert native == (30, 50) and stored == (16, 16)
    assert torch.equal(slot, TF.resize(img, [16, 16], antialias=True))
    slot, native, stored = store_image(img, StoreLayout("fit", 25))
    assert stored == (15, 25) and slot.shape == (3, 25, 25)
    assert torch.equal(slot[:, :15, :25], TF.resize(img, [15, 25], antialias=True))
    assert torch.equal(slot[:, 15:, :], slot[:, 14:15, :].expand(-1, 10, -1))  # the last row repeated, never padding
    small, _, stored = store_image(img, StoreLayout("fit", 64))  # never enlarged: kept as it is in the slot
    assert stored == (30, 50) and torch.equal(small[:, :30, :50], img)
    assert torch.equal(small[:, :30, 50:], img[:, :, 49:50].expand(-1, -1, 14))  # the last column repeated


# ----------------------------------------------------------------------------- memory and disk stores
def test_memory_store_is_shared_and_equals_decoding(tmp_path: Path) -> None:
    files = _jpegs(tmp_path / "img", 12)
    ds = ImageFileDataset(files, [0] * 12)
    store = build_store(ds, StoreLayout("fit", 24), "memory", "test", progress=False)
    # one file in the node's shared memory (/dev/shm), which every process maps (not a copy per process)
    assert store.folder is not None and Path(store.folder).parent == shm_root() and Path(store.path or "").is_file()
    for i in (0, 5, 11):
        want, _, hw = store_image(ds.load(i), StoreLayout("fit", 24))
        assert torch.equal(store.images[i], want) and tuple(store.stored_hw[i]) == hw
        assert torch.equal(store.load(i), want[:, : hw[0], : hw[1]])


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = cache_mod.store_image

    def counted(image: Any, layout: StoreLayout) -> Any:
        calls.append(1)
        return real(image, layout)

    monkeypatch.setattr(cache_mod, "store_image", counted)
    return calls


def test_disk_store_is_keyed_reused_and_rebuilt_when_files_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _jpegs(tmp_path / "img", 10)
    calls = _count_decodes(monkeypatch)
    layout = StoreLayout("resize", 16)
    first = build_store(ImageFileDataset(files, [0] * 10), layout, "disk", "test", cache_dir=str(tmp_path / "c"), progress=False)
    assert len(calls) == 10 and first.path is not None
    again = build_store(ImageFileDataset(files, [0] * 10), layout, "disk", "test", cache_dir=str(tmp_path / "c"), progress=False)
    assert len(calls) == 10 and again.path == first.path  # reused: nothing decoded
    assert torch.equal(again.images, first.images)
    other = build_store(
        ImageFileDataset(files, [0] * 10), StoreLayout("resize", 12), "disk", "test", cache_dir=str(tmp_path / "c"), progress=False
    )
    assert other.path != first.path  # the stored size is part of the key
    Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(files[3])
    os.utime(files[3], ns=(10**18, 10**18))
    changed = build_store(ImageFileDataset(files, [0] * 10), layout, "disk", "test", cache_dir=str(tmp_path / "c"), progress=False)
    assert changed.path != first.path and int(changed.images[3].sum()) == 0


def test_a_partial_disk_store_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _jpegs(tmp_path / "img", 6)
    layout = StoreLayout("resize", 8)
    store = build_store(ImageFileDataset(files, [0] * 6), layout, "disk", "t", cache_dir=str(tmp_path / "c"), progress=False)
    folder = Path(store.path).parent  # type: ignore[arg-type]
    want = store.images.clone()
    # a build killed before its rename, and a complete store whose data was cut short (e.g. a full disk)
    (folder.parent / f"{folder.name}.partial-{socket.gethostname()}-{2**22 + 17}").mkdir()  # this machine, a process long gone
    other = folder.parent / f"{folder.name}.partial-another-node-123"  # another machine's build on a shared file system
    other.mkdir()
    with open(folder / "images.u8", "r+b") as f:
        f.truncate(100)
    calls = _count_decodes(monkeypatch)
    again = build_store(ImageFileDataset(files, [0] * 6), layout, "disk", "t", cache_dir=str(tmp_path / "c"), progress=False)
    assert len(calls) == 6 and torch.equal(again.images, want)
    assert list(folder.parent.glob("*.partial-*")) == [other]  # ours removed, the other machine's left to it


def _build_in_child(files: list[str], cache_dir: str, marker: str) -> None:
    real = cache_mod.store_image

    def counted(image: Any, layout: StoreLayout) -> Any:
        with open(marker, "a") as f:
            f.write("x")
        return real(image, layout)

    cache_mod.store_image = counted  # type: ignore[assignment]
    build_store(ImageFileDataset(files, [0] * len(files)), StoreLayout("resize", 16), "disk", "t", cache_dir=cache_dir, progress=False)


def test_two_processes_asking_at_once_build_the_disk_store_once(tmp_path: Path) -> None:
    """As the ranks of a DDP run: one builds under the file lock, the other waits and maps the finished store."""
    files = _jpegs(tmp_path / "img", 40)
    marker = tmp_path / "decodes"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_build_in_child, args=(files, str(tmp_path / "c"), str(marker))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(marker.read_text()) == 40  # decoded once, not twice
    assert len([p for p in (tmp_path / "c").iterdir() if p.is_dir()]) == 1


def test_bad_files_while_building(tmp_path: Path) -> None:
    files = _jpegs(tmp_path / "img", 8)
    Path(files[2]).write_bytes(b"not an image")
    with pytest.raises(DataConfigError, match=r"cannot read image .*002\.png.*building the image cache.*bad_files: skip"):
        build_store(ImageFileDataset(files, [0] * 8), StoreLayout("resize", 8), "memory", "the train split", progress=False)
    with pytest.warns(UserWarning, match="1 unreadable image"):
        store = build_store(
            ImageFileDataset(files, list(range(8))), StoreLayout("resize", 8), "memory", "t", bad_files="skip", progress=False
        )
    assert store.unreadable() == [2]
    with pytest.warns(UserWarning, match="skipping unreadable image"):
        image, label = store[2]  # training: the next readable image stands in, with a warning
    assert label == 3 and torch.equal(image, store.load(3))


def test_bad_files_skip_leaves_the_file_out_of_evaluation_splits(tmp_path: Path) -> None:
    _jpegs(tmp_path / "train", 12)
    _jpegs(tmp_path / "test", 9)
    Path(tmp_path / "test" / "c1" / "004.png").write_bytes(b"broken")
    dm = ImageFolderDataModule(
        root=str(tmp_path),
        image_size=16,
        batch_size=4,
        num_workers=0,
        val_fraction=0.25,
        bad_files="skip",
        cache="memory",
        augment_on="device",
        augment="rrc_flip",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup("test")
    assert len(dm.test_set) == 8
    batches = [dm.on_after_batch_transfer(b, 0) for b in dm.test_dataloader()]
    assert sum(len(y) for _, y in batches) == 8


def test_a_store_that_does_not_fit_stops_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _jpegs(tmp_path / "img", 4)
    monkeypatch.setattr(cache_mod, "_free_shared_memory", lambda *_: 1000)
    with pytest.raises(DataConfigError, match=r"data.cache: memory: .* needs .* only .* free; set data.cache_size .* data.cache: disk"):
        build_store(ImageFileDataset(files, [0] * 4), StoreLayout("resize", 32), "memory", "the train split", progress=False)

    class Tiny:
        free = 1000
        total = 10**12

    monkeypatch.setattr(cache_mod.shutil, "disk_usage", lambda _: Tiny())
    with pytest.raises(DataConfigError, match=r"data.cache: disk: .* needs .* which has .* free; set data.cache_dir to a larger disk"):
        build_store(ImageFileDataset(files, [0] * 4), StoreLayout("resize", 32), "disk", "t", cache_dir=str(tmp_path / "c"), progress=False)


# ----------------------------------------------------------------------------- the data modules
def _modules(tmp_path: Path) -> dict[str, Any]:
    _jpegs(tmp_path / "folder" / "train", 24, size=(48, 36))
    _jpegs(tmp_path / "folder" / "test", 12, size=(48, 36), seed=1)
    files = _jpegs(tmp_path / "csv", 40, size=(30, 40))
    (tmp_path / "labels.csv").write_text("path,label\n" + "".join(f"{f},{i % 3}\n" for i, f in enumerate(files)))
    common = dict(image_size=16, batch_size=4, num_workers=0)
    return {
        "shapes": lambda **kw: OrdinalShapesDataModule(num_classes=3, train_size=24, val_size=8, test_size=8, **common, **kw),
        "folder": lambda **kw: ImageFolderDataModule(root=str(tmp_path / "folder"), val_fraction=0.25, **common, **kw),
        "csv": lambda **kw: CSVDataModule(csv_path=str(tmp_path / "labels.csv"), split_fractions=(0.5, 0.25, 0.25), **common, **kw),
    }


@pytest.mark.parametrize("kind", ["shapes", "folder", "csv"])
@pytest.mark.parametrize("views", [None, "supcon", "multicrop"])
def test_both_paths_give_the_step_the_same_batches(kind: str, views: str | None, tmp_path: Path) -> None:
    make = _modules(tmp_path)[kind]
    tv: ViewTransform | None = {None: None, "supcon": SupConViews(), "multicrop": MultiCropViews(2, 2)}[views]
    extra: dict[str, Any] = {"train_views": tv} if tv is not None else {"augment": "rrc_flip"}
    batches = {}
    for name, kw in {"loader": {}, "device": {"augment_on": "device"}, "cached": {"cache": "memory", "augment_on": "device"}}.items():
        dm = make(**extra, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dm.setup("fit")
        train = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
        val = dm.on_after_batch_transfer(next(iter(dm.val_dataloader())), 0)
        batches[name] = (train, val)
    (lx, ly), (lvx, lvy) = batches["loader"]
    for name in ("device", "cached"):
        (dx, dy), (dvx, dvy) = batches[name]
        lviews = lx if isinstance(lx, list) else [lx]
        dviews = dx if isinstance(dx, list) else [dx]
        assert [v.shape for v in dviews] == [v.shape for v in lviews] and all(v.dtype == torch.float32 for v in dviews)
        assert torch.equal(dy, ly)  # the same samples in the same order
        rows = torch.cat([v.flatten(1) for v in dviews if v.shape == dviews[0].shape])
        assert torch.unique(rows, dim=0).shape[0] == rows.shape[0]  # every row and view different
        assert torch.equal(dvy, lvy) and dvx.dtype == torch.float32
        torch.testing.assert_close(dvx, lvx, atol=1e-5, rtol=0)  # the deterministic eval transform, on the device


def test_views_depend_on_seed_epoch_and_index_alone() -> None:
    def dm(batch_size: int, seed: int = 0) -> OrdinalShapesDataModule:
        m = OrdinalShapesDataModule(
            num_classes=3,
            train_size=24,
            val_size=8,
            test_size=8,
            image_size=16,
            batch_size=batch_size,
            num_workers=0,
            train_views=SupConViews(),
            augment_on="device",
            seed=seed,
        )
        m.setup("fit")
        return m

    def epoch(m: OrdinalShapesDataModule, e: int, loader: Any = None) -> dict[int, torch.Tensor]:
        loader = loader or m.train_dataloader()
        loader.sampler.set_epoch(e)
        out = {}
        for raw in loader:
            views, _ = m.on_after_batch_transfer(raw, 0)
            for row, index in enumerate(raw["index"].tolist()):
                out[index] = torch.stack([v[row] for v in views])
        return out

    a, b = epoch(dm(4), 1), epoch(dm(6), 1)  # other batches, other positions: the same views per sample
    assert set(a) == set(b) and all(torch.equal(a[i], b[i]) for i in a)
    assert not torch.equal(a[0], epoch(dm(4), 0)[0])
    assert not torch.equal(a[0], epoch(dm(4, seed=1), 1)[0])
    m = dm(4)
    resumed = m.train_dataloader()
    resumed.load_state_dict({"epoch": 1, "batches": 2, "batch_size": 4})
    rest = epoch(m, 1, resumed)
    assert len(rest) == 24 - 8 and all(torch.equal(rest[i], a[i]) for i in rest)


def test_a_view_transform_without_a_device_form_is_refused() -> None:
    class Mine(ViewTransform):
        n_views = 2  # type: ignore[assignment]

        def build(self, image_size: int, mean: Any, std: Any) -> Any:
            return SupConViews().build(image_size, mean, std)

    dm = OrdinalShapesDataModule(
        num_classes=3, train_size=8, val_size=4, test_size=4, batch_size=4, num_workers=0, train_views=Mine(), augment_on="device"
    )
    with pytest.raises(NotImplementedError, match="Mine has no device form .* set data.augment_on: loader"):
        dm.setup("fit")


def test_bad_settings_name_the_fix() -> None:
    with pytest.raises(DataConfigError, match="cache"):
        OrdinalShapesDataModule(cache="ram")  # type: ignore[arg-type]
    with pytest.raises(DataConfigError, match="augment_on"):
        OrdinalShapesDataModule(augment_on="gpu")  # type: ignore[arg-type]
    with pytest.raises(DataConfigError, match="cache_size"):
        OrdinalShapesDataModule(cache_size=2)


def test_pin_memory_follows_the_accelerator() -> None:
    dm = OrdinalShapesDataModule(num_classes=3, train_size=8, val_size=4, test_size=4, batch_size=4, num_workers=0)
    assert dm.pin_memory is None and dm._pin() is False  # no trainer, or a CPU trainer: nothing to pin for
    dm.trainer = cpu_trainer()
    assert dm._pin() is False
    assert OrdinalShapesDataModule(pin_memory=True)._pin() is True


@pytest.mark.parametrize("views", [pytest.param(None, marks=pytest.mark.slow), "multicrop"])
def test_resume_in_process_is_exact_mid_epoch_on_the_device_path(views: str | None, tmp_path: Path) -> None:
    """A fit stopped after step 3 of 4 (mid-epoch 1) and resumed equals one uninterrupted fit, bit for bit."""
    from cloc_lightning.methods import CEModule, SupConModule

    def build() -> tuple[L.LightningModule, L.LightningDataModule]:
        kw: dict[str, Any] = dict(
            num_classes=3, train_size=32, val_size=8, test_size=8, batch_size=16, num_workers=0, cache="memory", augment_on="device"
        )
        if views is None:
            return CEModule(num_classes=3, **SMALL), OrdinalShapesDataModule(augment="rrc_flip", **kw)
        return SupConModule(num_classes=3, n_views=4, **SMALL), OrdinalShapesDataModule(
            train_views=MultiCropViews(2, 2, local_size=24), **kw
        )

    full, resumed = fit_stopped_and_resumed(tmp_path, build)
    assert_same(resumed.state_dict(), full.state_dict(), "state_dict")


def test_a_test_run_decodes_no_training_image(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    real = cache_mod.build_store

    def recording(base: Any, layout: StoreLayout, cache: Any, what: str, **kw: Any) -> Any:
        built.append(what)
        return real(base, layout, cache, what, **kw)

    monkeypatch.setattr("cloc_lightning.data.store_setup.build_store", recording)
    dm = OrdinalShapesDataModule(num_classes=3, train_size=24, val_size=8, test_size=8, batch_size=4, num_workers=0, cache="memory")
    dm.setup("test")
    assert [w.split()[1] for w in built] == ["test"]  # nor a validation image
    assert len(dm.on_after_batch_transfer(next(iter(dm.test_dataloader())), 0)[1]) == 4


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_cifar10_files_in_torchvisions_layout_on_the_device_path(cache: str, tmp_path: Path) -> None:
    """The in-memory uint8 sets (CIFAR-10's pickles) too: stored at their own 32 px, the same evaluation batches."""
    from cloc_lightning.data import CIFAR10DataModule
    from tests.data.test_torchvision_data import _write_cifar10

    _write_cifar10(tmp_path)
    kw: dict[str, Any] = dict(root=str(tmp_path), download=False, batch_size=8, num_workers=0, augment="crop_flip")
    loader = CIFAR10DataModule(**kw)
    device = CIFAR10DataModule(cache=cache, cache_dir=str(tmp_path / "cache"), augment_on="device", train_views=SupConViews(), **kw)
    for dm in (loader, device):
        dm.setup("fit")
    assert device.store_layout("train", device._ensure_base()["train"]) == StoreLayout("fit", 32)
    views, labels = device.on_after_batch_transfer(next(iter(device.train_dataloader())), 0)
    assert len(views) == 2 and views[0].shape == (8, 3, 32, 32) and labels.shape == (8,)
    (lx, ly), (dx, dy) = next(iter(loader.val_dataloader())), device.on_after_batch_transfer(next(iter(device.val_dataloader())), 0)
    assert torch.equal(ly, dy)
    torch.testing.assert_close(dx, lx, atol=1e-5, rtol=0)
