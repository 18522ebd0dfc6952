"""How a data module stores its splits (a mixin of :class:`~cloc_lightning.data.base.BaseDataModule`).

:meth:`StoreMixin.store_layout` applies the stored-size rule of :mod:`cloc_lightning.data.cache` (with the
``data.cache_size`` checks: a warning below the rule, an error below the largest view) and
:meth:`StoreMixin._store` builds a split's store with the run's processes (:class:`~cloc_lightning.data.stores.StoreGroup`),
keeping a record of each store for the run folder.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_warn

from cloc_lightning.data.cache import OnTheFlyStore, StoreLayout, build_store, fit_store_size, native_sizes
from cloc_lightning.data.datasets import LabelledDataset, StoredSubset, TransformedSubset
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.stores import StoreGroup
from cloc_lightning.data.streaming import ChunkSplit

__all__ = ["StoreMixin", "READS"]

#: the splits each stage reads ('': every split); the others are decoded when a later stage reads them
READS: dict[str, set[str]] = {
    "fit": {"train", "val"},
    "validate": {"val"},
    "test": {"test"},
    "predict": {"test"},
    "": {"train", "val", "test"},
}


class StoreMixin:
    """``store_layout`` and ``_store``: the decode-once part of a data module."""

    image_size: int
    cache: Any
    cache_dir: str | None
    cache_size: int | None
    augment_on: Any
    bad_files: Any
    _store_token: str | None
    store_records: list[dict[str, Any]]
    _lazy: set[str]
    _stored: dict[str, LabelledDataset]
    _device_sets: dict[str, StoredSubset]
    train_set: TransformedSubset | None

    if TYPE_CHECKING:  # defined by the data module and DataSeedMixin

        def train_view_specs(self) -> list[Any]: ...
        def data_source(self) -> str: ...
        def _readable(self, ds: LabelledDataset, split: str) -> list[int] | None: ...
        def train_image_transform(self) -> Any: ...
        def eval_image_transform(self) -> Any: ...
        @property
        def train_seed(self) -> int: ...

    def store_layout(self, split: str, base: LabelledDataset) -> StoreLayout:
        """How ``split``'s images are stored (the rule in :mod:`cloc_lightning.data.cache`).

        Evaluation splits and the resize-first training pipelines: resized to ``image_size``;
        RandomResizedCrop pipelines: the aspect kept, the long side ``cache_size`` or
        :func:`~cloc_lightning.data.cache.fit_store_size` of the views and the originals' sizes.
        """
        if split != "train":
            return StoreLayout("resize", self.image_size)
        specs = self.train_view_specs()
        if all(spec.crop == "rrc" for spec in specs):
            long, aspect = native_sizes(base)
            crops = [(spec.size, spec.scale[0], min(spec.ratio[0], 1 / spec.ratio[1])) for spec in specs]
            rule = fit_store_size(crops, long, aspect)
            if self.cache_size is None:
                return StoreLayout("fit", rule)
            largest = max(spec.size for spec in specs)
            if self.cache_size < largest:
                raise DataConfigError(
                    f"data.cache_size={self.cache_size} is below the largest training view ({largest} px): every crop would be "
                    f"enlarged from fewer pixels than it shows; set data.cache_size to at least {rule} (the stored-size rule) or null"
                )
            if self.cache_size < rule:
                rank_zero_warn(
                    f"data.cache_size={self.cache_size} is below the stored-size rule's {rule} px for these views: the smallest crops "
                    f"come from fewer pixels than they show, so the training views are blurrier than those made from the original "
                    f"files (docs/data.md, the stored size); set data.cache_size: null (or {rule}) to keep them sharp"
                )
            elif long is not None and self.cache_size > max(long, largest):
                rank_zero_warn(
                    f"data.cache_size={self.cache_size} is above the originals' long side ({long} px, the 95th percentile): images are "
                    f"never enlarged, so the store takes {(self.cache_size / long) ** 2:.1f}x the memory of a {long} px store for the same "
                    f"pixels; set data.cache_size: {long} (the originals, bit-identical views) or null (the rule's {rule} px)"
                )
            return StoreLayout("fit", self.cache_size)
        if self.cache_size is not None:
            rank_zero_warn(
                f"data.cache_size={self.cache_size} has no effect: the training pipeline starts with a fixed resize (augment: "
                f"{getattr(self, 'augment', '?')}), so every split is stored at image_size={self.image_size}; remove data.cache_size"
            )
        return StoreLayout("resize", self.image_size)

    def _store(self, split: str, base: LabelledDataset, decode: bool = True) -> LabelledDataset:
        """``base`` decoded once (``cache`` memory/disk), laid out per item (``augment_on: device`` alone), or as it is.

        ``decode=False``: never decoded ahead (the training split of a validate/test/predict run).
        """
        if (self.cache == "none" and self.augment_on == "loader") or (isinstance(base, ChunkSplit) and split != "train_eval"):
            return base  # a chunk split (data.stream_from) is stored already
        # the training split's evaluation copy may be asked for by one process alone (a probe): no collective then
        group = StoreGroup() if split == "train_eval" else StoreGroup.of_trainer(getattr(self, "trainer", None))
        layout, problem = None, None
        if group.rank == 0:  # read the files' sizes once; every process stores with rank 0's layout
            try:
                layout = None if split == "train_eval" else self.store_layout(split, base)
            except DataConfigError as e:
                problem = str(e)
        layout, problem = group.broadcast((layout, problem))
        if problem is not None:
            raise DataConfigError(problem)
        layout = layout or StoreLayout("resize", self.image_size)
        if self.cache == "none" or not decode:
            return OnTheFlyStore(base, layout)
        what, source = f"the {split} split of {type(self).__name__}", self.data_source()
        if self.cache == "memory" and self._store_token is None:  # the run's name for its memory stores, rank 0's on every process
            self._store_token = group.broadcast(uuid.uuid4().hex)
        store = build_store(
            base,
            layout,
            self.cache,
            what,
            bad_files=self.bad_files,
            cache_dir=self.cache_dir,
            progress=self._is_rank_zero(),
            group=group,
            token=self._store_token,
            source=source,
        )
        self.store_records.append(
            {
                "split": split,
                "kind": self.cache,
                "key": store.key,
                "folder": store.folder,
                "layout": layout.describe(),
                "source": source,
            }
        )
        return store

    def _is_rank_zero(self) -> bool:
        trainer = getattr(self, "trainer", None)
        return trainer is None or bool(getattr(trainer, "is_global_zero", True))

    def _store_later(self, stage: str | None, base: dict[str, LabelledDataset]) -> None:
        """Decode the splits that an earlier stage left undecoded and this one reads (test after fit)."""
        later = sorted(self._lazy & READS.get(stage or "", READS[""]))
        if self.cache == "none" or not later:
            return
        self._lazy -= set(later)
        for split in later:
            stored = self._stored[split] = self._store(split, base[split])
            if split == "train":
                assert self.train_set is not None
                self.train_set = TransformedSubset(stored, self.train_set.indices, self.train_image_transform(), seed=self.train_seed)
                subset = StoredSubset(stored, self.train_set.indices, seed=self.train_seed, train=True)
            else:
                readable = self._readable(stored, split)
                setattr(self, f"{split}_set", TransformedSubset(stored, readable, self.eval_image_transform()))
                subset = StoredSubset(stored, readable, train=False)
            if self.augment_on == "device":
                self._device_sets[split] = subset
