"""``cloc-lightning data optimize``: write a data module's splits as LitData chunks for ``data.stream_from``.

Every split (``train``, ``val``, ``test``) is decoded once, laid out as ``data.cache`` stores it (the
training split at the stored-size rule of :mod:`cloc_lightning.data.cache` for the config's views,
the evaluation splits resized to ``image_size``), encoded (``--format``: ``jpeg`` by default, ``webp``,
lossless ``png``, or ``raw`` pixels, bit-identical to a ``data.cache`` store) and written with
``litdata.optimize`` in parallel worker processes, with LitData's progress bar.  The training
split is written in a fixed shuffled order (a hash of the file names, the same for every seed), so
each chunk is a random sample of the classes; the evaluation splits keep their order.

What it was built from is recorded: ``<out>/<split>/cloc_split.json`` (labels, file names, layout,
chunk sizes, the split's identity: the ``data.cache: disk`` key of the same files and layout plus
the format) and ``<out>/cloc_stream.json`` (the data module, its source, classes, format, versions).
A rerun keeps the splits that are complete and built from the same data, and rewrites the others,
so an interrupted run is continued by running the same command again: a split written by LitData's
parallel writers resumes after its last finished chunks (LitData's checkpoints; a remote ``--out`` is
staged in :func:`stage_folder` until uploaded), a small split written in this process starts anew.  An
``--out`` built from other data is refused (give another ``--out``, or ``--overwrite``).
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal
from unittest import mock
from urllib.parse import urlparse

import torch

from cloc_lightning._logging import print_line
from cloc_lightning.data.cache import StoreLayout, native_sizes, store_image, store_key
from cloc_lightning.data.datasets import ImageFileDataset, LabelledDataset
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.streaming import (
    SPLIT_FILE,
    STREAM_FILE,
    STREAM_FORMAT,
    DamagedRecord,
    StreamError,
    _first_line,
    _s3_problem,
    changed_chunks,
    file_md5,
    is_remote,
    join_url,
    missing_chunks,
    parse_size,
    read_json,
    require_litdata,
    s3_etags,
)
from cloc_lightning.data.tables import hash_fraction
from cloc_lightning.validation import write_problem

__all__ = ["ImageFormat", "optimize_data", "ChunkEncoder", "write_json", "stage_folder", "PARTIAL_FILE"]

#: how ``data optimize`` stores an image: ``jpeg`` (default), ``webp``, lossless ``png``, or the ``raw`` uint8 pixels
ImageFormat = Literal["jpeg", "webp", "png", "raw"]
SPLITS = ("train", "val", "test")
#: splits with fewer images are written by one writer in the calling process when ``--workers`` is not given
SMALL_SPLIT = 10_000


class ChunkEncoder:
    """``(position, source index)`` -> the chunk item of one image (runs in LitData's worker processes, pickled).

    The item: ``index`` (its position in the split's chunks), ``label``, the stored size ``h, w``, the
    original size ``nh, nw``, the ``codec`` and the ``image`` bytes.
    """

    def __init__(self, base: LabelledDataset, layout: StoreLayout, image_format: str, quality: int) -> None:
        self.base = base
        self.layout = layout
        self.image_format = image_format
        self.quality = int(quality)

    def encode(self, x: torch.Tensor) -> bytes:
        """The bytes of ``x [3, h, w]`` (uint8) in this encoder's format."""
        if self.image_format == "raw":
            return bytes(x.contiguous().numpy().tobytes())
        from PIL import Image

        buffer = io.BytesIO()
        image = Image.fromarray(x.permute(1, 2, 0).contiguous().numpy())
        if self.image_format == "png":
            image.save(buffer, format="PNG", compress_level=1)
        elif self.image_format == "jpeg":  # no chroma subsampling: small images keep their colour edges
            image.save(buffer, format="JPEG", quality=self.quality, subsampling=0)
        else:
            image.save(buffer, format="WEBP", quality=self.quality)
        return buffer.getvalue()

    def __call__(self, work: Sequence[int]) -> dict[str, Any]:
        position, source = int(work[0]), int(work[1])
        image = self.base.load(source)
        slot, native, stored = store_image(image, self.layout)
        h, w = stored
        return {
            "index": position,
            "label": int(self.base.targets[source]),
            "h": int(h),
            "w": int(w),
            "nh": int(native[0]),
            "nw": int(native[1]),
            "codec": self.image_format,
            "image": self.encode(slot[:, :h, :w]),
        }


def write_json(url: str, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to a local path or an object-storage URL (through LitData's file-system provider)."""
    text = json.dumps(data, indent=1)
    if not is_remote(url):
        path = Path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return
    from litdata.streaming.fs_provider import _get_fs_provider

    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, os.path.basename(url))
        Path(local).write_text(text)
        try:
            _get_fs_provider(url).upload_file(local, url)
        except Exception as e:  # noqa: BLE001 - a denied write, a missing bucket: in words
            raise StreamError(
                f"{url}: cannot write ({_s3_problem(url, e) or f'{type(e).__name__}: {_first_line(e)}'}); check --out"
            ) from None


def _existing(url: str, what: str, damaged_ok: bool) -> dict[str, Any] | None:
    """The record at ``url``, ``None`` when there is none; a damaged one is ``None`` when ``damaged_ok`` (it is rewritten),
    else a one-line refusal naming ``--overwrite``."""
    out = url.rsplit("/", 1)[0]
    fix = f"give --overwrite true to write the chunk set anew at {out}, or another --out"
    try:
        return read_json(url, what, fix)
    except DamagedRecord:
        if damaged_ok:
            return None
        raise
    except StreamError as e:
        if "no " + what + " there" in str(e):
            return None
        raise


def _kept(base: LabelledDataset, split: str, bad_files: str) -> list[int]:
    """The source indices written: all, or (``bad_files: skip``) those that decode, with one line saying how many were left out."""
    if bad_files != "skip" or not isinstance(base, ImageFileDataset):
        return list(range(len(base)))
    bad = set(base.unreadable())
    if bad:
        print_line(None, f"data optimize: bad_files: skip: {len(bad)} unreadable image(s) of the {split} split are not written")
    return [i for i in range(len(base)) if i not in bad]


def optimize_data(
    datamodule: Any,
    out: str,
    *,
    image_format: ImageFormat = "jpeg",
    quality: int = 95,
    workers: int | None = None,
    chunk_bytes: str = "64MB",
    splits: Sequence[str] = SPLITS,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``datamodule``'s splits to ``out`` as LitData chunks; returns the ``cloc_stream.json`` record.

    Args:
        datamodule: a :class:`~cloc_lightning.data.base.BaseDataModule` (not set up; its files are read here).
        out: a local folder or an object-storage URL (``s3://bucket/prefix``; credentials from the environment).
        image_format: ``jpeg``, ``webp``, ``png`` (lossless) or ``raw`` (the stored pixels, bit-identical to ``data.cache``).
        quality: JPEG/WebP quality (1-100).
        workers: LitData writer processes; ``None``: 1 (in this process) for splits under ``SMALL_SPLIT`` images, else the CPUs (at most 8).
        chunk_bytes: the size of a chunk, e.g. ``64MB``.
        splits: the splits to write.
        overwrite: rewrite an ``out`` that was built from other data (otherwise refused).

    Raises:
        StreamError: LitData missing, an ``out`` built from other data, a split LitData did not finish.
    """
    litdata = require_litdata("cloc-lightning data optimize")
    if image_format not in ("jpeg", "webp", "png", "raw"):
        raise DataConfigError(f"--format {image_format!r} is not a format; give jpeg, webp, png or raw")
    if not 1 <= int(quality) <= 100:
        raise DataConfigError(f"--quality {quality} is outside 1-100; give e.g. 95")
    parse_size("--chunk_bytes", chunk_bytes)
    if workers is not None and int(workers) < 1:
        raise DataConfigError(f"--workers {workers}: give 1 or more writer processes, or leave it out (null) for the default")
    if not splits or [s for s in splits if s not in SPLITS] or len(set(splits)) != len(splits):
        raise DataConfigError(f"--splits {list(splits)}: give one or more of {list(SPLITS)}, each once, e.g. [train, val, test]")
    if not str(out).strip():
        raise DataConfigError("--out is empty; give a folder (it is created) or an s3:// URL")
    if getattr(datamodule, "stream_from", None):
        raise DataConfigError("data.stream_from is set in this config: data optimize reads the original files; remove data.stream_from")
    if not is_remote(out):
        out = os.path.abspath(os.path.expanduser(out))
        if os.path.isfile(out):
            raise DataConfigError(f"--out {out} is a file; give a folder (it is created) or an s3:// URL")
        _check_writable(out)
    settings = datamodule.data_settings()  # before the sets are built (which keeps more on the module)
    base = datamodule._ensure_base()
    name = type(datamodule).__name__
    previous = _existing(join_url(out, STREAM_FILE), STREAM_FILE, damaged_ok=overwrite)
    record: dict[str, Any] = {
        "format_version": STREAM_FORMAT,
        "data_module": f"{type(datamodule).__module__}.{type(datamodule).__qualname__}",
        "source": datamodule.data_source(),
        "class_names": [str(c) for c in datamodule.class_names],
        "task": getattr(datamodule, "task", None),
        "image_size": int(datamodule.image_size),
        "data_settings": settings,
        "image_format": image_format,
        "quality": int(quality) if image_format in ("jpeg", "webp") else None,
        "splits": {},
    }
    for split in splits:
        if split not in base:
            raise DataConfigError(f"--splits {split!r}: {name} has the splits {sorted(base)}")
    # each split's layout (reads the originals' sizes) and identity (the files' identity), once
    plans = {split: _identity(datamodule, base[split], split, image_format, int(quality)) for split in splits}
    if previous is not None and not overwrite:
        for split, (_, identity) in plans.items():
            was = (previous.get("splits") or {}).get(split, {})
            if was.get("identity") is not None and was["identity"] != identity:
                raise StreamError(
                    f"{out} holds a {split} split written from other data, layout or format ({previous.get('source')}, "
                    f"{was.get('layout')}, {previous.get('image_format')}, identity {was['identity']}) than this config's "
                    f"({record['source']}, {image_format}, identity {identity}); give another --out, or --overwrite to replace them"
                )
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        for split, (layout, identity) in plans.items():
            record["splits"][split] = _write_split(
                litdata, datamodule, base[split], split, layout, identity, out, image_format, int(quality), workers, chunk_bytes, overwrite
            )
    finally:  # litdata.optimize switches the process to 'spawn'; give the caller its own start method back
        if start_method is not None and multiprocessing.get_start_method(allow_none=True) != start_method:
            multiprocessing.set_start_method(start_method, force=True)
    if previous is not None and not overwrite:
        for split, kept in (previous.get("splits") or {}).items():
            record["splits"].setdefault(split, kept)
    long, aspect = native_sizes(base["train"]) if "train" in base else (None, 1.0)
    record.update(native_long_side=long, native_aspect=aspect, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), versions=_versions())
    write_json(join_url(out, STREAM_FILE), record)
    return record


def _check_writable(out: str) -> None:
    """Create a local ``--out`` (and check it takes a file), else one line naming what is in the way."""
    why = write_problem(out)
    if why is not None:
        raise DataConfigError(
            f"--out {out}: cannot write there ({why if 'not a folder' in why else why.lower()}); give a folder you may write "
            "(it is created) or an s3:// URL"
        )


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("cloc-lightning", "litdata", "torch", "torchvision", "pillow"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def _identity(datamodule: Any, base: LabelledDataset, split: str, image_format: str, quality: int) -> tuple[StoreLayout, str]:
    """A split's layout and identity: the ``data.cache: disk`` key of its files, labels and layout, and the format."""
    layout = datamodule.store_layout(split, base)
    key = store_key(base, layout, f"the {split} split of {type(datamodule).__name__}")
    return layout, f"{key}/{image_format}/{quality if image_format in ('jpeg', 'webp') else '-'}"


def _write_split(
    litdata: Any,
    datamodule: Any,
    base: LabelledDataset,
    split: str,
    layout: StoreLayout,
    identity: str,
    out: str,
    image_format: str,
    quality: int,
    workers: int | None,
    chunk_bytes: str,
    overwrite: bool,
) -> dict[str, Any]:
    """Write one split (or keep it, when a complete copy built from the same data is there); its summary."""
    url = join_url(out, split)
    meta_url = join_url(url, SPLIT_FILE)
    previous = _existing(meta_url, SPLIT_FILE, damaged_ok=True)  # a damaged split record: the split is written again
    summary: dict[str, Any] = {"n": None, "identity": identity, "layout": layout.describe()}
    if (
        previous is not None
        and previous.get("identity") == identity
        and not overwrite
        and not missing_chunks(url, previous.get("chunks", []))
        and not changed_chunks(url, previous.get("chunks", []))
    ):
        print_line(None, f"data optimize: {split}: kept ({previous.get('n')} images, complete, built from the same data)")
        summary["n"], summary["bytes"] = previous.get("n"), previous.get("bytes")
        return summary
    kept = _kept(base, split, datamodule.bad_files)
    if split == "train":  # chunks are random samples of the classes (a fixed order: the same for every seed)
        keys = _keys(base)
        kept = sorted(kept, key=lambda i: hash_fraction(keys[i], "chunks"))
    print_line(None, f"data optimize: {split}: {len(kept)} images at {layout.describe()}, {image_format} -> {url}")
    encoder = ChunkEncoder(base, layout, image_format, quality)
    # lists, not tuples: LitData compares the work with its checkpoint's JSON copy when it resumes
    work = [[p, s] for p, s in enumerate(kept)]
    if workers is None:  # spawned writers start in seconds each: worth it for large splits only (benchmarks/results/streaming.md)
        workers = 1 if len(work) < SMALL_SPLIT else max(1, min(8, os.cpu_count() or 1))
    plan = {"identity": identity, "work": _digest(work), "n": len(work), "chunk_bytes": chunk_bytes, "workers": workers}
    if is_remote(url):  # written here first, then uploaded by this process (errors in words; any http:// endpoint)
        stage = stage_folder(url, identity)  # kept until uploaded: an interrupted run resumes there
        _write_local(litdata, encoder, work, stage, chunk_bytes, workers, plan, split)
        index = read_json(join_url(stage, "index.json"), "LitData index", "run data optimize again")
        _upload(stage, url)
        shutil.rmtree(stage, ignore_errors=True)
        prints = s3_etags(url) if urlparse(url).scheme == "s3" else {}
        fingerprint = {name: {"etag": tag} for name, tag in prints.items()}
    else:
        _write_local(litdata, encoder, work, url, chunk_bytes, workers, plan, split)
        index = read_json(join_url(url, "index.json"), "LitData index", "run data optimize again")
        fingerprint = {str(c["filename"]): {"md5": file_md5(os.path.join(url, str(c["filename"])))} for c in index.get("chunks", [])}
    chunk_sizes = [int(c["chunk_size"]) for c in index.get("chunks", [])]
    if sum(chunk_sizes) != len(kept):
        raise StreamError(f"{url}: LitData wrote {sum(chunk_sizes)} of {len(kept)} images; run data optimize again to rewrite the split")
    chunks = [
        {"filename": str(c["filename"]), "chunk_bytes": int(c["chunk_bytes"]), **fingerprint.get(str(c["filename"]), {})}
        for c in index.get("chunks", [])
    ]
    problem = missing_chunks(url, chunks)  # LitData reports success when a worker's uploads failed: look
    if problem is not None:
        raise StreamError(
            f"{url}: LitData finished, but {problem}: the writes or uploads failed (see LitData's messages above: endpoint, "
            "credentials, disk space); run data optimize again to rewrite the split"
        )
    keys = _keys(base)
    meta = {
        "split": split,
        "n": len(kept),
        "identity": identity,
        "layout": {"mode": layout.mode, "size": layout.size},
        "labelled": bool(getattr(base, "labelled", True)),
        "targets": [int(base.targets[i]) for i in kept],
        "keys": [keys[i] for i in kept],
        "paths": [str(files[i]) for i in kept] if (files := getattr(base, "files", None)) is not None else [],
        "source_index": kept,
        "chunk_sizes": chunk_sizes,
        "chunks": chunks,
        "bytes": int(sum(int(c.get("chunk_bytes", 0)) for c in index.get("chunks", []))),
        "image_format": image_format,
    }
    write_json(meta_url, meta)  # written last: a split with this file is complete
    summary["n"] = len(kept)
    summary["bytes"] = meta["bytes"]
    return summary


def _write_local(
    litdata: Any,
    encoder: ChunkEncoder,
    work: list[list[int]],
    folder: str,
    chunk_bytes: str,
    workers: int,
    plan: dict[str, Any],
    split: str,
) -> None:
    """Chunks of ``work`` in the local ``folder``: in this process (``workers`` 1) or LitData's spawned writers.

    The spawned writers keep LitData's checkpoints (``use_checkpoint``; ``.checkpoints/`` in ``folder``, removed by
    LitData at the end): a run interrupted after some chunks resumes after them when the same ``plan`` (the split's
    identity, its work list, chunk size and writers; :data:`PARTIAL_FILE`) is written again.  Any other plan starts
    anew.  The in-process writer (small splits) always starts anew.
    """
    if workers <= 1:
        _write_here(encoder, work, folder, chunk_bytes)
        return
    marker = Path(folder) / PARTIAL_FILE
    resume = _read_plan(marker) == plan
    if resume and (Path(folder) / "index.json").exists():  # finished before the interruption (the caller checks it)
        marker.unlink()
        return
    if resume:
        print_line(None, f"data optimize: {split}: continuing the interrupted write in {folder} (LitData's checkpoints)")
    else:
        _clear(Path(folder))
        Path(folder).mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(plan))
    # LitData's writers stage in /tmp/chunks by default and every optimize run empties it: one run's folders of its own
    private = tempfile.mkdtemp(prefix="cloc-litdata-")
    try:
        with mock.patch.dict(os.environ, {k: os.path.join(private, k.lower()) for k in _LITDATA_FOLDERS}):
            litdata.optimize(
                fn=encoder,
                inputs=work,
                output_dir=folder,
                chunk_bytes=chunk_bytes,
                num_workers=min(workers, max(1, len(work))),
                mode=None if resume else "overwrite",
                use_checkpoint=True,
                keep_data_ordered=True,
                start_method="spawn",
            )
    finally:
        shutil.rmtree(private, ignore_errors=True)
    marker.unlink(missing_ok=True)


#: the plan of a split being written by LitData's writers, in its folder (or stage) until they finish
PARTIAL_FILE = ".cloc_partial.json"


def _read_plan(marker: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(marker.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _digest(work: list[list[int]]) -> str:
    """A short hash of the work list (positions and source indices): a resumed write must be given the same."""
    return hashlib.sha256(json.dumps(work).encode()).hexdigest()[:16]


def _clear(folder: Path) -> None:
    """Remove what a write of a split leaves in ``folder``: chunks, indexes, LitData's checkpoints, our records."""
    if not folder.exists():
        return
    for old in [*folder.glob("chunk-*.bin"), *folder.glob("*index.json"), folder / SPLIT_FILE, folder / PARTIAL_FILE]:
        old.unlink(missing_ok=True)
    shutil.rmtree(folder / ".checkpoints", ignore_errors=True)


def stage_folder(url: str, identity: str) -> str:
    """Where a split for the remote ``url`` is written before its upload: kept across runs until it is uploaded.

    ``$CLOC_CACHE_DIR/optimize/<hash>`` or ``~/.cache/cloc_lightning/optimize/<hash>`` (the hash of the URL and
    the split's identity), so an interrupted run resumes there; it needs the split's size in free space.
    """
    root = os.environ.get("CLOC_CACHE_DIR") or os.path.expanduser("~/.cache/cloc_lightning")
    return os.path.join(root, "optimize", hashlib.sha256(f"{url}\n{identity}".encode()).hexdigest()[:20])


#: LitData's staging folders (environment variables its writer processes read)
_LITDATA_FOLDERS = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")


def _upload(stage: str, url: str) -> None:
    """Upload the chunk files and index of ``stage`` to ``url`` (8 at a time), else a one-line :class:`StreamError`."""
    from concurrent.futures import ThreadPoolExecutor

    from litdata.streaming.fs_provider import _get_fs_provider

    files = sorted(p for p in Path(stage).iterdir() if p.is_file() and not p.name.startswith("."))
    size = sum(p.stat().st_size for p in files)
    print_line(None, f"data optimize: uploading {len(files)} files ({size / 1e6:.1f} MB) to {url}")
    provider = _get_fs_provider(url)
    chunks = [p for p in files if p.name != "index.json"]
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda p: provider.upload_file(str(p), join_url(url, p.name)), chunks))
        provider.upload_file(str(Path(stage) / "index.json"), join_url(url, "index.json"))  # last: the split is readable
    except Exception as e:  # noqa: BLE001 - boto3/gcs/azure upload errors, in words
        raise StreamError(
            f"{url}: the upload failed ({_s3_problem(url, e) or f'{type(e).__name__}: {_first_line(e)}'}); run data optimize again"
        ) from None


def _write_here(encoder: ChunkEncoder, work: list[list[int]], url: str, chunk_bytes: str) -> None:
    """``--workers 1`` to a local folder: LitData's ``BinaryWriter`` in this process (the chunk files and index of ``optimize``)."""
    from litdata.streaming.writer import BinaryWriter

    folder = Path(url)
    _clear(folder)
    folder.mkdir(parents=True, exist_ok=True)
    writer = BinaryWriter(str(folder), chunk_bytes=chunk_bytes)
    for position, item in enumerate(work):
        writer.add_item(position, encoder(item))
    writer.done()
    writer.merge()


def _keys(base: LabelledDataset) -> list[str]:
    files = getattr(base, "files", None)
    if files is not None:
        return [os.path.basename(str(f)) for f in files]
    return [str(i) for i in range(len(base))]
