"""The datasets the data modules build: raw images with integer labels, and transformed subsets of them.

* :class:`LabelledDataset`: what a *base set* offers (``load``, ``targets``, ``describe``, ``labelled``);
* :class:`TensorImageDataset`: ``uint8`` images held in memory;
* :class:`ImageFileDataset`: image files read with PIL and converted by :func:`to_rgb`, where
  ``bad_files`` decides what an unreadable file does;
* :class:`TransformedSubset`: a base set restricted to some indices, with a transform; with a ``seed``
  (the training set) the augmentation of a sample is a function of ``(seed, epoch, index)`` alone,
  which exact resume with loader workers relies on (:mod:`cloc_lightning.resume`).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from cloc_lightning.data.errors import config_errors
from cloc_lightning.resume import sample_rng
from cloc_lightning.validation import check_choice

__all__ = [
    "LabelledDataset",
    "TensorImageDataset",
    "ImageFileDataset",
    "TransformedSubset",
    "StoredSubset",
    "to_rgb",
    "file_identity",
    "IMAGE_EXTENSIONS",
    "BadFiles",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".gif")
#: what file-based sets do with an unreadable image: stop with its name, or warn and take the next one
BadFiles = Literal["raise", "skip"]


def to_rgb(img: Image.Image) -> Image.Image:
    """``img`` as 8-bit RGB, converted by its real range.

    PIL's own ``convert('RGB')`` clips 16- and 32-bit integer pixels to 255, so a 16-bit
    grayscale PNG (mode ``I;16``) turns almost white.  Here 16-bit modes are divided by 257
    (65535 -> 255); mode ``I`` (PNG's 16-bit grayscale in some Pillow versions, 32-bit TIFFs)
    is 16-bit when the file is a PNG or its values fit in 16 bits, else scaled from its
    32-bit range.  Every other mode goes through ``convert('RGB')``.
    """
    if img.mode.startswith("I;16"):
        depth = 65535.0
    elif img.mode == "I":
        values = np.asarray(img)
        depth = 65535.0 if img.format == "PNG" or int(values.max(initial=0)) <= 65535 else float(2**31 - 1)
    else:
        return img.convert("RGB")
    scaled = np.asarray(img).astype(np.float64) * (255.0 / depth)
    gray = np.clip(np.round(scaled), 0, 255).astype(np.uint8)
    return Image.fromarray(gray).convert("RGB")


class LabelledDataset(Dataset[Any]):
    """A dataset of ``(raw image, int label)`` with a ``targets`` list (base sets).

    ``labelled`` is ``False`` for sets without labels (a ``predict_root`` folder): their
    ``targets`` are ``-1`` and :class:`TransformedSubset` yields the images alone.
    """

    targets: list[int]
    labelled: bool = True

    def load(self, index: int) -> Any:
        """The raw image at ``index`` (PIL image or uint8 tensor [3, H, W])."""
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """A human-readable name of the sample (file path) for error messages."""
        return f"sample {index}"

    def store_identity(self) -> str | None:
        """What this set's pixels depend on, as a string, for the key of a ``data.cache: disk`` store; ``None``: unknown.

        Two sets with the same identity must hold the same pixels: a disk store built from one is
        served for the other.  The built-in sets define it (files: path, size, times and inode;
        arrays in memory: their bytes; subsets: the parent's identity and the indices).  A set of
        one's own that returns ``None`` (the default) cannot be cached on disk: the data module
        stops with a message that names this method (``data.cache: memory`` needs no key).
        """
        return None

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.load(index), self.targets[index]


class TensorImageDataset(LabelledDataset):
    """Images held in memory as a ``uint8`` tensor ``[N, 3, H, W]``."""

    def __init__(self, images: torch.Tensor, targets: Sequence[int]) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"images must be uint8 [N, 3, H, W], got {images.dtype} {tuple(images.shape)}")
        self.images = images
        self.targets = [int(t) for t in targets]

    def load(self, index: int) -> torch.Tensor:
        return self.images[index]

    def store_identity(self) -> str:
        """The images' shape and a SHA-256 of their bytes (computed once)."""
        cached = getattr(self, "_identity", None)
        if cached is None:
            digest = hashlib.sha256(self.images.contiguous().numpy().tobytes()).hexdigest()
            cached = self._identity = f"tensor {tuple(self.images.shape)} sha256 {digest}"
        return cached


def file_identity(path: str) -> str:
    """A file's absolute path, byte size, modification and change times and inode.

    The change time (``ctime``) and the inode move whenever the file is rewritten or replaced, even
    when the copy keeps the size and the modification time (``cp -p``, ``rsync -a``, ``tar x``), and no
    tool can set them back; renaming a folder or ``chmod`` changes them too, which only costs a rebuild.
    """
    st = os.stat(path)
    return f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"


#: what PIL raises for an unreadable or corrupt image file
_UNREADABLE = (OSError, ValueError, SyntaxError)


class ImageFileDataset(LabelledDataset):
    """Image files with labels, read with PIL and converted to RGB.

    ``targets``: one integer label per file, or ``None`` for unlabelled files
    (``labelled`` is then ``False`` and every target ``-1``).
    ``bad_files``: ``'raise'`` (default) stops with the file's name when a file
    cannot be read; ``'skip'`` warns (with a running count) and returns the next
    readable sample instead.  That substitution is for training sets; the data modules
    leave the unreadable files out of evaluation sets before loading them
    (:meth:`unreadable`), so metrics and prediction rows cover exactly the readable files.
    """

    def __init__(self, files: Sequence[str], targets: Sequence[int] | None, bad_files: BadFiles = "raise") -> None:
        if targets is not None and len(files) != len(targets):
            raise ValueError("files and targets differ in length")
        with config_errors():
            check_choice("bad_files", bad_files, BadFiles)
        self.files = list(files)
        self.labelled = targets is not None
        self.targets = [int(t) for t in targets] if targets is not None else [-1] * len(self.files)
        self.bad_files = bad_files
        self.skipped = 0

    def describe(self, index: int) -> str:
        return self.files[index]

    def store_identity(self) -> str:
        """Every file's :func:`file_identity`, in order."""
        h = hashlib.sha256()
        for f in self.files:
            h.update(file_identity(f).encode() + b"\n")
        return f"files {len(self.files)} {h.hexdigest()}"

    def unreadable(self) -> list[int]:
        """The indices whose file PIL cannot decode, in order.

        Decodes every file once (threads: PIL releases the GIL while it decodes).
        """
        from concurrent.futures import ThreadPoolExecutor

        def bad(i: int) -> bool:
            try:
                self.load(i)
            except _UNREADABLE:
                return True
            return False

        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            flags = list(pool.map(bad, range(len(self.files)), chunksize=64))
        return [i for i, f in enumerate(flags) if f]

    def load(self, index: int) -> Image.Image:
        with Image.open(self.files[index]) as img:
            return to_rgb(img)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        n = len(self.files)
        for attempt in range(min(n, 100)):
            i = (index + attempt) % n
            try:
                return self.load(i), self.targets[i]
            except _UNREADABLE as e:
                if self.bad_files == "raise":
                    raise RuntimeError(
                        f"Cannot read image {self.files[i]!r} ({type(e).__name__}: {e}). "
                        "Fix or remove the file, or set data bad_files: skip to skip unreadable files with a warning."
                    ) from e
                self.skipped += 1
                warnings.warn(f"skipping unreadable image {self.files[i]!r} ({self.skipped} skipped so far in this process)", stacklevel=2)
        raise RuntimeError(f"100 consecutive unreadable images starting at {self.files[index]!r}; check the data folder")


def _shared_epoch() -> torch.Tensor:
    """A one-element int64 tensor in shared memory (the epoch that loader workers read)."""
    epoch = torch.zeros(1, dtype=torch.int64)
    epoch.share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    return epoch


class TransformedSubset(LabelledDataset):
    """``base`` restricted to ``indices``, with ``transform`` applied to the images.

    Without a ``transform`` it is itself a base set (a :class:`LabelledDataset`: raw image
    and ``int`` label, e.g. a held-out validation split).  With one, item ``i`` is
    ``(transform(image), label tensor)``, or the transformed image alone when the base set is
    unlabelled.

    With a ``seed`` (the training set) every sample's random transform is a function of
    ``(seed, epoch, base index)`` alone: ``__getitem__`` runs it inside
    :func:`cloc_lightning.resume.sample_rng`, so it does not matter which loader worker draws
    the sample, how many workers there are, or whether the run was resumed from a checkpoint,
    and the calling process's global generator is left as it was (``num_workers: 0``).  The
    epoch lives in a one-element shared-memory tensor, so :meth:`set_epoch` in the main
    process reaches persistent worker processes (fork or spawn) before they load the
    epoch's first sample; :class:`~cloc_lightning.resume.ResumableDataLoader` calls it at the
    start of every pass.  A copy unpickled in another process that sets epochs itself (a
    ``ddp_spawn`` rank) switches to a shared tensor of its own at its first :meth:`set_epoch`,
    before its workers start, so two processes never share one epoch.
    Transforms must draw from torch's generator (every torchvision v2 transform does,
    so do the pipelines of :mod:`cloc_lightning.data.transforms`); Python's ``random`` and
    NumPy's global generator are not seeded per sample.

    Args:
        base: the base set (raw images, labels).
        indices: the base indices kept, in order (``None``: all).
        transform: raw image -> tensor (or list of view tensors); ``None``: raw images.
        seed: per-sample seeding of ``transform`` (see above); ``None`` (evaluation sets)
            draws from the process's global generator as usual.
    """

    def __init__(
        self,
        base: LabelledDataset,
        indices: Sequence[int] | None = None,
        transform: Callable[[Any], Any] | None = None,
        seed: int | None = None,
    ) -> None:
        self.base = base
        self.indices = list(range(len(base))) if indices is None else list(indices)
        self.targets = [base.targets[i] for i in self.indices]
        self.labelled = bool(getattr(base, "labelled", True))
        self.transform = transform
        self.seed = None if seed is None else int(seed)
        self._epoch = _shared_epoch() if seed is not None else None
        self._epoch_owner = os.getpid()

    @property
    def epoch(self) -> int:
        """The epoch whose augmentations ``__getitem__`` draws (0 without a ``seed``)."""
        return int(self._epoch.item()) if self._epoch is not None else 0

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s augmentations from now on, in this process and in its loader workers."""
        if self._epoch is None:
            return
        if self._epoch_owner != os.getpid():  # unpickled from another process that may still use its tensor
            self._epoch = _shared_epoch()
            self._epoch_owner = os.getpid()
        self._epoch.fill_(int(epoch))

    def load(self, index: int) -> Any:
        """The raw image of sample ``index``."""
        return self.base.load(self.indices[index])

    def describe(self, index: int) -> str:
        """The base set's name of sample ``index`` (its file path, or ``sample <base index>`` in memory)."""
        return self.base.describe(self.indices[index])

    def store_identity(self) -> str | None:
        """The parent's identity and the kept indices (``None`` when the parent has none)."""
        parent = self.base.store_identity()
        if parent is None:
            return None
        digest = hashlib.sha256(np.asarray(self.indices, dtype=np.int64).tobytes()).hexdigest()
        return f"subset of [{parent}] indices {len(self.indices)} {digest}"

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Any:
        index = self.indices[i]
        image, label = self.base[index]
        if self.transform is None:
            return image, label
        if self.seed is None:
            out = self.transform(image)
        else:
            with sample_rng(self.seed, self.epoch, index):
                out = self.transform(image)
        if not self.labelled:
            return out
        return out, torch.tensor(label, dtype=torch.long)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a plain pickle / deepcopy copies the epoch tensor out of shared memory: share the copy again so that
        # this copy's own loader workers see its set_epoch (torch.multiprocessing pickling keeps it shared)
        self.__dict__.update(state)
        if self._epoch is not None and not self._epoch.is_shared():  # type: ignore[no-untyped-call]
            self._epoch.share_memory_()  # type: ignore[no-untyped-call]


class StoredSubset(TransformedSubset):
    """A stored split (:class:`~cloc_lightning.data.cache.StoredImages` or ``OnTheFlyStore``) for ``augment_on: device``.

    Training items (``train=True``) are dicts: ``images`` (the ``uint8 [3, S, S]`` slot),
    ``index`` (the base index), ``epoch``, ``native``/``stored`` (the original and stored sizes)
    and ``labels`` (when labelled); :class:`~cloc_lightning.data.device_augment.DeviceCollate`
    adds the batch's random parameters in the loader worker, and the data module's
    ``on_after_batch_transfer`` makes the views on the device.  Evaluation items are
    ``(uint8 image, label)`` (or the image alone when unlabelled): resized already, normalised on
    the device.  ``seed`` and the epoch work as in :class:`TransformedSubset`.
    """

    def __init__(self, base: LabelledDataset, indices: Sequence[int] | None = None, seed: int | None = None, train: bool = True) -> None:
        if not callable(getattr(base, "stored", None)):
            raise TypeError(f"StoredSubset needs a stored base set (with .stored(i)), got {type(base).__name__}")
        super().__init__(base, indices, None, seed)
        self.train = train

    def __getitem__(self, i: int) -> Any:
        index = self.indices[i]
        image, native, stored = self.base.stored(index)  # type: ignore[attr-defined]
        if not self.train:
            if not self.labelled:
                return image
            return image, torch.tensor(self.base.targets[index], dtype=torch.long)
        item = {
            "images": image,
            "index": torch.tensor(index, dtype=torch.int64),
            "epoch": torch.tensor(self.epoch, dtype=torch.int64),
            "native": torch.as_tensor(np.asarray(native), dtype=torch.int32),
            "stored": torch.as_tensor(np.asarray(stored), dtype=torch.int32),
        }
        if self.labelled:
            item["labels"] = torch.tensor(self.base.targets[index], dtype=torch.long)
        return item
