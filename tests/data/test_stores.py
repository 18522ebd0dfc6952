"""Decode-once stores (issue 49): served only for the data they were built from, never smaller than their views
in silence, the same evaluation pixels as without a cache, visible and removable, one per node in memory.
"""

from __future__ import annotations

import json
import os
import pickle
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from cloc_lightning.cli import main as cli_main
from cloc_lightning.data import CIFAR10DataModule, ImageFolderDataModule, OrdinalShapesDataModule, STL10DataModule, SupConViews
from cloc_lightning.data import cache as cache_mod
from cloc_lightning.data.cache import StoredImages, StoreLayout, build_store
from cloc_lightning.data.datasets import LabelledDataset
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.stores import hold, list_stores, release, remove_stores, shm_root, sweep_unused
from tests.data.test_torchvision_data import _write_cifar10, _write_stl10

QUIET: dict[str, Any] = dict(batch_size=2, num_workers=0, drop_last=False)


def _setup(dm: Any, stage: str = "fit") -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup(stage)
    return dm


def _train_pixels(dm: Any) -> torch.Tensor:
    """The stored training images of ``dm`` (its store's bytes, in order)."""
    store = dm._stored["train"]
    assert isinstance(store, StoredImages)
    return store.images.clone()


# ----------------------------------------------------------------------------- item 1: the key covers the pixels
def _cifar_with_same_labels(root: Path, pixels_seed: int) -> None:
    """A CIFAR-10 copy with the labels of seed 0 and the pixels of ``pixels_seed`` (a corrupted copy, CIFAR-10-C style)."""
    _write_cifar10(root, seed=0)
    other = _write_cifar10(root / "other", seed=pixels_seed)
    folder = root / "cifar-10-batches-py"
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        entry["data"] = other[name]
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)


@pytest.mark.parametrize("augment_on", ["loader", "device"])
def test_two_cifar_roots_with_the_same_labels_get_their_own_stores(augment_on: str, tmp_path: Path) -> None:
    _cifar_with_same_labels(tmp_path / "clean", 0)
    _cifar_with_same_labels(tmp_path / "corrupt", 1)
    kw: dict[str, Any] = dict(download=False, val_fraction=0.2, cache="disk", cache_dir=str(tmp_path / "c"), augment_on=augment_on, **QUIET)
    clean = _setup(CIFAR10DataModule(str(tmp_path / "clean"), augment="crop_flip", **kw))
    corrupt = _setup(CIFAR10DataModule(str(tmp_path / "corrupt"), augment="crop_flip", **kw))
    assert clean.train_set.targets == corrupt.train_set.targets  # the same labels, the same derived split
    plain = _setup(CIFAR10DataModule(str(tmp_path / "corrupt"), download=False, val_fraction=0.2, augment="crop_flip", **QUIET))
    want = torch.stack([plain.train_set.base.load(i) for i in range(len(plain.train_set.base))])
    assert torch.equal(_train_pixels(corrupt), want)  # was the clean root's pixels
    assert not torch.equal(_train_pixels(clean), want)
    assert corrupt._stored["val"].key != clean._stored["val"].key


@pytest.mark.parametrize("split", ["train", "train+unlabeled"])
def test_two_stl10_roots_with_the_same_labels_get_their_own_stores(split: str, tmp_path: Path) -> None:
    for name, seed in (("a", 0), ("b", 1)):
        _write_stl10(tmp_path / name, seed=seed)
        if name == "b":  # the labels of root a
            for y in ("train_y.bin", "test_y.bin"):
                (tmp_path / "b" / "stl10_binary" / y).write_bytes((tmp_path / "a" / "stl10_binary" / y).read_bytes())
    kw: dict[str, Any] = dict(
        download=False, val_fraction=0.2, train_split=split, cache="disk", cache_dir=str(tmp_path / "c"), image_size=32, **QUIET
    )
    a = _setup(STL10DataModule(str(tmp_path / "a"), **kw))
    b = _setup(STL10DataModule(str(tmp_path / "b"), **kw))
    assert a._stored["train"].key != b._stored["train"].key and a._stored["val"].key != b._stored["val"].key
    assert not torch.equal(_train_pixels(a), _train_pixels(b))


