"""``data optimize`` and ``data.stream_from`` (cloc_lightning/data/optimize.py, streaming.py, stream_setup.py).

The chunks hold what ``data.cache`` stores (``raw``: bit-identical; ``jpeg``: close), a data module
reads them in place of the files with the same classes, subsets and transforms, the training order
is a function of ``(seed, epoch)`` alone that reads each chunk in one piece, and a chunk set that
does not fit the configuration stops at setup with one line.  Fits through the CLI, S3 and resume:
``test_stream_s3.py``, ``test_stream_resume.py``.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("litdata", reason="data.stream_from needs the [streaming] extra (litdata)")

from cloc_lightning.data import OrdinalShapesDataModule, SupConViews
from cloc_lightning.data.cache import store_image
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.optimize import optimize_data
from cloc_lightning.data.streaming import (
    STREAM_FILE,
    ChunkShuffleSampler,
    ChunkSplit,
    DistributedChunkShuffleSampler,
    StreamError,
    chunk_order,
    parse_size,
)

SHAPES = dict(num_classes=4, train_size=96, val_size=20, test_size=20, image_size=32, batch_size=8, num_workers=0)


def _shapes(**kwargs: Any) -> OrdinalShapesDataModule:
    return OrdinalShapesDataModule(**{**SHAPES, **kwargs})


@pytest.fixture(scope="module")
def chunk_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shapes data written twice: raw pixels and JPEG, small chunks (several per split)."""
    root = tmp_path_factory.mktemp("chunks")
    out = {}
    for fmt in ("raw", "jpeg"):
        out[fmt] = root / fmt
        optimize_data(_shapes(), str(out[fmt]), image_format=fmt, workers=1, chunk_bytes="16KB")  # type: ignore[arg-type]
    return out


def test_parse_size() -> None:
    assert parse_size("x", "50GB") == 50 * 10**9
    assert parse_size("x", "512 MiB") == 512 * 2**20
    assert parse_size("x", 1000) == 1000
    assert parse_size("x", "2.5kb") == 2500
    for bad in ("lots", "", "-1GB", "0", "5XB", "nan"):
        with pytest.raises(StreamError, match="is not a size"):
            parse_size("data.stream_cache_limit", bad)


def test_chunk_order_reads_each_chunk_in_one_window() -> None:
    chunk_of = np.repeat(np.arange(10), [7, 5, 9, 3, 8, 8, 2, 6, 7, 5])
    n = len(chunk_of)
    for window in (1, 3):
        for epoch in range(3):
            order = chunk_order(chunk_of, seed=5, epoch=epoch, window=window)
            assert sorted(order) == list(range(n))
            assert order == chunk_order(chunk_of, seed=5, epoch=epoch, window=window)  # (seed, epoch) alone
            # the chunks met along the order: every window of chunks is finished before the next starts
            met = [int(chunk_of[p]) for p in order]
            first = {c: met.index(c) for c in set(met)}
            last = {c: len(met) - 1 - met[::-1].index(c) for c in set(met)}
            ranked = sorted(first, key=lambda c: first[c])
            groups = [ranked[i : i + window] for i in range(0, len(ranked), window)]
            for a, b in itertools.pairwise(groups):
                assert max(last[c] for c in a) < min(first[c] for c in b)
    assert chunk_order(chunk_of, 5, 0, 3) != chunk_order(chunk_of, 5, 1, 3)
    assert chunk_order(chunk_of, 5, 0, 3) != chunk_order(chunk_of, 6, 0, 3)


