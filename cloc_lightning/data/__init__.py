"""LightningDataModules shared by all methods, and their transforms."""

from typing import TYPE_CHECKING

from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data.csv_table import CSVDataModule
from cloc_lightning.data.datasets import ImageFileDataset, LabelledDataset, TensorImageDataset, TransformedSubset, file_identity
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.folder import ImageFolderDataModule
from cloc_lightning.data.synthetic import OrdinalShapesDataModule, make_ordinal_shapes
from cloc_lightning.data.tables import hash_split
from cloc_lightning.data.torchvision_sets import CIFAR10DataModule, CIFAR100DataModule, STL10DataModule
from cloc_lightning.data.transforms import MultiCropViews, SupConViews, ViewTransform
from cloc_lightning.data.utkface import DEFAULT_AGE_BINS, UTKFaceDataModule, parse_utkface_name

__all__ = [
    "BaseDataModule",
    "DataConfigError",
    "hash_split",
    "CSVDataModule",
    "ImageFolderDataModule",
    "OrdinalShapesDataModule",
    "make_ordinal_shapes",
    "MultiCropViews",
    "SupConViews",
    "ViewTransform",
    "DEFAULT_AGE_BINS",
    "UTKFaceDataModule",
    "parse_utkface_name",
]
__all__ += ["CIFAR10DataModule", "CIFAR100DataModule", "STL10DataModule"]
# what build_base_sets returns (the data-module contract, docs/extending.md)
__all__ += ["LabelledDataset", "ImageFileDataset", "TensorImageDataset", "TransformedSubset", "file_identity"]

if TYPE_CHECKING:  # mypy checks that every data module provides what a model reads of it
    from cloc_lightning.data_contract import DataContract

    _FULFIL_THE_CONTRACT: tuple[type[DataContract], ...] = (
        BaseDataModule,
        CSVDataModule,
        ImageFolderDataModule,
        OrdinalShapesDataModule,
        UTKFaceDataModule,
        CIFAR10DataModule,
        CIFAR100DataModule,
        STL10DataModule,
    )
