"""The data -> model contract (``cloc_lightning.data_contract``): what ``DataInfo`` reads, and its errors."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cloc_lightning.data import OrdinalShapesDataModule, SupConViews
from cloc_lightning.data_contract import DataContractError, DataInfo, datamodule_info
from cloc_lightning.methods import CEModule, SupConModule
from tests.conftest import TINY_BACKBONE, cpu_trainer


def _shapes(**kw: Any) -> OrdinalShapesDataModule:
    args: dict[str, Any] = dict(num_classes=4, train_size=16, val_size=8, test_size=8, batch_size=8, num_workers=0, image_size=16)
    return OrdinalShapesDataModule(**{**args, **kw})


class _PlainData(L.LightningDataModule):
    """A LightningDataModule that is no BaseDataModule: loaders only, none of the contract's fields."""

    def _loader(self) -> DataLoader[Any]:
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.rand(8, 3, 16, 16, generator=g), torch.arange(8) % 3), batch_size=4)

    def train_dataloader(self) -> DataLoader[Any]:
        return self._loader()

    def val_dataloader(self) -> DataLoader[Any]:
        return self._loader()


_trainer = functools.partial(cpu_trainer, max_epochs=1, enable_checkpointing=False)


def test_reads_every_field_of_a_base_data_module() -> None:
    dm = _shapes(train_views=SupConViews(n_views=2), drop_last=False)
    info = DataInfo(dm, owner="CEModule")
    assert (info.name, info.num_classes, info.task) == ("OrdinalShapesDataModule", 4, "ordinal")
    assert info.class_names == ["1 object", "2 objects", "3 objects", "4 objects"]
    assert (info.n_views, info.image_size, info.batch_size, info.drop_last) == (2, 16, 8, False)
    assert isinstance(info.train_views, SupConViews)
    assert info.train_size is None and info.val_fraction is None  # before setup; the shapes hold no share out
    dm.setup("fit")
    assert info.train_size == 16
    assert sum(len(y) for _, y in info.whole_split_dataloader("val")) == 8


def test_optional_fields_are_none_on_an_object_without_them() -> None:
    info = DataInfo(object())
    assert info.class_names is None and info.n_views is None and info.train_views is None and info.image_size is None
    assert info.batch_size is None and info.drop_last is None and info.train_size is None and info.val_fraction is None
    assert not info.provides("num_classes")


def test_a_missing_required_field_names_the_data_module_and_the_fix() -> None:
    with pytest.raises(
        DataContractError,
        match=r"CEModule needs the data module's num_classes \(.*\), but _PlainData has no "
        r"attribute 'num_classes'; give _PlainData a 'num_classes' attribute or property.*"
        r"subclass cloc_lightning.data.BaseDataModule",
    ):
        _ = DataInfo(_PlainData(), owner="CEModule").num_classes
    with pytest.raises(DataContractError, match=r"needs the data module's task .* or give CEModule an explicit task instead of auto"):
        _ = DataInfo(_PlainData(), owner="CEModule").task


def test_invalid_values_are_named() -> None:
    class Odd:
        num_classes = 0
        task = "regression"

    with pytest.raises(DataContractError, match=r"Odd.num_classes must be a positive integer, got 0"):
        _ = DataInfo(Odd()).num_classes
    with pytest.raises(DataContractError, match=r"Odd.task must be one of \['ordinal', 'nominal'\], got 'regression'"):
        _ = DataInfo(Odd()).task
    with pytest.raises(ValueError, match="split must be one of"):
        DataInfo(_shapes()).whole_split_dataloader("train")  # type: ignore[arg-type]


def test_a_failing_property_keeps_its_own_error() -> None:
    """An AttributeError raised inside a data module's property is that property's bug, not a missing field."""

    class Broken:
        @property
        def num_classes(self) -> int:
            return self.missing  # type: ignore[attr-defined, no-any-return]

    with pytest.raises(AttributeError, match="missing"):
        _ = DataInfo(Broken()).num_classes