def _ppm(path: Path, seed: int) -> None:
    """A binary PPM: its byte size depends on the image's size alone, so a rewrite can keep it."""
    arr = (np.random.default_rng(seed).random((20, 24, 3)) * 255).astype(np.uint8)
    Image.fromarray(arr).save(path)


@pytest.mark.parametrize("augment_on", ["loader", "device"])
def test_a_file_rewritten_with_its_size_and_mtime_kept_is_decoded_again(augment_on: str, tmp_path: Path) -> None:
    """As ``cp -p``, ``rsync -a`` or ``tar x`` leave it: the same byte size and modification time, new pixels."""
    for c in range(2):
        (tmp_path / "data" / f"c{c}").mkdir(parents=True)
        for i in range(8):
            _ppm(tmp_path / "data" / f"c{c}" / f"{i}.ppm", seed=10 * c + i)
    kw: dict[str, Any] = dict(split_fractions=(0.5, 0.25, 0.25), image_size=16, cache="disk", cache_dir=str(tmp_path / "c"))
    first = _setup(ImageFolderDataModule(str(tmp_path / "data"), augment_on=augment_on, **kw, **QUIET))
    target = Path(first.train_set.base.describe(0))
    st = target.stat()
    time.sleep(0.01)
    _ppm(target, seed=999)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_size == st.st_size and target.stat().st_mtime_ns == st.st_mtime_ns
    again = _setup(ImageFolderDataModule(str(tmp_path / "data"), augment_on=augment_on, **kw, **QUIET))
    plain = _setup(ImageFolderDataModule(str(tmp_path / "data"), **{**kw, "cache": "none"}, **QUIET))
    from torchvision.transforms.v2 import functional as TF

    fresh = TF.pil_to_tensor(plain.train_set.base.load(0))
    assert torch.equal(again._stored["train"].load(0), TF.resize(fresh, [16, 16], antialias=True))  # was the old pixels
    assert again._stored["train"].key != first._stored["train"].key


class _OwnSet(LabelledDataset):
    def __init__(self) -> None:
        self.targets = [0, 1] * 4

    def load(self, index: int) -> torch.Tensor:
        return torch.full((3, 8, 8), index, dtype=torch.uint8)


def test_a_dataset_the_key_cannot_describe_is_refused_on_disk_and_fine_in_memory(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match=r"data.cache: disk: .* _OwnSet, whose pixels a store key cannot describe.*store_identity"):
        build_store(_OwnSet(), StoreLayout("resize", 8), "disk", "t", cache_dir=str(tmp_path), progress=False)
    store = build_store(_OwnSet(), StoreLayout("resize", 8), "memory", "t", progress=False)
    assert int(store.images[5].max()) == 5


