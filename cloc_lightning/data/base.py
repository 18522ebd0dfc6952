"""The shared LightningDataModule base: loaders, transforms, subsampling, predict sets.

A data module here builds three *labelled base sets* (train/val/test) that return raw images (PIL or
``uint8`` tensors) and integer labels (the datasets of :mod:`cloc_lightning.data.datasets`); the base class
applies training-set subsampling (few-shot cap, fraction, per-class down-weighting for label-distribution
shift), the transforms (single view, or the multi-view hook ``train_views``) and builds the loaders.

Batches: ``(images [B, 3, H, W], labels [B])`` for single-view sets and
``(list of n_views tensors [B, 3, h_v, w_v], labels [B])`` with ``train_views``.
Validation/test/predict sets are always single-view with the eval transform; an
unlabelled predict set (``predict_root``: a folder of images, or a CSV of paths
without labels) yields image batches ``[B, 3, H, W]`` alone.

Exact resume (:mod:`cloc_lightning.resume`): the training loader is a
:class:`~cloc_lightning.resume.ResumableDataLoader` over an
:class:`~cloc_lightning.resume.EpochShuffleSampler` (order of epoch ``e`` from ``(seed, e)``),
and the training set a :class:`~cloc_lightning.data.datasets.TransformedSubset` with a ``seed`` (augmentation of sample
``i`` in epoch ``e`` from ``(seed, e, i)``), whichever loader worker draws it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from cloc_lightning.data.cache import Cache, OnTheFlyStore, StoredImages, StoreLayout
from cloc_lightning.data.datasets import BadFiles, ImageFileDataset, LabelledDataset, StoredSubset, TransformedSubset
from cloc_lightning.data.device_augment import DeviceAugment, DeviceCollate, ViewSpec, eval_images
from cloc_lightning.data.errors import (
    DataConfigError,
    auto_workers,
    check_base_sets,
    check_triple,
    config_errors,
    is_uint8_batch,
)
from cloc_lightning.data.eval_sharding import exact_eval_loader
from cloc_lightning.data.predict import read_predict_root
from cloc_lightning.data.seeding import DataSeedMixin
from cloc_lightning.data.store_setup import READS as _READS
from cloc_lightning.data.store_setup import StoreMixin
from cloc_lightning.data.stream_setup import StreamMixin
from cloc_lightning.data.streaming import parse_size
from cloc_lightning.data.tables import hash_fraction
from cloc_lightning.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Augment,
    ViewTransform,
    check_rrc_scale,
    eval_transform,
    train_transform,
    train_view_specs,
)
from cloc_lightning.metrics import Task
from cloc_lightning.resume import ResumableDataLoader
from cloc_lightning.validation import check_choice, check_float, check_int

log = logging.getLogger(__name__)

__all__ = ["BaseDataModule"]


#: where the training views are made: per sample in the loader workers (torchvision), or per batch on the device
AugmentOn = Literal["loader", "device"]

#: ``rrc_scale`` default: RandomResizedCrop keeps 50-100 % of the image area
DEFAULT_RRC_SCALE: tuple[float, float] = (0.5, 1.0)


class BaseDataModule(DataSeedMixin, StoreMixin, StreamMixin, L.LightningDataModule):
    """Base of every data module: loaders, transforms, multi-view hook, subsampling.

    Subclasses implement :meth:`build_base_sets`, which sets ``self.class_names`` (one name per class,
    rank 0 first; ``num_classes`` is its length and cannot be set) and returns the three base sets
    (:class:`~cloc_lightning.data.datasets.LabelledDataset` s such as ``ImageFileDataset`` or
    ``TensorImageDataset``, exported by :mod:`cloc_lightning.data`); everything else is shared.

    The training set draws the augmentation of sample ``i`` in epoch ``e`` from
    ``(seed, e, i)`` alone (:class:`TransformedSubset`), so a fit killed and resumed with
    ``--ckpt_path`` is exact with loader workers too.  ``predict`` uses the test split, or
    the images of ``predict_root`` when set (see :meth:`build_predict_set`).

    Args:
        batch_size: training batch size (per process under DDP).
        eval_batch_size: validation/test batch size (default: ``batch_size``).
        num_workers: loader worker processes; ``None`` picks ``min(8, cpus - 1)``.
        pin_memory: pin the batches' host memory so copies to a GPU overlap the step; ``None``
            (default) pins when the trainer runs on a CUDA device.
        cache: decode every image once (:mod:`cloc_lightning.data.cache`): ``none`` (decode in
            the loader every epoch), ``memory`` (a ``uint8`` store in shared memory) or ``disk``
            (a memory-mapped store in ``cache_dir``, reused across runs and shared under DDP).
        cache_dir: the ``disk`` store's folder (default ``$CLOC_CACHE_DIR`` or
            ``~/.cache/cloc_lightning/images``).
        cache_size: side in px of the stored training images when the pipeline starts with a
            RandomResizedCrop (default: the rule in :mod:`cloc_lightning.data.cache`).
        stream_from: train and evaluate from the LitData chunks that ``cloc-lightning data optimize``
            wrote (a folder or an ``s3://`` URL; :mod:`cloc_lightning.data.streaming`) instead of the
            files: the same transforms and views, in chunk order; for data beyond a node's disk.
        stream_cache_dir: where chunks of a remote ``stream_from`` are kept (default
            ``$CLOC_CACHE_DIR/chunks`` or ``~/.cache/cloc_lightning/chunks``).
        stream_cache_limit: at most this much in ``stream_cache_dir`` (e.g. ``50GB``); used chunks are evicted.
        augment_on: ``loader`` (default; torchvision per sample in the loader workers: the
            seed-equivalent path) or ``device``: the loader hands over ``uint8`` images and
            ``on_after_batch_transfer`` makes the views of the whole batch on the training device
            (:mod:`cloc_lightning.data.device_augment`): the same distributions, not the same pixels.
        image_size: side of the square images fed to the model.
        augment: single-view training augmentation (see :func:`train_transform`).
        rrc_scale: ``(min, max)`` area fraction of the RandomResizedCrop of ``augment:
            rrc_flip``, with ``0 < min <= max <= 1`` (default ``(0.5, 1.0)``; SupContrast's
            ``main_ce.py`` / ``main_linear.py`` use ``(0.2, 1.0)``).  Only the single-view
            ``rrc_flip`` pipeline reads it: ``train_views`` carry their own crop scales
            (``SupConViews.scale``, default ``(0.2, 1.0)`` as SupContrast's
            ``main_supcon.py``; ``MultiCropViews.global_scale`` / ``local_scale``).
        train_views: multi-view hook; e.g. ``SupConViews(n_views=2)`` or
            ``MultiCropViews(2, 6)``; ``None`` = single view.
        mean: per-channel normalisation mean (default: the data module's own, ImageNet's here).
        std: per-channel normalisation standard deviation (default as ``mean``).
        few_shot: keep at most this many training images per class (the first ones
            in a fixed hash order, so the subset is the same for every seed).
        train_fraction: keep this fraction of every training class (hash order).
        class_fraction: label-distribution shift: ``{class index: fraction}`` (e.g. ``{3: 0.2}``) keeps only
            that fraction of the listed classes' training images.
        drop_last: drop the last incomplete training batch.
        seed: seed of the training sampler's shuffling and of the training augmentations; ``None``
            (default) follows the run's seed (``--seed_everything``, read from ``PL_GLOBAL_SEED`` at
            setup, rank 0's under DDP; 0 when the run is not seeded).  The seed used is kept in the
            checkpoint, so a resumed fit draws the same order and views; an explicit seed wins.
        bad_files: what file-based sets do with unreadable images (``raise``/``skip``);
            the ``predict_root`` set always raises (a skipped file would shift the rows).
            For :class:`~cloc_lightning.data.CSVDataModule` rows whose image does not exist
            are found at setup: an error under ``raise``, left out of every split (one
            warning with the count) under ``skip``.
        predict_root: what ``predict`` runs on: ``None`` (default) the test split; a folder
            of images (searched recursively, sorted paths, no labels: class sub-folders
            are not needed and give none); or a ``.csv`` file with a ``path`` column
            (relative to the CSV's folder) and an optional ``label`` column (integer
            labels in ``[0, num_classes)`` or names from ``class_names``) giving targets.
    """

    #: the kind of labels (a class attribute; the folder / CSV modules take it as an argument)
    task: Task = "ordinal"
    default_mean: ClassVar[tuple[float, float, float]] = IMAGENET_MEAN
    default_std: ClassVar[tuple[float, float, float]] = IMAGENET_STD

    def __init__(
        self,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        image_size: int = 32,
        augment: Augment = "crop_flip",
        rrc_scale: tuple[float, float] = DEFAULT_RRC_SCALE,
        train_views: ViewTransform | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        few_shot: int | None = None,
        train_fraction: float = 1.0,
        class_fraction: dict[int, float] | None = None,
        drop_last: bool = True,
        seed: int | None = None,
        bad_files: BadFiles = "raise",
        predict_root: str | None = None,
        cache: Cache = "none",
        cache_dir: str | None = None,
        cache_size: int | None = None,
        augment_on: AugmentOn = "loader",
        stream_from: str | None = None,
        stream_cache_dir: str | None = None,
        stream_cache_limit: str = "50GB",
    ) -> None:
        super().__init__()
        with config_errors():
            check_int("batch_size", batch_size, 1, hint="samples per training batch")
            if eval_batch_size is not None:
                check_int("eval_batch_size", eval_batch_size, 1, hint="or null: the training batch_size")
            if num_workers is not None:
                check_int(
                    "num_workers", num_workers, 0, hint="loader worker processes; 0 loads in the main process, null picks min(8, cpus - 1)"
                )
            check_int("image_size", image_size, 1, hint="the side in pixels of the square images the model sees, e.g. 32")
            mean = check_triple("mean", mean, positive=False)
            std = check_triple("std", std, positive=True)
            if few_shot is not None:
                check_int("few_shot", few_shot, 1, hint="images per class, or null: all")
            check_float("train_fraction", train_fraction, minimum=0.0, strict_minimum=True, maximum=1.0)
            for c, f in (class_fraction or {}).items():
                check_float(f"class_fraction[{c}]", f, minimum=0.0, maximum=1.0)
            check_choice("bad_files", bad_files, BadFiles)
            check_choice("cache", cache, Cache, hint="none, memory (shared memory) or disk (memory-mapped, in cache_dir)")
            check_choice("augment_on", augment_on, AugmentOn, hint="loader (torchvision per sample) or device (batched, on the GPU)")
            if seed is not None:
                check_int("seed", seed, 0, hint="or null: the run's seed (--seed_everything)")
            if cache_size is not None:
                check_int(
                    "cache_size", cache_size, 8, hint="px of the stored images' long side, or null: the rule of cloc_lightning.data.cache"
                )
            if stream_from is not None and not str(stream_from).strip():
                raise ValueError("stream_from is empty; give the --out of `cloc-lightning data optimize` (a folder or s3:// URL), or null")
            if stream_from is not None and cache != "none":
                raise ValueError(
                    f"cache={cache} and stream_from are two answers to one question (where the decoded images live); set "
                    "data.cache: none to stream the chunks, or remove data.stream_from to cache the files"
                )
            if stream_cache_dir is not None and not str(stream_cache_dir).strip():
                raise ValueError("stream_cache_dir is empty; give a folder for downloaded chunks, or null for the default")
            self.stream_cache_bytes = parse_size("stream_cache_limit", stream_cache_limit)
        self.stream_from = stream_from
        self.stream_cache_dir = stream_cache_dir
        self.stream_cache_limit = stream_cache_limit
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = auto_workers() if num_workers is None else num_workers
        self.pin_memory = pin_memory
        self.image_size = image_size
        self.augment = augment
        self.rrc_scale = check_rrc_scale(rrc_scale)
        if self.rrc_scale != DEFAULT_RRC_SCALE and (augment != "rrc_flip" or train_views is not None):
            why = (
                "train_views is set and the views use their own crop scale (e.g. SupConViews.scale)"
                if train_views is not None
                else f"augment is {augment!r}; set augment: rrc_flip to use it"
            )
            rank_zero_warn(
                f"data.rrc_scale={list(self.rrc_scale)} has no effect: it is the crop of the single-view augment: rrc_flip, but {why}",
            )
        if cache_size is not None and cache == "none" and augment_on == "loader":
            rank_zero_warn(
                f"data.cache_size={cache_size} has no effect: nothing is stored with data.cache: none and data.augment_on: loader; "
                "set data.cache: memory or disk, or remove data.cache_size"
            )
        self.train_views = train_views
        self.mean = tuple(mean) if mean is not None else self.default_mean
        self.std = tuple(std) if std is not None else self.default_std
        self.few_shot = few_shot
        self.train_fraction = train_fraction
        self.class_fraction = {int(k): float(v) for k, v in (class_fraction or {}).items()}
        self.drop_last = drop_last
        self.seed = seed
        self.bad_files = bad_files
        self.predict_root = predict_root
        self.cache = cache
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.augment_on = augment_on
        self._device_augment: DeviceAugment | None = None
        self._run_seed: int | None = None
        self._store_token: str | None = None
        #: the stores this data module uses (split, kind, key, folder, source), written to the run folder's ``data.json``
        self.store_records: list[dict[str, Any]] = []
        self._stored: dict[str, LabelledDataset] = {}
        self._device_sets: dict[str, StoredSubset] = {}
        self._lazy: set[str] = set()
        self.class_names: list[str] = []
        self._base: dict[str, LabelledDataset] | None = None
        self.train_set: TransformedSubset | None = None
        self.val_set: TransformedSubset | None = None
        self.test_set: TransformedSubset | None = None
        self.predict_set: TransformedSubset | None = None

    # ----------------------------------------------------------------- hooks
    def build_base_sets(self) -> dict[str, LabelledDataset]:
        """Return ``{'train': ..., 'val': ..., 'test': ...}`` base sets (raw images, labels)."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        """Number of classes (ranks for ordinal tasks); fewer than 2 is a :class:`DataConfigError` naming the classes found."""
        if not self.class_names:
            self.class_names = self._stream_class_names() if self.stream_from else self.discover_class_names()
        self._check_class_count()
        return len(self.class_names)

    @num_classes.setter
    def num_classes(self, value: Any) -> None:
        raise DataConfigError(
            f"{type(self).__name__}: num_classes cannot be set (it is len(class_names)); set self.class_names to one name per "
            "class, rank 0 first, in build_base_sets or discover_class_names"
        )

    def class_source(self) -> str:
        """Where the classes were found, for the message of too few classes (e.g. ``" in '<root>/train'"``; default empty)."""
        return ""

    def _check_class_count(self) -> None:
        """At least 2 classes, else a :class:`DataConfigError` (read first: the model's ``num_classes`` comes from here)."""
        n = len(self.class_names)
        if n < 2:
            shown = [str(c) for c in self.class_names[:10]]
            raise DataConfigError(
                f"{type(self).__name__} found {n} class(es) ({shown}){self.class_source()}; at least 2 are "
                "needed: give the data module data with two or more classes"
            )

    def discover_class_names(self) -> list[str]:
        """Class names, computed without building the sets if possible."""
        self._ensure_base()
        return self.class_names

    @property
    def n_views(self) -> int:
        """Number of training views per sample (1 without ``train_views``)."""
        return 1 if self.train_views is None else self.train_views.n_views

    def train_image_transform(self) -> Callable[[Any], Any]:
        """The training transform: the multi-view hook if set, else the single-view augmentation."""
        if self.train_views is not None:
            return self.train_views.build(self.image_size, self.mean, self.std)
        return train_transform(self.image_size, self.mean, self.std, self.augment, rrc_scale=self.rrc_scale)

    def eval_image_transform(self) -> Callable[[Any], Any]:
        """The validation/test transform (resize + normalise)."""
        return eval_transform(self.image_size, self.mean, self.std)

    # ------------------------------------------------------- decode once, augment on the device
    def train_view_specs(self) -> list[ViewSpec]:
        """The training pipeline as device :class:`~cloc_lightning.data.device_augment.ViewSpec` s (``augment_on: device``)."""
        if self.train_views is not None:
            return self.train_views.device_specs(self.image_size)
        return train_view_specs(self.image_size, self.augment, self.rrc_scale)

    def device_augment(self) -> DeviceAugment:
        """The batched training pipeline (built once; ``augment_on: device``)."""
        if self._device_augment is None:
            self._device_augment = DeviceAugment(self.train_view_specs(), self.mean, self.std, seed=self.train_seed)
        return self._device_augment

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """``augment_on: device``: make the training views, or normalise the evaluation images, on the batch's device.

        Training batches arrive as the dicts of :class:`~cloc_lightning.data.datasets.StoredSubset`
        (with their parameters, drawn in the loader); evaluation batches as ``(uint8 images, labels)``.
        Anything else (the loader path) passes through unchanged.
        """
        if self.augment_on != "device":
            return batch
        if isinstance(batch, dict) and "params" in batch:
            views = self.device_augment().apply(batch["images"], batch["params"])
            images: Any = views if self.train_views is not None else views[0]
            return (images, batch["labels"]) if "labels" in batch else images
        if isinstance(batch, (list, tuple)) and batch and is_uint8_batch(batch[0]):
            return (eval_images(batch[0], self.image_size, self.mean, self.std), *batch[1:])
        if is_uint8_batch(batch):
            return eval_images(batch, self.image_size, self.mean, self.std)
        return batch

    def build_predict_set(self) -> LabelledDataset:
        """The images of ``predict_root``: a folder (unlabelled) or a CSV of paths (labelled with a ``label`` column
        read by :func:`~cloc_lightning.data.tables.label_indices`, see :meth:`labels_are_indices`).

        Raises:
            DataConfigError: a missing folder or CSV, no images, no ``path`` column, missing
                files or labels outside the data module's classes; the message names the fix.
        """
        assert self.predict_root is not None, "predict_root is not set"
        return read_predict_root(self.predict_root, self._label_classes)

    def _label_classes(self) -> tuple[list[str], bool]:
        """``(class_names, labels_are_indices)``, the classes discovered first (``num_classes``)."""
        n = self.num_classes
        return list(self.class_names)[:n], self.labels_are_indices()

    def labels_are_indices(self) -> bool:
        """Whether this data module's labels are class indices ``0..C-1`` that ``class_names`` only names (the
        built-in data sets; default) or the class names themselves (class folders, string CSV labels: ``False``).

        How a label text becomes a class (:func:`~cloc_lightning.data.tables.label_indices`): with ``False``
        a predict CSV's label ``2`` names the class ``'2'``, never class index 2.
        """
        return True

    # ------------------------------------------------------------- internals
    def _readable(self, ds: LabelledDataset, split: str) -> list[int] | None:
        """With ``bad_files: skip``, the indices of ``ds`` whose files decode (``None``: keep all).

        An evaluation set must not stand a neighbour in for an unreadable file (a
        duplicated sample in the metrics, a prediction row under the wrong file name),
        so its unreadable files are found once here and left out, with a warning.
        """
        if self.bad_files != "skip" or not isinstance(ds, (ImageFileDataset, StoredImages, OnTheFlyStore)) or len(ds) == 0:
            return None
        bad = ds.unreadable()
        if not bad:
            return None
        names = [ds.describe(i) for i in bad[:5]]
        return self._skip(
            len(ds),
            bad,
            f"left {len(bad)} unreadable image(s) out of the {split} split, whose metrics and "
            f"predictions cover the other {len(ds) - len(bad)}: {names}{' ...' if len(bad) > 5 else ''}",
        )

    @staticmethod
    def _skip(n: int, bad: Sequence[int], what: str) -> list[int]:
        """``bad_files: skip``: warn ``'bad_files: skip: ' + what`` (once, at setup) and return the indices ``0..n-1`` not in ``bad``."""
        rank_zero_warn(f"bad_files: skip: {what}")
        drop = set(bad)
        return [i for i in range(n) if i not in drop]

    def _ensure_base(self) -> dict[str, LabelledDataset]:
        if self._base is None:
            base = check_base_sets(type(self).__name__, self._stream_base_sets() if self.stream_from else self.build_base_sets())
            n_classes = len(self.class_names)
            self._check_class_count()
            for split, ds in base.items():
                bad = [t for t in ds.targets if not 0 <= t < n_classes]
                if bad:
                    raise DataConfigError(
                        f"{split} labels must lie in [0, {n_classes}); found {sorted(set(bad))[:5]}. "
                        "Check the label column/bins or the class list."
                    )
            self._base = base
            self._show_class_order()
        return self._base

    def _show_class_order(self) -> None:
        """Log the rank order of ordinal classes (once, when the sets are built), so the user can check it."""
        if self.task != "ordinal":
            return
        names = [str(n) for n in self.class_names]
        shown = names if len(names) <= 24 else [*names[:12], "...", *names[-4:]]
        rank_zero_info(f"{type(self).__name__}: {len(names)} ordinal classes, rank 0 first: {shown}")

    def train_indices(self, targets: Sequence[int], keys: Sequence[str] | None = None) -> list[int]:
        """Indices of the training samples kept after few-shot / fraction / class-fraction subsampling.

        Order within a class follows a hash of ``keys`` (file names) or of the index.
        """
        if self.few_shot is None and self.train_fraction == 1.0 and not self.class_fraction:
            return list(range(len(targets)))
        names = list(keys) if keys is not None else [str(i) for i in range(len(targets))]
        per_class: dict[int, list[int]] = {}
        for i in sorted(range(len(targets)), key=lambda i: hash_fraction(names[i], "subsample")):
            per_class.setdefault(int(targets[i]), []).append(i)
        keep: list[int] = []
        for c, idx in per_class.items():
            n = len(idx)
            if self.train_fraction < 1.0:
                n = max(1, round(n * self.train_fraction))
            if c in self.class_fraction:
                n = min(n, round(len(idx) * self.class_fraction[c]))
            if self.few_shot is not None:
                n = min(n, self.few_shot)
            keep.extend(idx[:n])
        return sorted(keep)

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict" and self.predict_root is not None:
            if self.predict_set is None:
                self.predict_set = TransformedSubset(self.build_predict_set(), None, self.eval_image_transform())
            return
        self.resolve_seed()
        base = self._ensure_base()
        train = base["train"]
        files = getattr(train, "files", None)
        keys = [os.path.basename(f) for f in files] if files is not None else None
        if self.train_set is None:
            if self.augment_on == "device":
                self.device_augment()  # a pipeline without a device form fails here, before any decoding
            # a split this stage does not read is not decoded ahead (fit: the test split; test: the training split);
            # a later stage that reads it decodes it then (_store_later)
            self._lazy = {split for split in ("train", "val", "test") if split not in _READS.get(stage or "", _READS[""])}
            stored = self._stored = {split: self._store(split, ds, decode=split not in self._lazy) for split, ds in base.items()}
            indices = self.train_indices(train.targets, keys)
            self.train_set = TransformedSubset(stored["train"], indices, self.train_image_transform(), seed=self.train_seed)
            readable = {split: self._readable(stored[split], split) for split in ("val", "test")}
            self.val_set = TransformedSubset(stored["val"], readable["val"], self.eval_image_transform())
            self.test_set = TransformedSubset(stored["test"], readable["test"], self.eval_image_transform())
            if self.augment_on == "device":
                self._device_sets = {
                    "train": StoredSubset(stored["train"], indices, seed=self.train_seed, train=True),
                    "val": StoredSubset(stored["val"], readable["val"], train=False),
                    "test": StoredSubset(stored["test"], readable["test"], train=False),
                }
        else:
            self._store_later(stage, base)
        needed = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"], "predict": ["test"]}.get(
            stage or "fit", ["train", "val", "test"]
        )
        sets = {"train": self.train_set, "val": self.val_set, "test": self.test_set}
        for split in needed:
            if len(sets[split]) == 0:  # type: ignore[arg-type]
                raise DataConfigError(
                    f"the {split} split of {type(self).__name__} is empty; add data or change the split fractions / few_shot"
                )
        if stage == "fit" and self.drop_last and len(self.train_set) < self.batch_size:
            raise DataConfigError(
                f"the training split has {len(self.train_set)} samples, fewer than batch_size={self.batch_size} "
                "with drop_last=true, so no batch would be produced; lower batch_size or set drop_last: false"
            )

    def _loader(self, ds: Dataset[Any], batch_size: int, shuffle: bool, drop_last: bool) -> DataLoader[Any]:
        """Shuffled loaders are a :class:`ResumableDataLoader` over an :class:`EpochShuffleSampler` (exact resume).

        Under DDP the sampler is a :class:`~cloc_lightning.resume.DistributedEpochShuffleSampler`
        (this process's share of the same epoch order), which Lightning keeps as it is.

        Every loader has its own generator (worker seeds) and the training set seeds its
        augmentations per sample (:class:`TransformedSubset`), so iterating data never
        draws from the global RNG (whose state checkpoints restore on resume).
        """
        common: dict[str, Any] = dict(batch_size=batch_size, drop_last=drop_last, **self._worker_kwargs())
        if isinstance(ds, StoredSubset) and ds.train:
            common["collate_fn"] = DeviceCollate(self.device_augment())
        if shuffle:
            # under DDP each process's share of the epoch's order; resumable mid-epoch; in chunk order over a stream.
            # No ``shuffle=`` argument: Lightning sees a RandomSampler (a DistributedSampler under DDP) and keeps it
            return ResumableDataLoader(ds, sampler=self._train_sampler(ds, self._distributed()), **common)
        return DataLoader(ds, shuffle=False, **common)

    def _worker_kwargs(self) -> dict[str, Any]:
        """The ``DataLoader`` options every loader shares (workers, pinning, its own worker-seed generator)."""
        workers = self.num_workers
        return dict(
            num_workers=workers,
            pin_memory=self._pin(),
            persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(self.train_seed),
        )

    def _pin(self) -> bool:
        """``pin_memory``, or (``None``) whether the trainer's device is a CUDA GPU."""
        if self.pin_memory is not None:
            return bool(self.pin_memory)
        trainer = self.trainer
        if trainer is None:
            return False
        try:
            return trainer.strategy.root_device.type == "cuda"
        except (AttributeError, RuntimeError):
            return False

    def _distributed(self) -> tuple[int, int] | None:
        """``(num_replicas, rank)`` when the trainer is distributed and lets the data shard, else ``None``.

        ``Trainer(use_distributed_sampler=False)`` means the user shards: then ``None`` too.
        """
        trainer = self.trainer
        kwargs = trainer.distributed_sampler_kwargs if trainer is not None else None
        if not kwargs or int(kwargs.get("num_replicas", 1)) <= 1:
            return None
        if not getattr(getattr(trainer, "_accelerator_connector", None), "use_distributed_sampler", True):
            return None
        return int(kwargs["num_replicas"]), int(kwargs["rank"])

    def train_dataloader(self) -> DataLoader[Any]:
        assert self.train_set is not None, "call setup('fit') first"
        ds = self._device_sets.get("train", self.train_set)
        return self._loader(ds, self.batch_size, True, self.drop_last)

    def _eval_loader(self, ds: Dataset[Any], split: str) -> DataLoader[Any]:
        """Validation/test loader; under DDP each process's share, every sample evaluated once.

        Lightning's own ``DistributedSampler`` repeats up to ``world_size - 1`` samples so
        that the shares have equal length; :func:`~cloc_lightning.data.eval_sharding.exact_eval_loader`
        shards without repeats (equal numbers of batches, not of samples), so epoch metrics
        under DDP equal those of one process.  Not under ``Trainer(use_distributed_sampler=False)``
        (the user shards), and not where it cannot be done (fewer samples than processes, or
        ``eval_batch_size`` 1 with uneven shares): then Lightning's repeating sampler, with a warning.
        """
        shard = self._distributed()
        if shard is None:
            return self._loader(ds, self.eval_batch_size, False, False)
        replicas, rank = shard
        loader = exact_eval_loader(ds, self.eval_batch_size, replicas, rank, self._eval_order(ds), **self._worker_kwargs())
        if loader is not None:
            return loader
        n = len(ds)  # type: ignore[arg-type]
        fix = (
            f"use at most {n} processes for {split}"
            if n < replicas
            else f"set data.eval_batch_size to 2 or more, or a number of processes that divides {n}"
        )
        rank_zero_warn(
            f"the {split} split ({n} samples) cannot be shared between {replicas} processes with every sample "
            f"evaluated once (eval_batch_size={self.eval_batch_size}); Lightning's DistributedSampler repeats "
            f"{-n % replicas} of them, so the {split} metrics are not exactly the single-process ones: {fix}",
        )
        return self._loader(ds, self.eval_batch_size, False, False)

    def whole_split_dataloader(self, split: Literal["val", "test"]) -> DataLoader[Any]:
        """The whole ``val`` or ``test`` split in order, on every process (not this process's DDP share).

        For code that reads a split outside Lightning's loops on one rank (the plot callbacks).
        """
        ds = {"val": self.val_set, "test": self.test_set}[check_choice("split", split, ("val", "test"))]
        assert ds is not None, "call setup() first"
        return self._loader(ds, self.eval_batch_size, False, False)

    def val_dataloader(self) -> DataLoader[Any]:
        """The validation loader (``augment_on: device``: ``uint8`` batches, normalised in ``on_after_batch_transfer``)."""
        assert self.val_set is not None, "call setup() first"
        return self._eval_loader(self._device_sets.get("val", self.val_set), "val")

    def test_dataloader(self) -> DataLoader[Any]:
        """The test loader (as :meth:`val_dataloader`)."""
        assert self.test_set is not None, "call setup() first"
        return self._eval_loader(self._device_sets.get("test", self.test_set), "test")

    def predict_dataloader(self) -> DataLoader[Any]:
        """The ``predict_root`` images when set, else the test split (in order).

        A plain loader: under DDP Lightning shards it without repeats itself (and tracks the
        indices :class:`~cloc_lightning.callbacks.PredictionWriter` merges the ranks' rows by).
        """
        if self.predict_root is None:
            assert self.test_set is not None, "call setup() first"
            return self._loader(self.test_set, self.eval_batch_size, False, False)
        assert self.predict_set is not None, "call setup('predict') first"
        return self._loader(self.predict_set, self.eval_batch_size, False, False)

    def train_eval_dataloader(self) -> DataLoader[Any]:
        """The (subsampled) training set with the *eval* transform, in order (for feature probes)."""
        base = self._ensure_base()
        assert self.train_set is not None, "call setup() first"
        stored = self._stored.get("train", base["train"])
        if isinstance(stored, StoredImages) and stored.layout != StoreLayout("resize", self.image_size):
            # the training store keeps crops' resolution (fit layout): the eval transform needs the images as an evaluation
            # split stores them, resized once from the originals, so that the pixels equal those without a cache
            if "train_eval" not in self._stored:
                self._stored["train_eval"] = self._store("train_eval", base["train"])
            stored = self._stored["train_eval"]
        ds = TransformedSubset(stored, self.train_set.indices, self.eval_image_transform())
        return self._loader(ds, self.eval_batch_size, False, False)

    def state_dict(self) -> dict[str, Any]:
        return {"class_names": list(self.class_names), "data_seed": self.train_seed}

    def class_mismatch_hint(self) -> str:
        """Added to the fix of a class mismatch with the model or checkpoint ('': none; a second site alone says what to give)."""
        return ""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restore_seed(state_dict.get("data_seed"))
        saved = state_dict.get("class_names")
        if saved and self.class_names and list(saved) != list(self.class_names):
            fix = "(config.yaml in its run folder: the same classes, bins or class order)" + self.class_mismatch_hint()
            raise DataConfigError(
                f"the checkpoint was trained on classes {saved[:10]}..., this data module has {self.class_names[:10]}...; "
                f"resume or evaluate it with the data configuration it was trained with {fix}"
            )