def test_raw_chunks_hold_the_pixels_data_cache_stores(chunk_sets: dict[str, Path]) -> None:
    files = _shapes()
    base = files._ensure_base()
    streamed = _shapes(stream_from=str(chunk_sets["raw"]))
    chunks = streamed._ensure_base()
    assert streamed.class_names == files.class_names
    for split in ("train", "val", "test"):
        split_set = chunks[split]
        assert isinstance(split_set, ChunkSplit)
        meta = split_set.meta
        layout = files.store_layout(split, base[split])
        assert split_set.layout == layout
        assert len(split_set) == len(base[split])
        for position in range(0, len(split_set), 7):
            source = meta["source_index"][position]
            slot, native, stored = store_image(base[split].load(source), layout)
            got, got_native, got_stored = split_set.stored(position)
            assert torch.equal(got, slot), (split, position)
            assert tuple(got_native) == tuple(native) and tuple(got_stored) == tuple(stored)
            assert split_set.targets[position] == base[split].targets[source]
    # the training split is written in a fixed shuffled order (chunks mix the classes), evaluation splits in order
    assert chunks["val"].meta["source_index"] == list(range(len(base["val"])))
    assert chunks["train"].meta["source_index"] != list(range(len(base["train"])))
    assert len(chunks["train"].chunk_sizes) >= 3


def test_jpeg_chunks_are_close_to_the_stored_pixels(chunk_sets: dict[str, Path]) -> None:
    raw = _shapes(stream_from=str(chunk_sets["raw"]))._ensure_base()["val"]
    jpeg = _shapes(stream_from=str(chunk_sets["jpeg"]))._ensure_base()["val"]
    diffs = [(raw.stored(i)[0].float() - jpeg.stored(i)[0].float()).abs().mean().item() for i in range(len(raw))]
    assert max(diffs) < 4.0  # q95 on 32 px shapes with noise: a few grey levels on average
    raw_bytes = json.loads((chunk_sets["raw"] / STREAM_FILE).read_text())["splits"]["val"]["bytes"]
    jpeg_bytes = json.loads((chunk_sets["jpeg"] / STREAM_FILE).read_text())["splits"]["val"]["bytes"]
    assert jpeg_bytes < raw_bytes


def test_a_streamed_data_module_gives_the_same_subset_and_batches_shapes(chunk_sets: dict[str, Path]) -> None:
    files = _shapes(few_shot=5, seed=3)
    files.setup("fit")
    streamed = _shapes(few_shot=5, seed=3, stream_from=str(chunk_sets["raw"]))
    streamed.setup("fit")
    assert streamed.train_set is not None and files.train_set is not None
    chosen = {streamed.train_set.base.files[i] for i in streamed.train_set.indices}  # type: ignore[attr-defined]
    assert chosen == {str(i) for i in files.train_set.indices}  # few_shot keeps the same samples (keys: the source index)
    loader = streamed.train_dataloader()
    assert isinstance(loader.sampler, ChunkShuffleSampler)
    images, labels = next(iter(loader))
    ref_images, ref_labels = next(iter(files.train_dataloader()))
    assert images.shape == ref_images.shape and images.dtype == ref_images.dtype and labels.shape == ref_labels.shape
    val_images, _ = next(iter(streamed.val_dataloader()))
    assert val_images.shape[1:] == (3, 32, 32)


def test_device_path_and_views_read_chunks(chunk_sets: dict[str, Path]) -> None:
    dm = _shapes(stream_from=str(chunk_sets["jpeg"]), augment_on="device")
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) >= {"images", "index", "epoch", "params"} and batch["images"].dtype == torch.uint8
    images, labels = dm.on_after_batch_transfer(batch, 0)
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.float32 and labels.shape == (8,)
    # chunks written for a resize-first pipeline do not serve RandomResizedCrop views (they need the aspect-kept layout)
    with pytest.raises(StreamError, match="written for a pipeline that resizes first"):
        _shapes(stream_from=str(chunk_sets["jpeg"]), augment_on="device", train_views=SupConViews(n_views=2)).setup("fit")


def test_distributed_shares_are_contiguous_parts_of_one_order(chunk_sets: dict[str, Path]) -> None:
    dm = _shapes(stream_from=str(chunk_sets["raw"]), seed=1)
    dm.setup("fit")
    ds = dm.train_set
    one = list(ChunkShuffleSampler(ds, seed=1))
    for world in (2, 3):
        shares = [list(DistributedChunkShuffleSampler(ds, world, r, seed=1, drop_last=True)) for r in range(world)]
        assert len({len(s) for s in shares}) == 1
        assert [p for share in shares for p in share] == one[: len(shares[0]) * world]


