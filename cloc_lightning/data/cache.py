"""Decode once: every image of a split decoded, resized and stored as ``uint8`` a single time.

``data.cache``: ``none`` (decode in the loader, every epoch), ``memory`` (one ``uint8`` tensor in
shared memory, which loader workers read without a copy) or ``disk`` (a memory-mapped file in
``data.cache_dir``, keyed by the data and the stored size, reused by later runs and shared by
the processes of a DDP run).  FFCV's fixed-size raw-pixel fields (``ffcv/fields/rgb_image.py``)
are the model; the store here is a plain ``[N, 3, S, S]`` array any process can map.

**The stored layout** (:class:`StoreLayout`), the rule that decides how big the stored images are:

* ``resize``: the pipeline starts with a deterministic resize to ``size`` x ``size`` (evaluation,
  and the single-view ``none``/``flip``/``crop_flip`` training pipelines): the image is stored
  after exactly that resize (torchvision's antialiased resize of the decoded ``uint8`` image), so
  the loader path's pixels are the same as without a cache.
* ``fit``: the pipeline starts with a RandomResizedCrop: the image keeps its aspect, its long side
  becomes ``S`` (never enlarged), and it sits in the top-left corner of an ``S`` x ``S`` slot; its
  original and stored sizes are kept, so crops are drawn in the original's pixels.  ``S`` is the
  smallest side at which the smallest crop still has the output's resolution:
  ``S = max over views of ceil(size_v / sqrt(min_scale_v * min_aspect_v * a))``, with ``min_aspect``
  the narrowest crop aspect (3/4 for the default ratio) and ``a`` the images' short/long side (5th
  percentile of a sample of the files' headers; 1 for square data): 64 px views with ``scale`` 0.2 of
  square faces store 166 px; 32 px CIFAR its own 32 px.  Capped at the originals' long side (95th
  percentile of the same sample) and overridden by ``data.cache_size``.  The rest of a slot repeats
  the image's last column and row, so crops at the edge never read padding.  A smaller store changes
  the data: a 72 px store of 200 px faces gave crops with 11 % less gradient energy
  (``shared/notes/device-augmentation.md``).

``bad_files`` applies while the store is built: ``raise`` stops at the first unreadable file
with its name; ``skip`` records it, warns once with the count, and the training set stands the
next readable image in for it (as without a cache); evaluation sets leave it out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import socket
import time
import uuid
import warnings
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from PIL import Image

from cloc_lightning.data.datasets import _UNREADABLE, ImageFileDataset, LabelledDataset, TensorImageDataset
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.stores import (
    _HELD,
    USERS,
    StoreGroup,
    default_cache_dir,
    hold,
    locked,
    partial_name,
    release,
    remove_dead_partials,
    shm_root,
    stores_summary,
    sweep_unused,
)

__all__ = [
    "Cache",
    "StoreLayout",
    "StoredImages",
    "OnTheFlyStore",
    "store_image",
    "slot_of",
    "build_store",
    "store_key",
    "fit_store_size",
    "native_sizes",
]

#: where decoded images live: decoded in the loader every time, in shared memory, or in a memory-mapped file
Cache = Literal["none", "memory", "disk"]

_FORMAT = 2  # bump when the stored bytes change meaning (2: slots repeat the image's edges)


@dataclass(frozen=True)
class StoreLayout:
    """How an image is stored: ``resize`` to ``size`` x ``size``, or ``fit`` (aspect kept, long side ``size``, top-left in the slot)."""

    mode: Literal["resize", "fit"]
    size: int

    def describe(self) -> str:
        return f"{self.size}x{self.size} px ({'resized' if self.mode == 'resize' else 'aspect kept, long side'})"


def fit_store_size(crops: Sequence[tuple[int, float, float]], native_long_side: int | None, aspect: float = 1.0) -> int:
    """``S``, the long side that gives every crop at least its output's resolution.

    ``crops``: ``(output size, min area fraction, min crop aspect)`` per view, the aspect being
    ``min(ratio[0], 1 / ratio[1])`` (3/4 for torchvision's default ratio).  An image of short/long
    ``aspect`` stored with long side ``S`` gives its smallest crop a short side of
    ``S * sqrt(min_scale * min_aspect * aspect)``, hence ``S = ceil(size / sqrt(min_scale * min_aspect * aspect))``,
    capped at ``native_long_side`` (never enlarged) and never below the output size.
    """
    need = max(max(size, math.ceil(size / math.sqrt(scale * ratio * aspect) - 1e-9)) for size, scale, ratio in crops)
    if native_long_side is not None:
        need = min(need, max(native_long_side, max(size for size, _, _ in crops)))
    return int(need)


def _as_uint8(image: Any) -> torch.Tensor:
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
            raise ValueError(f"stored images are uint8 [3, H, W]; got {image.dtype} {tuple(image.shape)}")
        return image
    if isinstance(image, Image.Image):
        arr = np.asarray(image.convert("RGB") if image.mode != "RGB" else image)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()
    raise TypeError(f"cannot store an image of type {type(image).__name__}")


def store_image(image: Any, layout: StoreLayout) -> tuple[torch.Tensor, tuple[int, int], tuple[int, int]]:
    """``(uint8 [3, S, S] slot, original (h, w), stored (h, w))`` of one decoded image."""
    from torchvision.transforms.v2 import functional as TF

    x = _as_uint8(image)
    H, W = int(x.shape[1]), int(x.shape[2])
    S = layout.size
    if layout.mode == "resize":
        if (H, W) != (S, S):
            x = TF.resize(x, [S, S], antialias=True)
        return x, (H, W), (S, S)
    long = max(H, W)
    if long > S:
        h, w = max(1, round(H * S / long)), max(1, round(W * S / long))
        x = TF.resize(x, [h, w], antialias=True)
    else:
        h, w = H, W
    return slot_of(x, layout), (H, W), (h, w)


def slot_of(x: torch.Tensor, layout: StoreLayout) -> torch.Tensor:
    """The ``uint8 [3, S, S]`` slot of a stored image ``x [3, h, w]`` (``h, w <= S``): ``x`` itself when it fills it."""
    S = layout.size
    h, w = int(x.shape[1]), int(x.shape[2])
    if (h, w) == (S, S):
        return x
    # the rest of the slot repeats the last column and row: a crop's bilinear samples half a pixel past the
    # image's edge read the edge (as a resize of the crop does), never black padding
    slot = torch.empty(3, S, S, dtype=torch.uint8)
    slot[:, :h, :w] = x
    slot[:, :h, w:] = x[:, :, w - 1 : w]
    slot[:, h:, :] = slot[:, h - 1 : h, :]
    return slot


class StoredImages(LabelledDataset):
    """A split's images decoded once: ``images [N, 3, S, S]`` uint8 (shared memory or a memory map) and their sizes.

    ``load(i)`` returns the stored image (its valid part, for the loader path's transforms);
    :meth:`stored` the whole slot with the sizes (the device path).  Unreadable files (``ok``
    false, ``bad_files: skip``) are replaced by the next readable one, with a warning.
    """

    def __init__(
        self,
        base: LabelledDataset,
        layout: StoreLayout,
        images: torch.Tensor | None,
        native: np.ndarray,
        stored: np.ndarray,
        ok: np.ndarray,
        path: str | None = None,
    ) -> None:
        self.base = base
        self.layout = layout
        self.targets = list(base.targets)
        self.labelled = bool(getattr(base, "labelled", True))
        self._images = images
        self.path = path
        self.native = native
        self.stored_hw = stored
        self.ok = ok
        self.skipped = 0
        #: the store's key and folder (``None`` for a store in this process's memory)
        self.key: str | None = None
        self.folder: str | None = None

    @property
    def images(self) -> torch.Tensor:
        if self._images is None:  # a disk store is mapped lazily, by each process itself
            assert self.path is not None
            n, S = len(self.targets), self.layout.size
            arr = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(n, 3, S, S))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # read-only map: torch warns it is not writable
                self._images = torch.from_numpy(arr)
        return self._images

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.path is not None:
            state["_images"] = None
        return state

    def describe(self, index: int) -> str:
        return self.base.describe(index)

    def unreadable(self) -> list[int]:
        """The indices whose file could not be decoded when the store was built."""
        return [int(i) for i in np.nonzero(~self.ok)[0]]

    def _readable(self, index: int) -> int:
        if self.ok[index]:
            return index
        n = len(self.ok)
        for step in range(1, min(n, 100)):
            j = (index + step) % n
            if self.ok[j]:
                self.skipped += 1
                warnings.warn(
                    f"skipping unreadable image {self.describe(index)!r} ({self.skipped} skipped so far in this process)", stacklevel=3
                )
                return j
        raise RuntimeError(f"100 consecutive unreadable images starting at {self.describe(index)!r}; check the data folder")

    def load(self, index: int) -> torch.Tensor:
        i = self._readable(index)
        h, w = (int(v) for v in self.stored_hw[i])
        return self.images[i, :, :h, :w]

    def stored(self, index: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """``(uint8 [3, S, S], original [2], stored [2])`` of sample ``index``."""
        i = self._readable(index)
        return self.images[i], self.native[i], self.stored_hw[i]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        i = self._readable(index)
        return self.load(i), self.targets[i]


class OnTheFlyStore(LabelledDataset):
    """``data.cache: none`` with ``augment_on: device``: each image decoded and laid out in the loader, every time."""

    def __init__(self, base: LabelledDataset, layout: StoreLayout) -> None:
        self.base = base
        self.layout = layout
        self.targets = list(base.targets)
        self.labelled = bool(getattr(base, "labelled", True))

    def describe(self, index: int) -> str:
        return self.base.describe(index)

    def load(self, index: int) -> Any:
        return self.base.load(index)

    def stored(self, index: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        image, _ = self.base[index]  # the base set's bad_files rule (skip: the next readable image)
        slot, native, stored = store_image(image, self.layout)
        return slot, np.asarray(native, dtype=np.int32), np.asarray(stored, dtype=np.int32)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.base[index]

    def unreadable(self) -> list[int]:
        fn = getattr(self.base, "unreadable", None)
        return list(fn()) if fn is not None else []


# ----------------------------------------------------------------------------
# building
# ----------------------------------------------------------------------------
def native_sizes(base: LabelledDataset, sample: int = 256) -> tuple[int | None, float]:
    """``(95th percentile of the long sides, 5th percentile of short/long)`` from up to ``sample`` images' headers.

    ``(None, 1.0)`` when nothing could be read.
    """
    n = len(base)
    if n == 0:
        return None, 1.0
    if isinstance(base, TensorImageDataset):  # one size for all: no image read
        h, w = (int(v) for v in base.images.shape[-2:])
        return max(h, w), min(h, w) / max(h, w)
    picks = sorted({int(i * n / min(n, sample)) for i in range(min(n, sample))})
    sizes: list[tuple[int, int]] = []
    for i in picks:
        try:
            if isinstance(base, ImageFileDataset):
                with Image.open(base.files[i]) as img:
                    sizes.append(img.size)
            else:
                img = base.load(i)
                sizes.append((int(img.shape[-1]), int(img.shape[-2])) if isinstance(img, torch.Tensor) else img.size)
        except _UNREADABLE:
            continue
    if not sizes:
        return None, 1.0
    arr = np.asarray(sizes, dtype=np.float64)
    long, short = arr.max(axis=1), arr.min(axis=1)
    return int(np.percentile(long, 95, method="higher")), float(np.percentile(short / long, 5, method="lower"))


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _free_shared_memory(root: Path | None = None) -> int | None:
    try:
        st = os.statvfs(str(root) if root is not None else "/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _decode_into(
    base: LabelledDataset,
    layout: StoreLayout,
    out: np.ndarray | torch.Tensor,
    native: np.ndarray,
    stored: np.ndarray,
    ok: np.ndarray,
    what: str,
    bad_files: str,
    progress: bool,
) -> None:
    """Decode every image of ``base`` into ``out[i]`` (threads: PIL and torch release the GIL)."""
    from tqdm import tqdm  # type: ignore[import-untyped]  # Lightning's dependency; no stubs installed

    n = len(base)
    target = out if isinstance(out, torch.Tensor) else torch.from_numpy(out)

    def one(i: int) -> tuple[int, BaseException | None]:
        try:
            image = base.load(i)
        except _UNREADABLE as e:
            return i, e
        slot, nat, sto = store_image(image, layout)
        target[i].copy_(slot)
        native[i], stored[i] = nat, sto
        return i, None

    workers = max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)))
    bar = tqdm(total=n, desc=f"decoding {what}", unit="img", disable=not progress, mininterval=1.0)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for i, err in pool.map(one, range(n), chunksize=32):
                bar.update(1)
                if err is None:
                    continue
                if bad_files == "raise":
                    raise DataConfigError(
                        f"cannot read image {base.describe(i)!r} while building the image cache of {what} "
                        f"({type(err).__name__}: {err}); fix or remove the file, or set data.bad_files: skip"
                    ) from err
                ok[i] = False
    finally:
        bar.close()
    bad = int((~ok).sum())
    if bad:
        names = [base.describe(int(i)) for i in np.nonzero(~ok)[0][:5]]
        rank_zero_warn(f"bad_files: skip: {bad} unreadable image(s) in {what} were not cached: {names}{' ...' if bad > 5 else ''}")


def _complete(folder: Path, n: int, size: int) -> bool:
    info = folder / "info.json"
    data = folder / "images.u8"
    if not info.is_file() or not data.is_file():
        return False
    try:
        meta = json.loads(info.read_text())
    except (OSError, ValueError):
        return False
    return bool(meta.get("complete")) and meta.get("n") == n and meta.get("size") == size and data.stat().st_size == n * 3 * size * size


def store_key(base: LabelledDataset, layout: StoreLayout, what: str) -> str:
    """The key of ``base``'s disk store: the format, the layout, the labels and the source's :meth:`~LabelledDataset.store_identity`.

    Raises:
        DataConfigError: ``base`` has no identity (a dataset of one's own that does not define it).
    """
    identity = base.store_identity()
    if identity is None:
        raise DataConfigError(
            f"data.cache: disk: {what} is a {type(base).__name__}, whose pixels a store key cannot describe (its "
            "store_identity() returns None), so a store built from other data could be served for it; use data.cache: "
            "memory, or define store_identity() on the dataset (cloc_lightning.data.LabelledDataset)"
        )
    h = hashlib.sha256(f"{_FORMAT}\0{layout.mode}\0{layout.size}\0{identity}\0".encode())
    h.update(np.asarray(base.targets, dtype=np.int64).tobytes())
    return h.hexdigest()[:24]


def build_store(
    base: LabelledDataset,
    layout: StoreLayout,
    cache: Cache,
    what: str,
    bad_files: str = "raise",
    cache_dir: str | None = None,
    progress: bool = True,
    group: StoreGroup | None = None,
    token: str | None = None,
    source: str | None = None,
) -> StoredImages:
    """Decode ``base`` once into a :class:`StoredImages` (``cache``: ``memory`` or ``disk``).

    Prints the size before building; stops with a :class:`DataConfigError` naming the fix when
    it does not fit (free shared memory for ``memory``, free disk space for ``disk``).  ``group``:
    the run's processes (:class:`~cloc_lightning.data.stores.StoreGroup`; default this one alone),
    who builds being the rule of :mod:`cloc_lightning.data.stores`; ``token``: the run's name for
    its memory stores (the same on every process of the run); ``source``: what the data is, kept in
    the store's ``info.json``.
    """
    group = group or StoreGroup()
    n, S = len(base), layout.size
    nbytes = n * 3 * S * S
    fix = "set data.cache_size to store smaller images, data.cache: disk (memory-mapped), or data.cache: none"
    if cache == "memory":
        root = shm_root()
        if root is None:  # no /dev/shm (not Linux): one copy per process
            return _process_store(base, layout, what, bad_files, progress, nbytes, fix)
        key = f"{token or uuid.uuid4().hex}-{layout.mode}{S}-{hashlib.sha256(what.encode()).hexdigest()[:8]}"
        folder = root / key
        problem = None
        if group.local_rank == 0:  # one builder per node; the node's other processes map its store
            try:
                sweep_unused(root)
                with locked(root / f"{key}.lock"):
                    if not _complete(folder, n, S):
                        _check_memory(root, what, n, layout, nbytes, group, fix)
                        rank_zero_info(
                            f"data.cache: memory: decoding {what} once per node: {n} images at {layout.describe()}, "
                            f"{_gb(nbytes)} of shared memory ({str(root)!r}), mapped by every process of the node"
                        )
                        _build_folder(base, layout, folder, what, bad_files, progress, source, memory=True)
            except DataConfigError as e:
                problem = str(e)
            finally:
                with contextlib.suppress(OSError):
                    (root / f"{key}.lock").unlink()
        group.agree(problem)
        hold(folder)
        store = _open(base, layout, folder, what, bad_files)
        weakref.finalize(store, release, folder)
        return store
    if cache != "disk":
        raise ValueError(f"build_store: cache must be 'memory' or 'disk', got {cache!r}")
    root = Path(os.path.expanduser(cache_dir or default_cache_dir()))
    key = store_key(base, layout, what)
    folder = root / key

    def ensure() -> str | None:
        try:
            if not _complete(folder, n, S):
                waiting = f"data.cache: disk: another process is building the store of {what} in {str(folder)!r}; waiting for it"
                with locked(root / f"{key}.lock", waiting):
                    if not _complete(folder, n, S):
                        _check_disk(root, what, nbytes, fix, cache_dir)
                        rank_zero_info(
                            f"data.cache: disk: decoding {what} once: {n} images at {layout.describe()}, {_gb(nbytes)} in "
                            f"{str(folder)!r} (the run's other processes wait; later runs reuse it)"
                        )
                        _build_folder(base, layout, folder, what, bad_files, progress, source, memory=False)
        except DataConfigError as e:
            return str(e)
        return None

    # global rank 0 first (a cache_dir shared by the nodes is then complete for all), then the first process of
    # every node that still does not see it (a node-local cache_dir): no flock across machines is relied on
    group.agree(ensure() if group.rank == 0 else None)
    group.agree(ensure() if group.rank != 0 and group.local_rank == 0 else None)
    if not _complete(folder, n, S):
        raise DataConfigError(
            f"data.cache: disk: the store of {what} in {str(folder)!r} is not complete on this process after the first process of "
            "its node built it; data.cache_dir must be one folder that every process of a node sees"
        )
    with contextlib.suppress(OSError):
        (folder / "last_used").touch()
    hold(folder, keep=True)  # `cloc-lightning cache remove` leaves it alone while this process runs
    store = _open(base, layout, folder, what, bad_files)
    weakref.finalize(store, release, folder)
    return store


def _open(base: LabelledDataset, layout: StoreLayout, folder: Path, what: str, bad_files: str) -> StoredImages:
    meta = np.load(folder / "meta.npz")
    ok = meta["ok"]
    if bad_files == "raise" and not ok.all():  # built by a run with bad_files: skip, which left them out
        bad = [base.describe(int(i)) for i in np.nonzero(~ok)[0][:3]]
        raise DataConfigError(
            f"cannot read image {bad[0]!r} (the store of {what} in {str(folder)!r}, built with data.bad_files: skip, "
            f"holds {int((~ok).sum())} unreadable image(s): {bad}); fix or remove the file, or set data.bad_files: skip"
        )
    store = StoredImages(base, layout, None, meta["native"], meta["stored"], ok, path=str(folder / "images.u8"))
    store.key, store.folder = folder.name, str(folder)
    return store


def _check_memory(root: Path, what: str, n: int, layout: StoreLayout, nbytes: int, group: StoreGroup, fix: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    free = _free_shared_memory(root)
    avail = _available_memory()
    known = [v for v in (free, avail) if v is not None]
    if known and nbytes > 0.9 * min(known):
        shared = " (one copy for all the node's processes)" if group.world > 1 else ""
        raise DataConfigError(
            f"data.cache: memory: {what} needs {_gb(nbytes)}{shared} ({n} images at {layout.describe()}), but only "
            f"{_gb(min(known))} of shared memory ({root}) and RAM are free; {fix}"
        )


def _check_disk(root: Path, what: str, nbytes: int, fix: str, cache_dir: str | None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    usage = shutil.disk_usage(root)
    keep = min(1 << 28, int(0.05 * getattr(usage, "total", 0)))  # left free for everything else: 256 MB, or 5 % of a small disk
    if nbytes > usage.free - keep:
        there = stores_summary(cache_dir)
        raise DataConfigError(
            f"data.cache: disk: {what} needs {_gb(nbytes)} in {str(root)!r} (and {_gb(keep)} left free), which has "
            f"{_gb(usage.free)} free; set data.cache_dir to a larger disk, {fix.replace('data.cache: disk (memory-mapped), ', '')}"
            + (f". {there}" if there else "")
        )


def _process_store(
    base: LabelledDataset, layout: StoreLayout, what: str, bad_files: str, progress: bool, nbytes: int, fix: str
) -> StoredImages:
    """A store in this process's own shared memory (where there is no ``/dev/shm`` to share between processes)."""
    n, S = len(base), layout.size
    free = _available_memory()
    if free is not None and nbytes > 0.9 * free:
        raise DataConfigError(
            f"data.cache: memory: {what} needs {_gb(nbytes)} ({n} images at {layout.describe()}), but only {_gb(free)} of RAM is free; {fix}"
        )
    rank_zero_info(f"data.cache: memory: decoding {what} once: {n} images at {layout.describe()}, {_gb(nbytes)} of shared memory")
    images = torch.empty((n, 3, S, S), dtype=torch.uint8)
    if nbytes:
        images.share_memory_()  # type: ignore[no-untyped-call]
    native, stored, ok = np.zeros((n, 2), dtype=np.int32), np.zeros((n, 2), dtype=np.int32), np.ones(n, dtype=bool)
    _decode_into(base, layout, images, native, stored, ok, what, bad_files, progress)
    return StoredImages(base, layout, images, native, stored, ok)


def _build_folder(
    base: LabelledDataset, layout: StoreLayout, folder: Path, what: str, bad_files: str, progress: bool, source: str | None, memory: bool
) -> None:
    """Decode ``base`` into a folder of its own, renamed to ``folder`` when complete (a partial store is never read)."""
    root = folder.parent
    remove_dead_partials(root)  # every key's builds killed on this machine
    n, S = len(base), layout.size
    tmp = root / partial_name(folder.name)
    tmp.mkdir(parents=True)  # raw bytes (not .npy), so that any tool can map them
    if memory:  # the builder maps it first; its lock outlives the rename (same file)
        (tmp / USERS).touch()
        hold(tmp)
    try:
        mm = np.memmap(tmp / "images.u8", dtype=np.uint8, mode="w+", shape=(max(n, 1), 3, S, S))
        native, stored, ok = np.zeros((n, 2), dtype=np.int32), np.zeros((n, 2), dtype=np.int32), np.ones(n, dtype=bool)
        _decode_into(base, layout, mm[:n], native, stored, ok, what, bad_files, progress)
        mm.flush()
        del mm
        if n == 0:
            os.truncate(tmp / "images.u8", 0)
        np.savez(tmp / "meta.npz", native=native, stored=stored, ok=ok)
        info = {
            "format": _FORMAT,
            "what": what,
            "source": source,
            "n": n,
            "size": S,
            "mode": layout.mode,
            "complete": True,
            "unreadable": int((~ok).sum()),
            "built_by": f"{socket.gethostname()}:{os.getpid()}",
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / "info.json").write_text(json.dumps(info, indent=1))
        renamed = True
        try:
            os.rename(tmp, folder)
        except OSError:  # another build of the same key finished first (a shared file system): keep that one
            if not _complete(folder, n, S):
                shutil.rmtree(folder, ignore_errors=True)
                os.rename(tmp, folder)
            else:
                renamed = False
                shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        if memory:
            release(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if memory:
        held = _HELD.pop(str(tmp))
        if renamed:  # the lock taken on the partial folder's file is the store's (the same file)
            _HELD[str(folder)] = held
        else:
            held.close()
            hold(folder)
