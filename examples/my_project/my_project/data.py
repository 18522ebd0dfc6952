"""A new data module: images in ``<root>/<rank>/*.png``, split into train/val/test by a hash of the file name."""

from pathlib import Path
from typing import Any

from cloc_lightning.data import BaseDataModule, ImageFileDataset, LabelledDataset, hash_split


class RankFolderDataModule(BaseDataModule):
    """One folder per rank (``0``, ``1``, ...), every image in it of that rank.

    Args:
        root: the folder holding the rank folders.
        **kwargs: BaseDataModule's arguments (batch_size, image_size, augment, cache, ...).
    """

    task = "ordinal"

    def __init__(self, root: str = "data/ranks", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root = root

    def build_base_sets(self) -> dict[str, LabelledDataset]:
        folders = sorted((p for p in Path(self.root).iterdir() if p.is_dir()), key=lambda p: int(p.name))
        self.class_names = [p.name for p in folders]  # rank 0 first; num_classes is its length
        files = [str(f) for p in folders for f in sorted(p.glob("*.png"))]
        labels = [rank for rank, p in enumerate(folders) for _ in sorted(p.glob("*.png"))]
        split = hash_split([Path(f).name for f in files], (0.7, 0.15, 0.15))
        return {
            name: ImageFileDataset(
                [f for f, s in zip(files, split, strict=True) if s == i], [y for y, s in zip(labels, split, strict=True) if s == i]
            )
            for i, name in enumerate(("train", "val", "test"))
        }
