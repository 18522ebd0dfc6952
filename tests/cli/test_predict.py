"""``predict`` on any folder or CSV of images (``data.predict_root``), and the CSV that ``PredictionWriter`` writes.

* The command line: a tiny CE fit, then ``predict`` on a folder of PNGs (nested, unlabelled),
  on a CSV with labels, on the test split (the ``path`` column holds the in-memory
  sample's description) and under DDP on 2 CPU processes (one merged CSV).
* The data module: unlabelled predict batches are image tensors; every bad
  ``predict_root`` is a :class:`DataConfigError` naming the fix.
* The writer: dataset indices and paths in every row (its DDP merge: ``tests/callbacks/test_predictions.py``).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from cloc_lightning.callbacks import PredictionWriter
from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.methods import CEModule
from tests.conftest import TINY_BACKBONE, cpu_trainer, run_cli

#: the tiny fit/predict configuration (as ``tiny_shapes_args``, with a 12-image test split)
ARGS = [
    "--model",
    "CEModule",
    "--model.num_classes",
    "4",
    "--model.backbone",
    TINY_BACKBONE,
    "--data",
    "OrdinalShapesDataModule",
    "--data.num_classes",
    "4",
    "--data.train_size",
    "32",
    "--data.val_size",
    "16",
    "--data.test_size",
    "12",
    "--data.batch_size",
    "8",
    "--data.num_workers",
    "0",
    "--trainer.max_epochs",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--trainer.logger.init_args.save_dir",
    "runs",
]


def _png(path: Path, seed: int, size: tuple[int, int] = (40, 28), mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(path)
    return path


def _image_folder(root: Path, n: int = 7) -> list[Path]:
    """``n`` PNGs at several depths (one grayscale, one RGBA) plus files that are not images."""
    files = [
        _png(
            root / ("" if i % 3 == 0 else f"sub{i % 3}") / ("deep" if i == 5 else "") / f"img{i}.png",
            i,
            mode=("L" if i == 1 else "RGBA" if i == 2 else "RGB"),
        )
        for i in range(n)
    ]
    (root / "notes.txt").write_text("not an image")
    (root / "sub1" / "labels.json").write_text("{}")
    return files


def _predictions(stdout: str, cwd: Path) -> tuple[Path, list[dict[str, str]]]:
    """The CSV named by the writer's message (relative to the command's folder) and its rows."""
    found = re.findall(r"predictions written to (\S+?\.csv)", stdout)
    assert found, stdout[-3000:]
    path = cwd / found[-1]
    return path, list(csv.DictReader(open(path, newline="")))


def _check_outputs(rows: list[dict[str, str]], n_classes: int = 4) -> None:
    for r in rows:
        assert 0 <= int(r["pred"]) < n_classes and 0 <= float(r["expected"]) <= n_classes - 1
        probs = [float(r[f"p{c}"]) for c in range(n_classes)]
        assert min(probs) >= 0 and abs(sum(probs) - 1) < 1e-3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(working folder, checkpoint) of a one-epoch CE fit on the built-in shapes."""
    work = tmp_path_factory.mktemp("predict")
    run_cli(["fit", *ARGS, "--trainer.logger.init_args.name", "fit"], work)
    ckpts = sorted((work / "runs" / "fit").rglob("*.ckpt"))
    assert ckpts, "the fit wrote no checkpoint"
    return work, ckpts[0]


def _predict(checkpoint: tuple[Path, Path], name: str, *extra: str) -> tuple[Path, list[dict[str, str]]]:
    work, ckpt = checkpoint
    out = run_cli(["predict", *ARGS, "--ckpt_path", str(ckpt), "--trainer.logger.init_args.name", name, *extra], work)
    return _predictions(out.stdout, work)


# ------------------------------------------------------------------------------- the command line
@pytest.mark.slow
def test_cli_predict_on_a_folder_of_images(checkpoint: tuple[Path, Path]) -> None:
    files = _image_folder(checkpoint[0] / "new_images")
    _, rows = _predict(checkpoint, "folder", "--data.predict_root", str(checkpoint[0] / "new_images"))
    assert len(rows) == len(files) and "target" not in rows[0]
    assert [int(r["index"]) for r in rows] == list(range(len(files)))
    paths = [Path(r["path"]) for r in rows]
    assert all(p.is_file() for p in paths) and {p.resolve() for p in paths} == {f.resolve() for f in files}
    root = checkpoint[0] / "new_images"
    assert [p.relative_to(root).as_posix() for p in paths] == sorted(f.relative_to(root).as_posix() for f in files)
    _check_outputs(rows)


@pytest.mark.slow
def test_cli_predict_on_a_csv_with_labels(checkpoint: tuple[Path, Path]) -> None:
    folder = checkpoint[0] / "listed"
    files = [_png(folder / "imgs" / f"{i}.png", 100 + i) for i in range(6)]
    labels = [3, 0, 2, 1, 1, 0]
    order = [4, 0, 5, 2, 1, 3]  # the CSV's order is the index order, not the sorted paths
    (folder / "list.csv").write_text("path,label\n" + "".join(f"imgs/{i}.png,{labels[i]}\n" for i in order))
    _, rows = _predict(checkpoint, "csv", "--data.predict_root", str(folder / "list.csv"))
    assert [int(r["index"]) for r in rows] == list(range(6))
    assert [Path(r["path"]).resolve() for r in rows] == [files[i].resolve() for i in order]
    assert [int(r["target"]) for r in rows] == [labels[i] for i in order]
    _check_outputs(rows)


