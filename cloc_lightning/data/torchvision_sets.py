"""CIFAR-10, CIFAR-100 and STL-10 in torchvision's on-disk format, on the shared data-module base.

The files are read directly from the layout ``torchvision.datasets`` downloads to
(``<root>/cifar-10-batches-py/``, ``<root>/cifar-100-python/``, ``<root>/stl10_binary/``),
so a folder torchvision (or SupContrast / solo-learn) already downloaded is used as
is.  When the files are absent and ``download=True``, torchvision's downloader
fetches and verifies the archive; without internet access this fails within seconds
(a reachability check with a short timeout comes first) with a
:class:`~cloc_lightning.data.errors.DataConfigError` that names the fixes: put the
files under ``root``, or use :class:`~cloc_lightning.data.ImageFolderDataModule` on a
JPEG copy (e.g. ``../shared/data/cifar10``).

Splits: ``train`` minus a held-out ``val_fraction`` (by a hash of the sample index,
so it is the same on every machine) / ``val`` / the official ``test`` set.  With
``val_fraction=0`` the test set doubles as validation set (what the SupContrast
scripts do).  STL-10 has an ``unlabeled`` split of 100,000 images for
self-supervised training (``train_split``); those samples carry the label ``-1``,
which the online probe, :class:`~cloc_lightning.methods.LinearProbeModule` and the
offline probe skip, and which ``SupConModule(method='supcon')`` treats as "positives
are my own views only".  Modules that need a label for every sample (CE, CLOC) must
not train on it.
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data.datasets import LabelledDataset, TensorImageDataset, TransformedSubset, file_identity
from cloc_lightning.data.errors import DataConfigError, check_val_fraction, config_errors
from cloc_lightning.data.tables import hash_fraction, hash_split
from cloc_lightning.data.transforms import CIFAR_MEAN, CIFAR_STD
from cloc_lightning.validation import check_choice, check_float

__all__ = [
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "STL10DataModule",
    "MemmapImageDataset",
    "ConcatLabelledDataset",
    "download_archive",
]

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
STL10_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
#: what the STL-10 training loader serves: the 5k labelled images, the 100k unlabelled ones, or both
STL10Split = Literal["train", "unlabeled", "train+unlabeled"]
STL10_MEAN = (0.4467, 0.4398, 0.4066)
STL10_STD = (0.2603, 0.2566, 0.2713)
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)


def _reachable(url: str, timeout: float) -> str | None:
    """:func:`cloc_lightning.hub.unreachable_reason`, imported when a download starts (not with the data modules)."""
    from cloc_lightning.hub import unreachable_reason

    return unreachable_reason(url, timeout)


def download_archive(url: str, root: str, filename: str, md5: str | None, what: str, fix: str, timeout: float = 10.0) -> None:
    """Download and extract ``url`` into ``root`` with torchvision's downloader, failing fast when offline.

    A reachability check (``timeout`` s) runs first, and socket operations during the
    download time out after ``6 * timeout`` s instead of hanging.

    Raises:
        DataConfigError: the host is unreachable or the download/extraction failed;
            the message names ``what`` is missing and ``fix``.
    """
    from torchvision.datasets.utils import download_and_extract_archive

    reason = _reachable(url, timeout)
    if reason is None:
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(6 * timeout)
        try:
            download_and_extract_archive(url, root, filename=filename, md5=md5)
            return
        except Exception as e:  # noqa: BLE001 - any network/extraction failure gets the same advice
            reason = f"{type(e).__name__}: {e}"
        finally:
            socket.setdefaulttimeout(previous)
    raise DataConfigError(f"{what} and downloading {url} failed ({reason}). {fix}")


class MemmapImageDataset(LabelledDataset):
    """Images in an STL-10 style binary file (uint8, ``[N, 3, W, H]`` column-major), memory-mapped.

    Nothing is read until an image is requested, so the 2.7 GB unlabeled split costs
    no memory up front.  ``load(i)`` returns a ``uint8`` tensor ``[3, H, W]``.
    """

    def __init__(self, path: str, targets: Sequence[int] | None, size: int = 96) -> None:
        nbytes = os.path.getsize(path)
        per_image = 3 * size * size
        if nbytes % per_image:
            raise DataConfigError(f"{path!r} has {nbytes} bytes, not a multiple of one {size}x{size} RGB image; the file is corrupt")
        self.path = path
        self.size = size
        self.n = nbytes // per_image
        self._images: np.ndarray | None = None
        if targets is None:
            targets = [-1] * self.n
        if len(targets) != self.n:
            raise DataConfigError(f"{path!r} holds {self.n} images but its label file has {len(targets)} labels")
        self.targets = [int(t) for t in targets]

    def _mm(self) -> np.ndarray:
        if self._images is None:  # opened lazily, so that each worker process maps the file itself
            self._images = np.memmap(self.path, dtype=np.uint8, mode="r").reshape(self.n, 3, self.size, self.size)
        return self._images

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_images"] = None
        return state

    def describe(self, index: int) -> str:
        return f"{self.path}[{index}]"

    def store_identity(self) -> str:
        """The file's :func:`~cloc_lightning.data.datasets.file_identity` and the image side."""
        return f"memmap {self.size} {file_identity(self.path)}"

    def load(self, index: int) -> torch.Tensor:
        img = np.ascontiguousarray(self._mm()[index].transpose(0, 2, 1))  # stored column-major: [3, W, H] -> [3, H, W]
        return torch.from_numpy(img)


