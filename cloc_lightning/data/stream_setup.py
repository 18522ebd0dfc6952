"""How a data module reads ``data.stream_from`` (a mixin of :class:`~cloc_lightning.data.base.BaseDataModule`).

:meth:`StreamMixin._stream_base_sets` opens the chunk set that ``cloc-lightning data optimize`` wrote
(:mod:`cloc_lightning.data.streaming`), checks that it fits this configuration (the data module, the
classes, the evaluation size, the training layout) and returns one
:class:`~cloc_lightning.data.streaming.ChunkSplit` per split in place of the files' base sets;
:meth:`StreamMixin._train_sampler` gives the training loader its chunk-ordered sampler.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from cloc_lightning.data.cache import fit_store_size
from cloc_lightning.data.datasets import LabelledDataset
from cloc_lightning.data.streaming import (
    SPLIT_FILE,
    STREAM_FILE,
    STREAM_FORMAT,
    ChunkShuffleSampler,
    ChunkSplit,
    DistributedChunkShuffleSampler,
    StreamError,
    chunk_of_positions,
    is_remote,
    join_url,
    missing_chunks,
    read_json,
)
from cloc_lightning.resume import DistributedEpochShuffleSampler, EpochShuffleSampler

__all__ = ["StreamMixin", "default_chunk_cache", "LOADER_SETTINGS"]

#: the data-module attributes that say how data is loaded and augmented, not what it is (free to differ from the chunks')
LOADER_SETTINGS = frozenset(
    {
        "batch_size",
        "eval_batch_size",
        "num_workers",
        "pin_memory",
        "image_size",
        "augment",
        "rrc_scale",
        "train_views",
        "mean",
        "std",
        "few_shot",
        "train_fraction",
        "class_fraction",
        "drop_last",
        "seed",
        "bad_files",
        "predict_root",
        "cache",
        "cache_dir",
        "cache_size",
        "augment_on",
        "stream_from",
        "stream_cache_dir",
        "stream_cache_limit",
        "stream_cache_bytes",
        "class_names",
        "store_records",
        "train_set",
        "val_set",
        "test_set",
        "predict_set",
        "prepare_data_per_node",
        "allow_zero_length_dataloader_with_multiple_devices",
        "trainer",
        "task",
    }
)

_BUILD = "build it with `cloc-lightning data optimize --config <this config> --out {url}`"
_REWRITE = "write the damaged split again: `cloc-lightning data optimize --config <this config> --out {url}` (complete splits are kept)"


def default_chunk_cache() -> str:
    """Where downloaded chunks are kept by default: ``$CLOC_CACHE_DIR/chunks`` or ``~/.cache/cloc_lightning/chunks``."""
    root = os.environ.get("CLOC_CACHE_DIR")
    return os.path.join(root, "chunks") if root else os.path.expanduser("~/.cache/cloc_lightning/chunks")


class StreamMixin:
    """``data.stream_from``: the splits from LitData chunks, checked against the configuration."""

    stream_from: str | None
    stream_cache_dir: str | None
    stream_cache_bytes: int
    stream_cache_limit: str
    image_size: int
    class_names: list[str]
    store_records: list[dict[str, Any]]
    #: chunks shuffled together in the training order (:func:`~cloc_lightning.data.streaming.chunk_order`):
    #: more mixes more chunks into a batch, and holds more of them in a worker at once
    stream_window: int = 4

    if TYPE_CHECKING:  # defined by the data module

        def train_view_specs(self) -> list[Any]: ...
        @property
        def train_seed(self) -> int: ...

    def data_settings(self) -> dict[str, Any]:
        """What defines this data module's data, as JSON values: the attributes it keeps of its own arguments.

        The plain values (numbers, strings, lists, dicts) in the module's ``__dict__``, except private ones and
        :data:`LOADER_SETTINGS` (how the data is loaded and augmented, which a chunk set does not fix): for the
        built-in modules the root or CSV and their split settings, the classes or bins, the synthetic sizes and seed.
        ``data optimize`` records them; ``stream_from`` refuses chunks written with other values.
        """
        found: dict[str, Any] = {}
        for name, value in vars(self).items():
            if name.startswith("_") or name in LOADER_SETTINGS:
                continue
            if isinstance(value, str) and name.endswith(("root", "csv", "path", "dir")) and not is_remote(value):
                value = os.path.abspath(os.path.expanduser(value))  # a relative and an absolute path to one folder agree
            try:
                found[name] = json.loads(json.dumps(value))
            except (TypeError, ValueError):
                continue  # objects (datasets, transforms, the trainer): not a setting
        return found

    def _check_settings(self, record: dict[str, Any]) -> None:
        """Refuse a chunk set written with other data settings (another root, other sizes, classes or seed)."""
        written = record.get("data_settings")
        if not isinstance(written, dict):
            return
        mine = self.data_settings()
        differ = [k for k in sorted(set(written) | set(mine)) if written.get(k, "(unset)") != mine.get(k, "(unset)")]
        if differ:
            shown = "; ".join(f"{k}: written {written.get(k, '(unset)')!r}, this config {mine.get(k, '(unset)')!r}" for k in differ[:5])
            raise StreamError(
                f"data.stream_from {self.stream_from} holds other data than this config describes ({shown}); set data.<setting> "
                f"as written, or point data.stream_from at chunks written with this config ({_BUILD.format(url='<a new folder>')})"
            )

    def _stream_record(self) -> dict[str, Any]:
        assert self.stream_from is not None
        url = self.stream_from
        fix = f"data.stream_from must name the --out of `cloc-lightning data optimize`; {_BUILD.format(url=url)}"
        record = read_json(join_url(url, STREAM_FILE), f"chunk set ({STREAM_FILE})", fix)
        if int(record.get("format_version", 0)) != STREAM_FORMAT:
            raise StreamError(
                f"{url}: written by another version of cloc-lightning (chunk-set format {record.get('format_version')}, this one "
                f"reads {STREAM_FORMAT}); {_BUILD.format(url=url)}"
            )
        return record

    def _stream_class_names(self) -> list[str]:
        """The classes the chunk set was written with (no file of the original data is read)."""
        return [str(c) for c in self._stream_record().get("class_names", [])]

    def _stream_base_sets(self) -> dict[str, LabelledDataset]:
        """One :class:`ChunkSplit` per split of ``stream_from``, after the checks that it fits this configuration."""
        assert self.stream_from is not None
        url = self.stream_from
        record = self._stream_record()
        mine = f"{type(self).__module__}.{type(self).__qualname__}"
        if record.get("data_module") != mine:
            raise StreamError(
                f"data.stream_from {url} holds chunks of {record.get('data_module')} ({record.get('source')}), this config's data "
                f"module is {mine}; point it at chunks written with this config, or {_BUILD.format(url='<a new folder>')}"
            )
        if int(record.get("image_size", -1)) != int(self.image_size):
            raise StreamError(
                f"data.stream_from {url} stores the evaluation splits at image_size={record.get('image_size')}, this config has "
                f"data.image_size={self.image_size}; set data.image_size: {record.get('image_size')}, or write chunks at this size "
                f"({_BUILD.format(url='<a new folder>')})"
            )
        self._check_settings(record)
        self.class_names = [str(c) for c in record.get("class_names", [])]
        sets: dict[str, ChunkSplit] = {}
        cache = None if not is_remote(url) else (self.stream_cache_dir or default_chunk_cache())
        for split in ("train", "val", "test"):
            if split not in (record.get("splits") or {}):  # every stage sets up all three (fit's probes, test's train layout)
                raise StreamError(
                    f"data.stream_from {url} has no {split} split (it has {sorted(record.get('splits') or {})}), and a data module "
                    f"streams all three: write it with `cloc-lightning data optimize --config <this config> --out {url} --splits "
                    f"[{split}]` (the splits there are kept)"
                )
            meta = read_json(join_url(url, split, SPLIT_FILE), f"{split} split record ({SPLIT_FILE})", _BUILD.format(url=url))
            problem = missing_chunks(join_url(url, split), meta.get("chunks", []))
            if problem is not None:  # nothing trains on part of the data without saying so
                raise StreamError(f"data.stream_from {join_url(url, split)}: {problem}; {_REWRITE.format(url=url)}")
            sets[split] = ChunkSplit(join_url(url, split), meta, cache_dir=cache, cache_limit=self.stream_cache_bytes)
            self.store_records.append(
                {
                    "split": split,
                    "kind": "stream",
                    "key": meta.get("identity"),
                    "folder": join_url(url, split),
                    "source": record.get("source"),
                }
            )
        # LitData bounds each split's reader on its own: the limit is shared out in proportion to the splits' bytes
        total = sum(int(d.meta.get("bytes") or 0) for d in sets.values()) or 1
        for split, d in sets.items():
            d.cache_limit = max(1, self.stream_cache_bytes * int(d.meta.get("bytes") or 0) // total)
            d.open()
            largest = max((int(c.get("chunk_bytes", 0)) for c in d.meta.get("chunks") or []), default=0)
            if cache and d.cache_limit < 2 * largest:
                rank_zero_warn(
                    f"data.stream_cache_limit={self.stream_cache_limit} leaves the {split} split {d.cache_limit:,} bytes of cache, "
                    f"less than two of its chunks ({largest:,} bytes each): chunks are evicted while loader workers read them "
                    "and downloaded again; raise data.stream_cache_limit"
                )
        self._check_train_layout(sets["train"], record)
        where = f"cache {cache}, at most {self.stream_cache_bytes / 1e9:.1f} GB" if cache else "local"
        rank_zero_info(
            f"data.stream_from {url}: {', '.join(f'{s} {len(d)}' for s, d in sets.items())} images ({record.get('image_format')}; {where})"
        )
        return dict(sets)

    def _check_train_layout(self, train: ChunkSplit, record: dict[str, Any]) -> None:
        """The training chunks must hold what this config's views need: the same layout kind, enough pixels for the crops."""
        specs = self.train_view_specs()
        wants_fit = all(spec.crop == "rrc" for spec in specs)
        mode, size = train.layout.mode, train.layout.size
        if wants_fit != (mode == "fit"):
            raise StreamError(
                f"data.stream_from {self.stream_from}: the training chunks were written for "
                f"{'RandomResizedCrop views (aspect kept)' if mode == 'fit' else 'a pipeline that resizes first'}, this config's "
                f"training pipeline {'crops' if wants_fit else 'resizes first'}; {_BUILD.format(url='<a new folder>')}"
            )
        largest = max(spec.size for spec in specs)
        if size < largest:
            raise StreamError(
                f"data.stream_from {self.stream_from}: the training chunks store {size} px images, below this config's largest view "
                f"({largest} px); {_BUILD.format(url='<a new folder>')}"
            )
        if wants_fit:
            crops = [(spec.size, spec.scale[0], min(spec.ratio[0], 1 / spec.ratio[1])) for spec in specs]
            rule = fit_store_size(crops, record.get("native_long_side"), float(record.get("native_aspect") or 1.0))
            if size < rule:
                rank_zero_warn(
                    f"data.stream_from {self.stream_from}: the training chunks store {size} px images, below the stored-size rule's "
                    f"{rule} px for this config's views, so the smallest crops are blurrier than from the original files; write the "
                    f"chunks with this config ({_BUILD.format(url='<a new folder>')})"
                )

    def _eval_order(self, ds: Any) -> list[int] | None:
        """The positions of an evaluation set by chunk, for DDP shares by blocks of chunks (``None``: strided shares).

        A set over a :class:`ChunkSplit` is shared in contiguous parts of this order
        (:func:`~cloc_lightning.data.eval_sharding.exact_eval_batches`), so each process reads its own chunks.
        """
        if not isinstance(getattr(ds, "base", ds), ChunkSplit):
            return None
        return [int(i) for i in np.argsort(chunk_of_positions(ds), kind="stable")]

    def _train_sampler(self, ds: Any, shard: tuple[int, int] | None) -> Any:
        """The training sampler: chunk order over a stream, else the data module's shuffling samplers (both resumable)."""
        chunked = isinstance(getattr(ds, "base", ds), ChunkSplit)
        if shard is not None:
            if chunked:
                return DistributedChunkShuffleSampler(ds, shard[0], shard[1], seed=self.train_seed, window=self.stream_window)
            return DistributedEpochShuffleSampler(ds, shard[0], shard[1], seed=self.train_seed)
        if chunked:
            return ChunkShuffleSampler(ds, self.train_seed, window=self.stream_window)
        return EpochShuffleSampler(ds, self.train_seed)