@pytest.mark.slow
def test_cli_predict_on_the_test_split_names_the_samples(checkpoint: tuple[Path, Path]) -> None:
    _, rows = _predict(checkpoint, "test_split")
    assert len(rows) == 12 and [int(r["index"]) for r in rows] == list(range(12))
    assert [r["path"] for r in rows] == [f"sample {i}" for i in range(12)]  # TensorImageDataset.describe
    assert {int(r["target"]) for r in rows} <= set(range(4))
    _check_outputs(rows)


@pytest.mark.slow
@pytest.mark.ddp
def test_cli_predict_under_ddp_writes_one_merged_file(checkpoint: tuple[Path, Path]) -> None:
    """2 CPU processes share 7 images (4 + 3): one predictions.csv sorted by index, no rank parts left."""
    files = _image_folder(checkpoint[0] / "ddp_images", n=7)
    path, rows = _predict(
        checkpoint,
        "ddp",
        "--data.predict_root",
        str(checkpoint[0] / "ddp_images"),
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp",
        "--data.batch_size",
        "2",
    )
    assert [int(r["index"]) for r in rows] == list(range(7))
    assert sorted(Path(r["path"]).resolve() for r in rows) == sorted(f.resolve() for f in files)
    assert not list(path.parent.glob("predictions.rank*.csv"))
    _check_outputs(rows)


# ------------------------------------------------------------------------------- the data module
def _dm(root: Path | str | None, **kw: Any) -> OrdinalShapesDataModule:
    return OrdinalShapesDataModule(
        num_classes=4,
        train_size=8,
        val_size=4,
        test_size=4,
        batch_size=4,
        num_workers=0,
        predict_root=None if root is None else str(root),
        **kw,
    )


def test_unlabelled_predict_batches_are_image_tensors_and_the_modules_predict_them(tmp_path: Path) -> None:
    files = _image_folder(tmp_path / "imgs", n=5)
    dm = _dm(tmp_path / "imgs")
    dm.setup("predict")
    assert dm._base is None  # the training data is not built for predict_root
    assert [dm.predict_set.describe(i) for i in range(5)] == sorted(
        (str(f) for f in files), key=lambda s: Path(s).relative_to(tmp_path / "imgs").as_posix()
    )
    batch = next(iter(dm.predict_dataloader()))
    assert isinstance(batch, torch.Tensor) and batch.shape == (4, 3, 32, 32)
    out = CEModule(num_classes=4, backbone=TINY_BACKBONE).eval().predict_step(batch, 0)
    assert set(out) == {"pred", "expected", "probs"}

    writer = PredictionWriter(str(tmp_path / "out" / "p.csv"))
    trainer = cpu_trainer(callbacks=[writer])
    trainer.predict(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=dm, return_predictions=False)
    with open(tmp_path / "out" / "p.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["path"] for r in rows] == [dm.predict_set.describe(i) for i in range(5)]
    assert [r["index"] for r in rows] == [str(i) for i in range(5)] and "target" not in rows[0]


def test_predict_csv_labels_may_be_class_names(tmp_path: Path) -> None:
    _png(tmp_path / "a.png", 0)
    _png(tmp_path / "b.png", 1)
    (tmp_path / "named.csv").write_text("path,label\na.png,3 objects\nb.png, 1 object \n")
    dm = _dm(tmp_path / "named.csv")
    dm.setup("predict")
    assert dm.predict_set.targets == [2, 0]
    x, y = next(iter(dm.predict_dataloader()))
    assert x.shape == (2, 3, 32, 32) and y.tolist() == [2, 0]


def test_bad_predict_roots_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match="does not exist or is not a directory; point data.predict_root"):
        _dm(tmp_path / "missing").setup("predict")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "readme.txt").write_text("no images here")
    with pytest.raises(DataConfigError, match="no images under predict_root .*searched recursively"):
        _dm(tmp_path / "empty").setup("predict")
    with pytest.raises(DataConfigError, match=r"predict_root CSV .*missing\.csv' does not exist"):
        _dm(tmp_path / "missing.csv").setup("predict")
    _png(tmp_path / "a.png", 0)
    (tmp_path / "nopath.csv").write_text("file,label\na.png,1\n")
    with pytest.raises(DataConfigError, match=r"has no 'path' column \(columns: \['file', 'label'\]\)"):
        _dm(tmp_path / "nopath.csv").setup("predict")
    (tmp_path / "norows.csv").write_text("path\n")
    with pytest.raises(DataConfigError, match="has no rows"):
        _dm(tmp_path / "norows.csv").setup("predict")
    (tmp_path / "gone.csv").write_text("path\na.png\nb.png\n")
    with pytest.raises(DataConfigError, match=r"1 path\(s\) .* are not files .*line 3: 'b.png'; fix or remove those rows"):
        _dm(tmp_path / "gone.csv").setup("predict")
    (tmp_path / "range.csv").write_text("path,label\na.png,1\na.png,4\na.png,\n")
    with pytest.raises(
        DataConfigError,
        match=r"2 label\(s\) .* are not integers in \[0, 4\): line 3: 'a.png' "
        r"\(label '4'\); line 4: 'a.png' \(label ''\); fix those rows, or drop",
    ):
        _dm(tmp_path / "range.csv").setup("predict")
    (tmp_path / "names.csv").write_text("path,label\na.png,2 objects\na.png,five objects\n")
    with pytest.raises(
        DataConfigError,
        match=r"not names from class_names \['1 object', .*line 3: 'a.png' "
        r"\(label 'five objects'\)",
    ):
        _dm(tmp_path / "names.csv").setup("predict")
