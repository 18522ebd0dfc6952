"""Data modules: parsing, deterministic splits, subsampling, multi-view batches, bad input."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cloc_lightning.data import (
    CSVDataModule,
    DataConfigError,
    ImageFolderDataModule,
    MultiCropViews,
    OrdinalShapesDataModule,
    SupConViews,
    UTKFaceDataModule,
    make_ordinal_shapes,
    parse_utkface_name,
)
from tests.conftest import CIFAR10, UTKFACE, needs


def _jpeg(path: Path, seed: int = 0, size: int = 24) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 255, size=(size, size, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)


def _utk_folder(root: Path, ages: list[int]) -> list[str]:
    names = []
    for i, age in enumerate(ages):
        name = f"{age}_{i % 2}_{i % 5}_2017010{i % 10}1234{i:04d}.jpg.chip.jpg"
        _jpeg(root / name, seed=i)
        names.append(name)
    return names


# ------------------------------------------------------------------ parsing
def test_parse_utkface_name() -> None:
    assert parse_utkface_name("26_1_3_20170119193729543.jpg.chip.jpg") == {"age": 26, "gender": 1, "race": 3}
    assert parse_utkface_name("/x/y/61_1_20170109142408075.jpg.chip.jpg")["age"] == 61  # missing race field
    assert parse_utkface_name("face.jpg") is None


def test_age_bins_and_age_ranks(tmp_path: Path) -> None:
    dm = UTKFaceDataModule(str(tmp_path), age_bins=[0, 10, 20])
    assert [dm.age_to_label(a) for a in (0, 9, 10, 19, 20, 99)] == [0, 0, 1, 1, 2, 2]
    assert dm.discover_class_names() == ["0-9", "10-19", "20+"]
    dm = UTKFaceDataModule(str(tmp_path), label_mode="age", min_age=5, max_age=9)
    assert [dm.age_to_label(a) for a in (1, 5, 7, 9, 50)] == [0, 0, 2, 4, 4]
    assert dm.num_classes == 5


def test_utkface_split_is_deterministic_and_stable(tmp_path: Path) -> None:
    ages = [int(a) for a in np.random.default_rng(0).integers(1, 90, size=60)]
    _utk_folder(tmp_path / "a", ages)
    dm1 = UTKFaceDataModule(str(tmp_path / "a"), batch_size=4, num_workers=0)
    dm1.setup("fit")
    dm2 = UTKFaceDataModule(str(tmp_path / "a"), batch_size=4, num_workers=0)
    dm2.setup("fit")
    files = lambda dm, s: sorted(Path(f).name for f in getattr(dm, f"{s}_set").base.files)  # noqa: E731
    for s in ("train", "val", "test"):
        assert files(dm1, s) == files(dm2, s)
    assert len(dm1.train_set) + len(dm1.val_set) + len(dm1.test_set) == 60
    # adding files never moves existing ones between splits
    _utk_folder(tmp_path / "a", [*ages, 33, 44, 55])
    dm3 = UTKFaceDataModule(str(tmp_path / "a"), batch_size=4, num_workers=0)
    dm3.setup("fit")
    assert set(files(dm1, "test")) <= set(files(dm3, "test"))
    # labels follow the bins
    for f, y in zip(dm1.train_set.base.files, dm1.train_set.base.targets, strict=True):
        assert y == dm1.age_to_label(parse_utkface_name(f)["age"])


def test_few_shot_fraction_and_class_shift() -> None:
    dm = OrdinalShapesDataModule(num_classes=4, train_size=200, val_size=20, test_size=20, few_shot=5, num_workers=0, batch_size=4)
    dm.setup("fit")
    assert np.bincount(dm.train_set.targets).tolist() == [5, 5, 5, 5]
    dm = OrdinalShapesDataModule(num_classes=4, train_size=200, val_size=20, test_size=20, train_fraction=0.1, num_workers=0, batch_size=4)
    dm.setup("fit")
    assert np.bincount(dm.train_set.targets).tolist() == [5, 5, 5, 5]
    dm = OrdinalShapesDataModule(
        num_classes=4, train_size=200, val_size=20, test_size=20, class_fraction={0: 0.2, 3: 0.0}, num_workers=0, batch_size=4
    )
    dm.setup("fit")
    assert np.bincount(dm.train_set.targets, minlength=4).tolist() == [10, 50, 50, 0]


def test_shapes_are_deterministic_and_show_the_count() -> None:
    a, ya = make_ordinal_shapes(12, 5, 32, seed=3)
    b, yb = make_ordinal_shapes(12, 5, 32, seed=3)
    assert torch.equal(a, b) and torch.equal(ya, yb)
    assert a.dtype == torch.uint8 and a.shape == (12, 3, 32, 32)
    assert sorted(set(ya.tolist())) == list(range(5))
    c, _ = make_ordinal_shapes(12, 5, 32, seed=4)
    assert not torch.equal(a, c)


def test_single_and_multi_view_batches() -> None:
    dm = OrdinalShapesDataModule(num_classes=3, train_size=30, val_size=9, test_size=9, batch_size=6, num_workers=0)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (6, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.long
    dm = OrdinalShapesDataModule(
        num_classes=3, train_size=30, val_size=9, test_size=9, batch_size=6, num_workers=0, train_views=SupConViews(n_views=3)
    )
    dm.setup("fit")
    views, y = next(iter(dm.train_dataloader()))
    assert dm.n_views == 3 and len(views) == 3 and all(v.shape == (6, 3, 32, 32) for v in views)
    assert not torch.equal(views[0], views[1])  # independent augmentations
    xv, _ = next(iter(dm.val_dataloader()))
    assert isinstance(xv, torch.Tensor)  # evaluation stays single-view
    mc = MultiCropViews(num_global_views=2, num_local_views=3, local_size=16)
    dm = OrdinalShapesDataModule(num_classes=3, train_size=30, val_size=9, test_size=9, batch_size=6, num_workers=0, train_views=mc)
    dm.setup("fit")
    views, _ = next(iter(dm.train_dataloader()))
    assert [v.shape[-1] for v in views] == [32, 32, 16, 16, 16]


def test_train_order_is_seeded() -> None:
    def first_labels(seed: int) -> list[int]:
        dm = OrdinalShapesDataModule(
            num_classes=5, train_size=50, val_size=5, test_size=5, batch_size=10, num_workers=0, seed=seed, augment="none"
        )
        dm.setup("fit")
        return next(iter(dm.train_dataloader()))[1].tolist()

    assert first_labels(1) == first_labels(1)
    assert first_labels(1) != first_labels(2)


def test_image_folder_layouts(tmp_path: Path) -> None:
    for split, n in (("train", 10), ("test", 4)):
        for c in ("cat", "dog", "emu"):
            for i in range(n):
                _jpeg(tmp_path / "split" / split / c / f"{i}.jpg", seed=i)
    dm = ImageFolderDataModule(str(tmp_path / "split"), val_fraction=0.2, batch_size=4, num_workers=0)
    dm.setup("fit")
    assert dm.class_names == ["cat", "dog", "emu"] and dm.task == "nominal"
    assert len(dm.train_set) + len(dm.val_set) == 30 and len(dm.test_set) == 12
    dm = ImageFolderDataModule(str(tmp_path / "split"), task="ordinal", class_order=["emu", "cat", "dog"], batch_size=4, num_workers=0)
    dm.setup("fit")
    assert dm.class_names == ["emu", "cat", "dog"]
    for f, y in zip(dm.test_set.base.files, dm.test_set.base.targets, strict=True):
        assert y == ["emu", "cat", "dog"].index(Path(f).parent.name)
    with pytest.raises(DataConfigError, match="class_order does not match"):
        _ = ImageFolderDataModule(str(tmp_path / "split"), class_order=["cat", "dog"]).num_classes
    for c in ("a", "b"):
        for i in range(20):
            _jpeg(tmp_path / "pool" / c / f"{i}.png", seed=i)
    dm = ImageFolderDataModule(str(tmp_path / "pool"), batch_size=2, num_workers=0)
    dm.setup("fit")
    assert len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 40


def test_csv_module(tmp_path: Path) -> None:
    rows = ["path,label,split"]
    for i in range(12):
        _jpeg(tmp_path / "img" / f"{i}.jpg", seed=i)
        rows.append(f"img/{i}.jpg,{['low', 'mid', 'high'][i % 3]},{['train', 'train', 'val', 'test'][i % 4]}")
    (tmp_path / "data.csv").write_text("\n".join(rows))
    dm = CSVDataModule(str(tmp_path / "data.csv"), split_column="split", class_names=["low", "mid", "high"], batch_size=2, num_workers=0)
    dm.setup("fit")
    assert dm.num_classes == 3 and len(dm.train_set) == 6 and len(dm.val_set) == 3 and len(dm.test_set) == 3
    x, _y = next(iter(dm.train_dataloader()))
    assert x.shape[0] == 2
    bad = CSVDataModule(str(tmp_path / "data.csv"), label_column="age")
    with pytest.raises(DataConfigError, match="--data.label_column 'age': no such column in"):
        bad.setup("fit")
    (tmp_path / "int.csv").write_text("path,label\n" + "\n".join(f"img/{i}.jpg,{i % 4}" for i in range(12)))
    dm = CSVDataModule(str(tmp_path / "int.csv"), class_names=["a", "b", "c"])
    with pytest.raises(DataConfigError, match=r"labels must lie in \[0, 3\)"):
        dm.setup("fit")


# ----------------------------------------------------------------- bad input
def test_missing_and_empty_roots(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match="does not exist"):
        UTKFaceDataModule(str(tmp_path / "nope")).setup("fit")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataConfigError, match="contains no image files"):
        UTKFaceDataModule(str(tmp_path / "empty")).setup("fit")
    with pytest.raises(DataConfigError, match="does not exist"):
        ImageFolderDataModule(str(tmp_path / "nope")).setup("fit")
    with pytest.raises(DataConfigError, match="no class folders"):
        ImageFolderDataModule(str(tmp_path / "empty")).setup("fit")


@pytest.mark.parametrize("bad", [("holiday.jpg", "x_1_2_3.jpg"), ("IMG_0001.jpg", "age_0_1.jpg")])
def test_unparseable_utkface_names_listed(tmp_path: Path, bad: tuple[str, str]) -> None:
    _utk_folder(tmp_path, [20, 30, 40, 50])
    for name in bad:
        _jpeg(tmp_path / name)
    first = sorted(bad)[0].replace(".", r"\.")
    with pytest.raises(DataConfigError, match=rf"2 file\(s\).*{first}.*strict_names: false"):
        UTKFaceDataModule(str(tmp_path)).setup("fit")
    dm = UTKFaceDataModule(str(tmp_path), strict_names=False, batch_size=1, drop_last=False, split_fractions=(1, 1, 1))
    with pytest.warns(UserWarning, match="skipped 2 UTKFace"):
        dm._ensure_base()


def test_empty_split_and_batch_larger_than_train(tmp_path: Path) -> None:
    _utk_folder(tmp_path, [20, 30])
    with pytest.raises(DataConfigError, match="split .* is empty|is empty"):
        UTKFaceDataModule(str(tmp_path), split_fractions=(1.0, 0.0, 0.0), batch_size=1).setup("fit")
    dm = OrdinalShapesDataModule(num_classes=2, train_size=8, val_size=4, test_size=4, batch_size=16, num_workers=0)
    with pytest.raises(DataConfigError, match="fewer than batch_size=16"):
        dm.setup("fit")


def test_bad_arguments() -> None:
    with pytest.raises(DataConfigError, match="age_bins"):
        UTKFaceDataModule("x", age_bins=[5, 10])
    with pytest.raises(DataConfigError, match="few_shot"):
        OrdinalShapesDataModule(few_shot=0)
    with pytest.raises(DataConfigError, match="batch_size"):
        OrdinalShapesDataModule(batch_size=0)
    with pytest.raises(DataConfigError, match="bad_files"):
        OrdinalShapesDataModule(bad_files="ignore")  # type: ignore[arg-type]
    with pytest.raises(DataConfigError, match="num_classes"):
        OrdinalShapesDataModule(num_classes=1)


def test_corrupt_image_fails_with_name_or_is_skipped(tmp_path: Path) -> None:
    for c in ("a", "b"):
        for i in range(4):
            _jpeg(tmp_path / "train" / c / f"{i}.jpg", seed=i)
            _jpeg(tmp_path / "test" / c / f"{i}.jpg", seed=i)
    (tmp_path / "train" / "a" / "0.jpg").write_bytes(b"not a jpeg at all")
    dm = ImageFolderDataModule(str(tmp_path), val_fraction=0.0, batch_size=8, num_workers=0, augment="none")
    dm.setup("test")  # (no validation split here: val_fraction 0)
    with pytest.raises(RuntimeError, match=r"Cannot read image .*0\.jpg.*bad_files: skip"):
        list(dm.train_dataloader())
    dm = ImageFolderDataModule(str(tmp_path), val_fraction=0.0, batch_size=8, num_workers=0, augment="none", bad_files="skip")
    dm.setup("test")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        batches = list(dm.train_dataloader())
    assert sum(b[0].shape[0] for b in batches) == 8
    assert any("skipping unreadable image" in str(w.message) for w in rec)


# ---------------------------------------------------------------- real data
@needs(UTKFACE)
def test_real_utkface_loads() -> None:
    dm = UTKFaceDataModule(str(UTKFACE), batch_size=16, num_workers=0, image_size=48)
    dm.setup("fit")
    assert dm.num_classes == 8
    n = len(dm.train_set) + len(dm.val_set) + len(dm.test_set)
    assert n == sum(1 for _ in UTKFACE.iterdir())
    assert abs(len(dm.train_set) / n - 0.7) < 0.03
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 48, 48) and int(y.max()) < 8


@needs(CIFAR10)
def test_real_cifar10_folder_multiview() -> None:
    dm = ImageFolderDataModule(str(CIFAR10), batch_size=8, num_workers=0, train_views=SupConViews(2))
    dm.setup("fit")
    assert dm.class_names[0] == "airplane" and len(dm.test_set) == 10000
    views, _y = next(iter(dm.train_dataloader()))
    assert len(views) == 2 and views[0].shape == (8, 3, 32, 32)