class ConcatLabelledDataset(LabelledDataset):
    """Several labelled datasets one after the other (e.g. STL-10 ``train+unlabeled``)."""

    def __init__(self, parts: Sequence[LabelledDataset]) -> None:
        self.parts = list(parts)
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        self.targets = [t for p in self.parts for t in p.targets]

    def _locate(self, index: int) -> tuple[LabelledDataset, int]:
        part = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.parts[part], index - int(self.offsets[part])

    def load(self, index: int) -> Any:
        ds, i = self._locate(index)
        return ds.load(i)

    def describe(self, index: int) -> str:
        ds, i = self._locate(index)
        return ds.describe(i)

    def store_identity(self) -> str | None:
        """The parts' identities in order (``None`` when one of them has none)."""
        parts = [p.store_identity() for p in self.parts]
        if any(p is None for p in parts):
            return None
        return "concat [" + "] [".join(str(p) for p in parts) + "]"


class _TorchvisionFilesDataModule(BaseDataModule):
    """Shared logic: root/download/offline errors and the hash-held-out validation split."""

    task = "nominal"
    #: torchvision's dataset class (for its url, archive name and md5)
    tv_name: ClassVar[str] = ""
    folder: ClassVar[str] = ""
    required_files: ClassVar[tuple[str, ...]] = ()
    pretty: ClassVar[str] = ""

    def __init__(
        self, root: str = "data", download: bool = True, val_fraction: float = 0.1, download_timeout: float = 10.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.val_fraction = check_val_fraction(val_fraction)
        with config_errors():
            self.download_timeout = check_float("download_timeout", download_timeout, minimum=0.0, strict_minimum=True, hint="seconds")
        self.root = root
        self.download = download

    # ------------------------------------------------------------ files
    @property
    def data_dir(self) -> Path:
        """``<root>/<torchvision folder>``."""
        return Path(os.path.expanduser(self.root)) / self.folder

    def missing_files(self) -> list[str]:
        """Required files that are not under :attr:`data_dir`."""
        return [f for f in self.required_files if not (self.data_dir / f).is_file()]

    def _fix(self) -> str:
        return (
            f"Put the extracted {self.pretty} files in {str(self.data_dir)!r} (set data.root to the folder holding "
            f"{self.folder}/), set data.download: true where the internet is reachable, or use "
            "ImageFolderDataModule on a JPEG copy (class folders), e.g. --data ImageFolderDataModule "
            "--data.root ../shared/data/cifar10."
        )

    def ensure_files(self) -> None:
        """Download the dataset if files are missing and ``download`` is on; otherwise a clear error."""
        missing = self.missing_files()
        if not missing:
            return
        what = f"{self.pretty} not found: {missing[:3]} missing in {str(self.data_dir)!r}"
        if not self.download:
            raise DataConfigError(f"{what} (data.download is false). {self._fix()}")
        import torchvision.datasets as tvd

        cls = getattr(tvd, self.tv_name)
        os.makedirs(os.path.expanduser(self.root), exist_ok=True)
        download_archive(cls.url, os.path.expanduser(self.root), cls.filename, cls.tgz_md5, what, self._fix(), self.download_timeout)
        still = self.missing_files()
        if still:
            raise DataConfigError(f"after downloading, {still[:3]} are still missing in {str(self.data_dir)!r}. {self._fix()}")

    def prepare_data(self) -> None:
        """Download once per node (Lightning calls this on local rank 0 before ``setup``)."""
        self.ensure_files()

    # ------------------------------------------------------------ splits
    def split_train_val(self, train: LabelledDataset, test: LabelledDataset) -> dict[str, LabelledDataset]:
        """Hold out ``val_fraction`` of the labelled training samples (hash of the index); 0 = test as val."""
        if self.val_fraction == 0:
            return {"train": train, "val": test, "test": test}
        labelled = [i for i, t in enumerate(train.targets) if t >= 0]
        split = hash_split([str(i) for i in labelled], (1 - self.val_fraction, self.val_fraction), salt="val")
        val_idx = {i for i, s in zip(labelled, split, strict=True) if s == 1}
        train_idx = [i for i in range(len(train)) if i not in val_idx]
        return {"train": TransformedSubset(train, train_idx), "val": TransformedSubset(train, sorted(val_idx)), "test": test}


def _unpickle(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            entry: dict[str, Any] = pickle.load(f, encoding="latin1")
            return entry
    except Exception as e:
        raise DataConfigError(f"cannot read {str(path)!r} as a CIFAR python batch ({type(e).__name__}: {e}); re-download it") from e


def _cifar_batches(folder: Path, names: Sequence[str], label_key: str) -> TensorImageDataset:
    images: list[np.ndarray] = []
    labels: list[int] = []
    for name in names:
        entry = _unpickle(folder / name)
        if "data" not in entry or label_key not in entry:
            raise DataConfigError(f"{str(folder / name)!r} lacks the 'data'/{label_key!r} entries of a CIFAR batch")
        data = np.asarray(entry["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DataConfigError(f"{str(folder / name)!r}: expected data of shape [N, 3072], got {data.shape}")
        images.append(data.reshape(-1, 3, 32, 32))
        labels.extend(int(v) for v in entry[label_key])
    return TensorImageDataset(torch.from_numpy(np.concatenate(images)), labels)


class CIFAR10DataModule(_TorchvisionFilesDataModule):
    """CIFAR-10 (Krizhevsky 2009): 50,000 training and 10,000 test images, 32x32, 10 classes.

    Reads ``<root>/cifar-10-batches-py/`` (torchvision's layout: ``data_batch_1..5``,
    ``test_batch``, ``batches.meta``); downloads it when absent and ``download``.

    Args:
        root: the folder holding (or receiving) ``cifar-10-batches-py/``.
        download: download the archive (163 MB) when the files are missing.
        val_fraction: share of the training set held out for validation (hash of the
            index); 0 validates on the test set (as SupContrast's scripts).
        download_timeout: seconds for the reachability check (and 6x for socket reads).
        **kwargs: :class:`~cloc_lightning.data.base.BaseDataModule` arguments
            (``batch_size``, ``train_views``, ``few_shot``, ``augment``, ``rrc_scale``, ...).
            Normalisation defaults to CIFAR-10's mean/std; image size 32.

    Example::

        dm = CIFAR10DataModule("data", batch_size=256, train_views=SupConViews(2))
    """

    tv_name = "CIFAR10"
    folder = "cifar-10-batches-py"
    required_files = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")
    pretty = "CIFAR-10"
    default_mean = CIFAR_MEAN
    default_std = CIFAR_STD
    train_files: ClassVar[tuple[str, ...]] = tuple(f"data_batch_{i}" for i in range(1, 6))
    test_files: ClassVar[tuple[str, ...]] = ("test_batch",)
    meta_file: ClassVar[str] = "batches.meta"
    meta_key: ClassVar[str] = "label_names"
    label_key: ClassVar[str] = "labels"
    default_classes: ClassVar[list[str]] = CIFAR10_CLASSES

    def __init__(
        self, root: str = "data", download: bool = True, val_fraction: float = 0.1, download_timeout: float = 10.0, **kwargs: Any
    ) -> None:
        super().__init__(root=root, download=download, val_fraction=val_fraction, download_timeout=download_timeout, **kwargs)

    def discover_class_names(self) -> list[str]:
        meta = self.data_dir / self.meta_file
        if meta.is_file():
            names = _unpickle(meta).get(self.meta_key)
            if names:
                return [str(n) for n in names]
        if self.default_classes:
            return list(self.default_classes)
        raise DataConfigError(f"{str(meta)!r} is missing; it names the classes. {self._fix()}")

    def build_base_sets(self) -> dict[str, LabelledDataset]:
        self.ensure_files()
        self.class_names = self.discover_class_names()
        train = _cifar_batches(self.data_dir, self.train_files, self.label_key)
        test = _cifar_batches(self.data_dir, self.test_files, self.label_key)
        return self.split_train_val(train, test)


class CIFAR100DataModule(CIFAR10DataModule):
    """CIFAR-100 (fine labels): 50,000 training and 10,000 test images, 32x32, 100 classes.

    Reads ``<root>/cifar-100-python/`` (``train``, ``test``, ``meta``); arguments as
    :class:`CIFAR10DataModule`.
    """

    tv_name = "CIFAR100"
    folder = "cifar-100-python"
    required_files = ("train", "test")
    pretty = "CIFAR-100"
    default_mean = CIFAR100_MEAN
    default_std = CIFAR100_STD
    train_files = ("train",)
    test_files = ("test",)
    meta_file = "meta"
    meta_key = "fine_label_names"
    label_key = "fine_labels"
    default_classes: ClassVar[list[str]] = []


class STL10DataModule(_TorchvisionFilesDataModule):
    """STL-10 (Coates et al. 2011): 5,000 labelled training, 8,000 test and 100,000 unlabeled images, 96x96.

    Reads ``<root>/stl10_binary/`` (``train_X.bin``, ``train_y.bin``, ``test_X.bin``,
    ``test_y.bin``, ``unlabeled_X.bin``, ``class_names.txt``), memory-mapped.

    Args:
        root: the folder holding (or receiving) ``stl10_binary/``.
        train_split: what the training loader serves: ``train`` (5k labelled),
            ``unlabeled`` (100k, label ``-1``) or ``train+unlabeled`` (105k; the usual
            self-supervised set).  Unlabelled samples are skipped by every probe and
            by ``few_shot`` / ``class_fraction``; ``train_fraction`` subsamples them too.
            The held-out validation images always come from the labelled ``train`` split.
        download: download the archive (2.6 GB) when the files are missing.
        val_fraction: share of the labelled training images held out for validation;
            0 validates on the test set.
        download_timeout: seconds for the reachability check.
        **kwargs: :class:`~cloc_lightning.data.base.BaseDataModule` arguments; image size
            defaults to 96.

    Example::

        dm = STL10DataModule("data", train_split="train+unlabeled", train_views=SupConViews(2), batch_size=256)
        model = SupConModule(method="simclr", num_classes=10)   # the online probe uses the labelled images
    """

    tv_name = "STL10"
    folder = "stl10_binary"
    pretty = "STL-10"
    default_mean = STL10_MEAN
    default_std = STL10_STD

    def __init__(
        self,
        root: str = "data",
        train_split: STL10Split = "train",
        download: bool = True,
        val_fraction: float = 0.1,
        download_timeout: float = 10.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("image_size", 96)
        super().__init__(root=root, download=download, val_fraction=val_fraction, download_timeout=download_timeout, **kwargs)
        with config_errors():
            self.train_split: STL10Split = check_choice("train_split", train_split, STL10Split)

    @property
    def required_files(self) -> tuple[str, ...]:  # type: ignore[override]
        files = ("train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin")
        return files + (("unlabeled_X.bin",) if "unlabeled" in self.train_split else ())

    def discover_class_names(self) -> list[str]:
        path = self.data_dir / "class_names.txt"
        if path.is_file():
            names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
            if names:
                return names
        return list(STL10_CLASSES)

    def _labelled(self, x_file: str, y_file: str) -> MemmapImageDataset:
        labels = np.fromfile(str(self.data_dir / y_file), dtype=np.uint8).astype(np.int64) - 1  # 1-based on disk
        return MemmapImageDataset(str(self.data_dir / x_file), labels.tolist())

    def build_base_sets(self) -> dict[str, LabelledDataset]:
        self.ensure_files()
        self.class_names = self.discover_class_names()
        labelled = self._labelled("train_X.bin", "train_y.bin")
        test = self._labelled("test_X.bin", "test_y.bin")
        sets = self.split_train_val(labelled, test)
        if "unlabeled" in self.train_split:
            unlabeled = MemmapImageDataset(str(self.data_dir / "unlabeled_X.bin"), None)
            sets["train"] = unlabeled if self.train_split == "unlabeled" else ConcatLabelledDataset([sets["train"], unlabeled])
        return sets

    def _ensure_base(self) -> dict[str, LabelledDataset]:
        # as the base, but label -1 (unlabelled) is valid in the training split
        if self._base is None:
            base = self.build_base_sets()
            n = len(self.class_names)
            for split, ds in base.items():
                low = -1 if split == "train" else 0
                bad = sorted({t for t in ds.targets if not low <= t < n})
                if bad:
                    raise DataConfigError(f"{split} labels of {str(self.data_dir)!r} must lie in [{low}, {n}); found {bad[:5]}")
            self._base = base
        return self._base

    def train_indices(self, targets: Sequence[int], keys: Sequence[str] | None = None) -> list[int]:
        """Few-shot / class-fraction subsampling applies to labelled images; ``train_fraction`` to both kinds."""
        labelled = [i for i, t in enumerate(targets) if t >= 0]
        unlabelled = [i for i, t in enumerate(targets) if t < 0]
        if not unlabelled:
            return super().train_indices(targets, keys)
        kept = [labelled[j] for j in super().train_indices([targets[i] for i in labelled], [str(i) for i in labelled])] if labelled else []
        if self.train_fraction < 1.0:
            unlabelled = [i for i in unlabelled if hash_fraction(str(i), "subsample") < self.train_fraction]
        return sorted(kept + unlabelled)