@pytest.mark.parametrize("augment_on", ["loader", "device"])
def test_ddp_evaluation_shares_are_blocks_of_chunks(chunk_sets: dict[str, Path], augment_on: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DDP each process evaluates its own chunks (was: every process read every chunk), every sample once."""
    files = _shapes(augment_on=augment_on)
    files.setup("fit")
    dm = _shapes(stream_from=str(chunk_sets["raw"]), augment_on=augment_on, eval_batch_size=4)
    dm.setup("fit")
    base = dm.val_set.base  # type: ignore[union-attr]
    assert isinstance(base, ChunkSplit) and len(base.chunk_sizes) >= 3
    bounds = np.cumsum(base.chunk_sizes)
    chunks, seen, labels = [], [], []
    for rank in (0, 1):
        monkeypatch.setattr(dm, "_distributed", lambda rank=rank: (2, rank))
        loader = dm.val_dataloader()
        positions = [i for b in loader.sampler for i in b]  # type: ignore[union-attr]
        chunks.append({int(np.searchsorted(bounds, i, side="right")) for i in positions})
        seen += positions
        for batch in loader:
            labels.append(batch["label"] if isinstance(batch, dict) else batch[1])
    assert sorted(seen) == list(range(len(base)))
    assert len(chunks[0] & chunks[1]) <= 1, chunks  # at most the chunk where the blocks meet
    assert len(chunks[0]) + len(chunks[1]) <= len(base.chunk_sizes) + 1
    # the same samples as the files' strided shares: the labels' counts (the metrics' sums) agree
    ref = [b["label"] if isinstance(b, dict) else b[1] for r in (0, 1) for b in _with_rank(files, r, monkeypatch)]
    assert torch.bincount(torch.cat(labels), minlength=4).tolist() == torch.bincount(torch.cat(ref), minlength=4).tolist()
    assert _with_rank(files, 0, monkeypatch).sampler.batches[0][:2] == [0, 2]  # type: ignore[union-attr]  # files: strided


def _with_rank(dm: Any, rank: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(dm, "_distributed", lambda: (2, rank))
    return dm.val_dataloader()


def test_rerun_keeps_finished_splits_and_refuses_other_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "set"
    optimize_data(_shapes(), str(out), image_format="png", workers=1, chunk_bytes="16KB", splits=["val"])
    assert not (out / "train").exists()
    record = optimize_data(_shapes(), str(out), image_format="png", workers=1, chunk_bytes="16KB")
    assert "val: kept" in capsys.readouterr().out
    assert set(record["splits"]) == {"train", "val", "test"}
    # a chunk file lost: the rerun rewrites that split
    victim = next((out / "test").glob("chunk-*.bin"))
    victim.unlink()
    with pytest.raises(StreamError, match="missing"):
        _shapes(stream_from=str(out)).setup("fit")
    optimize_data(_shapes(), str(out), image_format="png", workers=1, chunk_bytes="16KB")
    assert victim.exists()
    with pytest.raises(StreamError, match="give another --out, or --overwrite"):
        optimize_data(_shapes(data_seed=1), str(out), image_format="png", workers=1)


def test_a_partial_or_damaged_chunk_set_says_how_to_repair_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "set"
    optimize_data(_shapes(), str(out), image_format="raw", workers=1, chunk_bytes="16KB", splits=["train", "test"])
    # a split not written: the refusal names the command that writes it
    with pytest.raises(StreamError, match=r"has no val split .*--splits \[val\]` \(the splits there are kept\)"):
        _shapes(stream_from=str(out)).setup("test")
    # a damaged set record: refused with the fix (--overwrite), then rewritten with it
    (out / "cloc_stream.json").write_text("{bad")
    with pytest.raises(StreamError, match=f"not valid JSON .*damaged: give --overwrite true to write the chunk set anew at {out}"):
        optimize_data(_shapes(), str(out), image_format="raw", workers=1, chunk_bytes="16KB")
    optimize_data(_shapes(), str(out), image_format="raw", workers=1, chunk_bytes="16KB", overwrite=True)
    # a damaged split record: that split is written again (the others kept)
    (out / "val" / "cloc_split.json").write_text("[1]")
    capsys.readouterr()
    optimize_data(_shapes(), str(out), image_format="raw", workers=1, chunk_bytes="16KB")
    said = capsys.readouterr().out
    assert "train: kept" in said and "test: kept" in said and "val: 20 images" in said, said
    _shapes(stream_from=str(out)).setup("fit")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(out=""), "--out is empty; give a folder"),
        (dict(out="{file}/sub"), r"--out .*/afile/sub: cannot write there \(.*/afile is a file, not a folder\)"),
        (dict(workers=0), "--workers 0: give 1 or more writer processes"),
        (dict(splits=[]), r"--splits \[\]: give one or more of \['train', 'val', 'test'\]"),
        (dict(splits=["trian"]), r"--splits \['trian'\]: give one or more of"),
        (dict(splits=["val", "val"]), "each once"),
    ],
)
def test_data_optimize_refuses_bad_arguments_in_one_line(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    (tmp_path / "afile").write_text("")
    args: dict[str, Any] = {"out": str(tmp_path / "set"), "image_format": "raw", "workers": 1, **kwargs}
    args["out"] = str(args["out"]).format(file=tmp_path / "afile")
    with pytest.raises(DataConfigError, match=message) as caught:
        optimize_data(_shapes(), **args)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "set").exists() and not list(Path.cwd().glob("cloc_stream.json"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(image_size=48), "stores the evaluation splits at image_size=32"),
        (dict(augment="rrc_flip"), "training chunks were written for"),
        (dict(cache="memory"), "two answers"),
        (dict(stream_from=" "), "stream_from is empty"),
        (dict(stream_cache_limit="lots"), "is not a size"),
    ],
)
def test_a_chunk_set_that_does_not_fit_the_config_is_one_line(chunk_sets: dict[str, Path], change: dict[str, Any], message: str) -> None:
    kwargs: dict[str, Any] = {"stream_from": str(chunk_sets["raw"]), **change}
    with pytest.raises(DataConfigError, match=message) as caught:
        _shapes(**kwargs).setup("fit")
    assert "\n" not in str(caught.value)


def test_another_data_module_or_no_chunk_set_is_one_line(chunk_sets: dict[str, Path], tmp_path: Path) -> None:
    from cloc_lightning.data import CIFAR10DataModule

    with pytest.raises(StreamError, match="holds chunks of cloc_lightning.data.synthetic.OrdinalShapesDataModule"):
        CIFAR10DataModule(root=str(tmp_path), stream_from=str(chunk_sets["raw"])).setup("fit")
    with pytest.raises(StreamError, match=r"no chunk set \(cloc_stream.json\) there; .*data optimize"):
        _shapes(stream_from=str(tmp_path / "nothing")).setup("fit")
    damaged = tmp_path / "damaged"
    shutil.copytree(chunk_sets["raw"], damaged)
    chunk = sorted((damaged / "val").glob("chunk-*.bin"))[0]
    with open(chunk, "r+b") as f:
        f.truncate(os.path.getsize(chunk) // 2)
    with pytest.raises(StreamError, match="truncated"):
        _shapes(stream_from=str(damaged)).setup("fit")


@pytest.mark.slow
def test_parallel_writers_write_the_same_chunks_as_one_process(chunk_sets: dict[str, Path], tmp_path: Path) -> None:
    """``--workers 2`` (LitData's spawned writers) and ``--workers 1`` (its writer in this process) give the same items."""
    before = multiprocessing.get_start_method(allow_none=True)
    optimize_data(_shapes(), str(tmp_path / "p"), image_format="raw", workers=2, chunk_bytes="16KB")
    assert multiprocessing.get_start_method(allow_none=True) == before  # LitData's 'spawn' is undone
    one = _shapes(stream_from=str(chunk_sets["raw"]))._ensure_base()
    two = _shapes(stream_from=str(tmp_path / "p"))._ensure_base()
    for split in ("train", "val", "test"):
        assert one[split].targets == two[split].targets
        assert one[split].meta["source_index"] == two[split].meta["source_index"]  # type: ignore[attr-defined]
        for i in range(len(one[split])):
            assert torch.equal(one[split].stored(i)[0], two[split].stored(i)[0]), (split, i)


REPO = Path(__file__).resolve().parents[2]
RELIC_DEMO = [
    "--config",
    str(REPO / "configs/relic/demo.yaml"),
    "--data.train_size",
    "256",
    "--data.val_size",
    "64",
    "--data.test_size",
    "64",
]


@pytest.mark.slow
def test_a_shipped_config_trains_from_a_local_chunk_folder_through_the_cli(tmp_path: Path) -> None:
    """``configs/relic/demo.yaml`` (multi-crop views, EMA, online probe, test after fit): optimize, then fit 2 epochs from the chunks."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cli = [sys.executable, "-m", "cloc_lightning"]
    chunks = tmp_path / "chunks"
    made = subprocess.run(
        [*cli, "data", "optimize", *RELIC_DEMO, "--out", str(chunks), "--workers", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    assert (chunks / "cloc_stream.json").is_file() and (chunks / "train" / "cloc_split.json").is_file()
    fit = subprocess.run(
        [
            *cli,
            "fit",
            *RELIC_DEMO,
            "--data.stream_from",
            str(chunks),
            "--trainer.max_epochs",
            "2",
            "--trainer.logger.init_args.save_dir",
            str(tmp_path / "runs"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    run = tmp_path / "runs" / "relic_demo" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    record = json.loads((run / "data.json").read_text())
    assert [s["kind"] for s in record["stores"]] == ["stream"] * 3
    assert "test/" in fit.stdout + fit.stderr  # test_after_fit ran on the streamed test split
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 2 * (256 // 64)


@pytest.mark.parametrize("change", [dict(num_classes=5), dict(train_size=120), dict(data_seed=4), dict(noise=10.0)])
def test_chunks_of_other_data_settings_are_refused(chunk_sets: dict[str, Path], change: dict[str, Any]) -> None:
    """The data module's own settings (here the synthetic classes, sizes, seed, noise) must be those the chunks were written with."""
    with pytest.raises(StreamError, match="holds other data than this config describes") as caught:
        _shapes(stream_from=str(chunk_sets["raw"]), **change).setup("fit")
    assert next(iter(change)) in str(caught.value).replace("n_classes", "num_classes").replace("sizes", "train_size")


def test_predictions_name_the_original_files_and_a_damaged_chunk_is_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    from cloc_lightning.data import ImageFolderDataModule

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("a", "b"):
            folder = tmp_path / "imgs" / split / c
            folder.mkdir(parents=True)
            for i in range(6):
                Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    kwargs: dict[str, Any] = dict(root=str(tmp_path / "imgs"), image_size=16, batch_size=4, num_workers=0, val_fraction=0.25)
    out = tmp_path / "chunks"
    optimize_data(ImageFolderDataModule(**kwargs), str(out), image_format="png", workers=1, chunk_bytes="2KB")
    test = ImageFolderDataModule(**kwargs, stream_from=str(out))._ensure_base()["test"]
    names = [test.describe(i) for i in range(len(test))]
    assert names == [str(tmp_path / "imgs" / "test" / c / f"{i:03d}.png") for c in ("a", "b") for i in range(6)]
    # a chunk overwritten in place with other bytes of the same size: a rerun writes the split again
    chunk = sorted((out / "test").glob("chunk-*.bin"))[0]
    data = bytearray(chunk.read_bytes())
    data[-40:] = bytes(40)
    chunk.write_bytes(bytes(data))
    capsys.readouterr()
    optimize_data(ImageFolderDataModule(**kwargs), str(out), image_format="png", workers=1, chunk_bytes="2KB")
    said = capsys.readouterr().out
    assert "train: kept" in said and "test: kept" not in said and "test: 12 images" in said
    assert bytes(data) != chunk.read_bytes()