def test_no_trainer_or_no_data_module_is_none(tmp_path: Path) -> None:
    assert datamodule_info(None) is None
    assert datamodule_info(_trainer(tmp_path)) is None
    model = CEModule(num_classes=4, backbone=TINY_BACKBONE)
    assert model.datamodule_info is None and model.resolved_task() == "ordinal"  # no data module: the documented default


def test_a_model_on_a_data_module_without_the_fields_stops_naming_the_fix(tmp_path: Path) -> None:
    """Before: the class count was not checked and ``task: auto`` silently meant ordinal (the online probe: nominal)."""

    class _CountOnly(_PlainData):
        num_classes = 3

    with pytest.raises(DataContractError, match=r"CEModule needs the data module's num_classes .*_PlainData"):
        _trainer(tmp_path).fit(CEModule(num_classes=3, task="nominal", backbone=TINY_BACKBONE), datamodule=_PlainData())
    with pytest.raises(DataContractError, match=r"CEModule needs the data module's task .*_CountOnly has no attribute 'task'"):
        _trainer(tmp_path).fit(CEModule(num_classes=3, backbone=TINY_BACKBONE), datamodule=_CountOnly())
    _trainer(tmp_path).fit(CEModule(num_classes=3, task="nominal", backbone=TINY_BACKBONE), datamodule=_CountOnly())  # explicit task
    with pytest.raises(DataContractError, match=r"SupConModule needs the data module's num_classes .*_PlainData"):
        _trainer(tmp_path).fit(SupConModule(backbone=TINY_BACKBONE), datamodule=_PlainData())


def test_the_model_accessor_reads_the_attached_data_module(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    class Look(L.Callback):
        def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            assert isinstance(pl_module, CEModule)
            seen.update(info=pl_module.datamodule_info, task=pl_module.resolved_task(), callback=datamodule_info(trainer, "Look"))

    dm = _shapes()
    trainer = cpu_trainer(tmp_path, max_steps=1, limit_val_batches=0, enable_checkpointing=False, callbacks=[Look()])
    trainer.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=dm)
    assert seen["info"].datamodule is dm and seen["info"].owner == "CEModule" and seen["task"] == "ordinal"
    assert seen["callback"].datamodule is dm and seen["callback"].owner == "Look"


def test_check_num_classes_names_both_counts_the_class_names_and_the_fix() -> None:
    """The one "model.num_classes differs from the data" check (the CLI's link, the classifiers' and the online probe's setup)."""
    info = DataInfo(_shapes(), owner="CEModule")
    assert info.check_num_classes(4, fix="give {n}") is None and info.check_num_classes(None, fix="give {n}") is None
    names = (info.class_names or [])[:10]
    shown = f" ({names})" if names else ""
    with pytest.raises(ValueError) as raised:
        info.check_num_classes(5, fix="give the model num_classes {n}, not {given}")
    assert str(raised.value) == f"model.num_classes=5 but OrdinalShapesDataModule has 4 classes{shown}; give the model num_classes 4, not 5"
    with pytest.raises(ValueError) as raised:
        info.check_num_classes(
            8, fix="evaluate it on data with {given} classes", subject="--ckpt_path a.ckpt: the checkpoint was trained with num_classes=8,"
        )
    assert str(raised.value).startswith(
        "--ckpt_path a.ckpt: the checkpoint was trained with num_classes=8, but OrdinalShapesDataModule has 4 classes"
    )
    assert "\n" not in str(raised.value)


def test_the_num_classes_mismatch_is_written_once() -> None:
    """One meaning, one home: only :meth:`DataInfo.check_num_classes` words the "has N classes" mismatch."""
    import re

    from tests.conftest import REPO

    pattern = re.compile(r"has \{[^}]*\} classes")
    homes = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "cloc_lightning").rglob("*.py") if pattern.search(p.read_text()))
    assert homes == ["cloc_lightning/data_contract.py"], homes