def test_every_built_in_kind_has_an_identity(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    _write_stl10(tmp_path)
    modules = [
        CIFAR10DataModule(str(tmp_path), download=False, val_fraction=0.2, **QUIET),
        STL10DataModule(str(tmp_path), download=False, train_split="train+unlabeled", **QUIET),
        OrdinalShapesDataModule(num_classes=3, train_size=12, val_size=6, test_size=6, **QUIET),
    ]
    for dm in modules:
        for split, ds in dm._ensure_base().items():
            assert ds.store_identity() is not None, (type(dm).__name__, split)


# ----------------------------------------------------------------------------- item 3: a store smaller than its views
def test_a_store_below_the_rule_warns_and_below_the_views_is_refused(tmp_path: Path) -> None:
    kw: dict[str, Any] = dict(num_classes=3, train_size=12, val_size=6, test_size=6, image_size=32, train_views=SupConViews(), **QUIET)
    dm = OrdinalShapesDataModule(**kw)
    rule = dm.store_layout("train", dm._ensure_base()["train"]).size
    assert rule == 32  # 32 px originals: the rule is capped at their own size
    small = OrdinalShapesDataModule(cache_size=24, cache="memory", **kw)
    with pytest.raises(DataConfigError, match=r"data.cache_size=24 is below the largest training view \(32 px\).*at least 32"):
        small.store_layout("train", small._ensure_base()["train"])
    from tests.data.test_device_path import _jpegs

    _jpegs(Path(tmp_path) / "faces", 6, size=(200, 200))
    faces: dict[str, Any] = dict(image_size=64, train_views=SupConViews(), split_fractions=(0.5, 0.25, 0.25), cache="memory", **QUIET)
    big = ImageFolderDataModule(str(tmp_path / "faces"), cache_size=72, **faces)
    with pytest.warns(UserWarning, match=r"data.cache_size=72 is below the stored-size rule's 166 px.*blurrier.*data.cache_size: null"):
        assert big.store_layout("train", big._ensure_base()["train"]) == StoreLayout("fit", 72)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at the rule or above: silent
        exact = ImageFolderDataModule(str(tmp_path / "faces"), cache_size=166, **faces)
        assert exact.store_layout("train", exact._ensure_base()["train"]) == StoreLayout("fit", 166)


# ----------------------------------------------------------------------------- item 4: evaluation pixels
@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_the_offline_probes_training_features_read_the_same_pixels_with_a_cache(cache: str, tmp_path: Path) -> None:
    """RandomResizedCrop configs store the fit layout; the probe's eval transform must not resize it a second time."""
    from tests.data.test_device_path import _jpegs

    _jpegs(tmp_path / "img", 24, size=(60, 48))
    kw: dict[str, Any] = dict(split_fractions=(0.5, 0.25, 0.25), image_size=16, train_views=SupConViews(), **QUIET)
    plain = _setup(ImageFolderDataModule(str(tmp_path / "img"), **kw))
    cached = _setup(ImageFolderDataModule(str(tmp_path / "img"), cache=cache, cache_dir=str(tmp_path / "c"), **kw))
    assert cached._stored["train"].layout.mode == "fit"
    for dm_a, dm_b in ((plain, cached),):
        a = torch.cat([x for x, _ in dm_a.train_eval_dataloader()])
        b = torch.cat([x for x, _ in dm_b.train_eval_dataloader()])
        assert torch.equal(a, b)  # was resized twice: 28 % of the pixels differed on the faces
        for split in ("val", "test"):
            la = torch.cat([x for x, _ in getattr(dm_a, f"{split}_dataloader")()])
            lb = torch.cat([x for x, _ in getattr(dm_b, f"{split}_dataloader")()])
            assert torch.equal(la, lb)


# ----------------------------------------------------------------------------- item 5: seeing and removing stores
def test_stores_are_listed_with_size_source_and_last_use_and_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.data.test_device_path import _jpegs

    monkeypatch.setenv("CLOC_SHM_DIR", str(tmp_path / "shm"))  # this test's memory stores alone

    _jpegs(tmp_path / "img", 24)
    for size in (16, 20):
        _setup(
            ImageFolderDataModule(
                str(tmp_path / "img"),
                split_fractions=(0.5, 0.25, 0.25),
                image_size=size,
                cache="disk",
                cache_dir=str(tmp_path / "c"),
                **QUIET,
            )
        )
    stores = [s for s in list_stores(str(tmp_path / "c"), memory=False)]
    assert len(stores) == 4 and all(s["complete"] and s["bytes"] > 0 for s in stores)
    assert all(s["source"].startswith(f"ImageFolderDataModule(root={tmp_path / 'img'}") for s in stores)
    cli_main(["cache", "list", "--cache_dir", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert "4 store(s) found" in out and "ImageFolderDataModule(root=" in out and "used 0 min ago" in out
    old = stores[0]
    past = time.time() - 10 * 86400
    os.utime(Path(old["path"]) / "last_used", (past, past))
    assert [s["key"] for s in remove_stores(str(tmp_path / "c"), older_than_days=5)] == [old["key"]]
    cli_main(["cache", "remove", stores[1]["key"], "--cache_dir", str(tmp_path / "c")])
    assert len(list_stores(str(tmp_path / "c"), memory=False)) == 2
    with pytest.raises(ValueError, match="say which stores"):
        remove_stores(str(tmp_path / "c"))
    with pytest.raises(ValueError, match=r"no store \['nope'\]"):
        remove_stores(str(tmp_path / "c"), keys=["nope"])


def test_out_of_space_names_the_stores_already_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.data.test_device_path import _jpegs

    files = _jpegs(tmp_path / "img", 24)
    _setup(
        ImageFolderDataModule(
            str(tmp_path / "img"), split_fractions=(0.5, 0.25, 0.25), image_size=16, cache="disk", cache_dir=str(tmp_path / "c"), **QUIET
        )
    )

    class Tiny:
        free = 1000
        total = 10**12

    monkeypatch.setattr(cache_mod.shutil, "disk_usage", lambda _: Tiny())
    from cloc_lightning.data.datasets import ImageFileDataset

    with pytest.raises(DataConfigError, match=r"2 store\(s\) there take .*ImageFolderDataModule.*cloc-lightning cache remove --older-than"):
        build_store(
            ImageFileDataset(files, [0] * 24), StoreLayout("resize", 32), "disk", "t", cache_dir=str(tmp_path / "c"), progress=False
        )


def test_the_docs_point_at_no_file_outside_the_repository() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    cited = [p.name for p in docs.rglob("*.md") if "shared/notes" in p.read_text()]
    assert cited == []


# ----------------------------------------------------------------------------- item 6: memory stores' life
def test_a_memory_store_lives_while_a_process_maps_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOC_SHM_DIR", str(tmp_path / "shm"))
    store = build_store(_OwnSet(), StoreLayout("resize", 8), "memory", "t", progress=False, token="run1")
    folder = Path(store.folder or "")
    assert folder.parent == shm_root() and folder.is_dir()
    assert sweep_unused(folder.parent, min_age_s=0) == []  # mapped here: left alone
    info = json.loads((folder / "info.json").read_text())
    assert info["n"] == 8 and info["complete"]
    listed = list_stores(str(tmp_path / "none"))
    assert [(s["kind"], s["in_use"]) for s in listed] == [("memory", True)]
    assert release(folder) and not folder.exists()  # the last user removes it
    # a store left by a killed run (no process maps it) is swept by the next build
    orphan = folder.parent / "orphan"
    orphan.mkdir()
    (orphan / "users.lock").touch()
    assert sweep_unused(folder.parent, min_age_s=0) == ["orphan"]
    hold(tmp_path)  # holding needs a users file: created on first hold
    assert release(tmp_path) is True or not tmp_path.exists()


@pytest.mark.parametrize("augment_on", ["loader", "device"])
def test_a_fit_decodes_no_test_image_and_a_later_test_stores_it(augment_on: str, tmp_path: Path) -> None:
    from cloc_lightning.data.cache import OnTheFlyStore

    kw: dict[str, Any] = dict(num_classes=3, train_size=12, val_size=6, test_size=6, augment_on=augment_on, **QUIET)
    dm = _setup(OrdinalShapesDataModule(cache="disk", cache_dir=str(tmp_path), **kw), "fit")
    assert isinstance(dm._stored["test"], OnTheFlyStore) and [r["split"] for r in dm.store_records] == ["train", "val"]
    _setup(dm, "test")
    assert isinstance(dm._stored["test"], StoredImages) and [r["split"] for r in dm.store_records] == ["train", "val", "test"]
    plain = _setup(OrdinalShapesDataModule(**kw), "test")
    a = [dm.on_after_batch_transfer(b, 0)[0] for b in dm.test_dataloader()]
    b = [plain.on_after_batch_transfer(b, 0)[0] for b in plain.test_dataloader()]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_cache_size_where_it_does_nothing_or_wastes_memory_warns(tmp_path: Path) -> None:
    from tests.data.test_device_path import _jpegs

    with pytest.warns(UserWarning, match=r"data.cache_size=64 has no effect: nothing is stored with data.cache: none"):
        OrdinalShapesDataModule(cache_size=64)
    flip = OrdinalShapesDataModule(num_classes=3, train_size=12, val_size=6, test_size=6, augment="flip", cache="memory", cache_size=64)
    with pytest.warns(
        UserWarning, match=r"data.cache_size=64 has no effect: the training pipeline starts with a fixed resize \(augment: flip\)"
    ):
        flip.store_layout("train", flip._ensure_base()["train"])
    _jpegs(tmp_path / "faces", 6, size=(200, 200))
    big = ImageFolderDataModule(
        str(tmp_path / "faces"),
        image_size=64,
        train_views=SupConViews(),
        split_fractions=(0.5, 0.25, 0.25),
        cache_size=400,
        cache="memory",
        **QUIET,
    )
    with pytest.warns(UserWarning, match=r"data.cache_size=400 is above the originals' long side \(200 px.*4.0x the memory"):
        big.store_layout("train", big._ensure_base()["train"])


def test_a_store_built_under_bad_files_skip_is_refused_under_raise(tmp_path: Path) -> None:
    from tests.data.test_device_path import _jpegs

    files = _jpegs(tmp_path / "img", 24)
    Path(files[3]).write_bytes(Path(files[3]).read_bytes()[:60])  # truncated
    kw: dict[str, Any] = dict(split_fractions=(0.5, 0.25, 0.25), image_size=16, cache="disk", cache_dir=str(tmp_path / "c"), **QUIET)
    _setup(ImageFolderDataModule(str(tmp_path / "img"), bad_files="skip", **kw))
    with pytest.raises(DataConfigError, match=r"cannot read image .*03.*built with data.bad_files: skip.*set data.bad_files: skip"):
        _setup(ImageFolderDataModule(str(tmp_path / "img"), **kw))


def test_disk_stores_in_use_are_not_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOC_SHM_DIR", str(tmp_path / "shm"))
    dm = _setup(
        OrdinalShapesDataModule(num_classes=3, train_size=12, val_size=6, test_size=6, cache="disk", cache_dir=str(tmp_path / "c"), **QUIET)
    )
    assert all(s["in_use"] for s in list_stores(str(tmp_path / "c")))
    assert remove_stores(str(tmp_path / "c"), everything=True) == []
    for split in ("train", "val"):
        release(Path(dm._stored[split].folder or ""))
    assert len(remove_stores(str(tmp_path / "c"), everything=True)) == 2 and not list((tmp_path / "c").glob("*.lock"))
    with pytest.raises(ValueError, match="--older-than must be a number of days >= 0"):
        remove_stores(str(tmp_path / "c"), older_than_days=-1)


def _build_and_die(shm: str) -> None:
    import signal

    os.environ["CLOC_SHM_DIR"] = shm
    store = build_store(_OwnSet(), StoreLayout("resize", 8), "memory", "t", progress=False, token="killed")
    assert store.folder is not None  # still mapped when the kill comes
    os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no release: as `kill -9` leaves it


def test_a_memory_store_of_a_killed_run_is_swept_by_the_next_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing as mp

    monkeypatch.setenv("CLOC_SHM_DIR", str(tmp_path / "shm"))
    child = mp.get_context("fork").Process(target=_build_and_die, args=(str(tmp_path / "shm"),))
    child.start()
    child.join(60)
    left = [p for p in (tmp_path / "shm").iterdir() if p.is_dir()]
    assert child.exitcode == -9 and len(left) == 1 and not list(tmp_path.joinpath("shm").glob("*.lock"))
    past = time.time() - 6  # the sweep spares folders younger than 5 s (a build taking its lock)
    os.utime(left[0], (past, past))
    store = build_store(_OwnSet(), StoreLayout("resize", 8), "memory", "t", progress=False, token="next")
    assert not left[0].exists() and Path(store.folder or "").is_dir()  # was left for 60 s after the kill


def test_a_file_system_without_flock_still_builds_and_serves_disk_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some NFS mounts answer flock with ENOLCK: a run still builds (its processes take turns by rank) and maps its store."""
    import errno
    import fcntl

    from cloc_lightning.data import stores

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(stores.fcntl, "flock", no_flock)
    assert fcntl.flock is no_flock  # the module the stores use
    dm = _setup(
        OrdinalShapesDataModule(num_classes=3, train_size=12, val_size=6, test_size=6, cache="disk", cache_dir=str(tmp_path), **QUIET)
    )
    again = _setup(
        OrdinalShapesDataModule(num_classes=3, train_size=12, val_size=6, test_size=6, cache="disk", cache_dir=str(tmp_path), **QUIET)
    )
    assert torch.equal(_train_pixels(dm), _train_pixels(again)) and dm._stored["train"].key == again._stored["train"].key


def test_cache_commands_refuse_a_cache_dir_that_is_no_folder(tmp_path: Path) -> None:
    """``cache list --cache_dir <a file or a missing folder>`` said "0 store(s) found" (an outside user)."""
    from cloc_lightning.data.stores import cache_main

    (tmp_path / "f.txt").write_text("x")
    for where, said in ((tmp_path / "f.txt", "is a file"), (tmp_path / "missing", "does not exist")):
        for action in (["list"], ["remove", "--all"]):
            with pytest.raises(ValueError, match=f"--cache_dir {where}: {said}"):
                cache_main([*action, "--cache_dir", str(where)])
