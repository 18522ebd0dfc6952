"""The data → model contract: what a model or a callback may ask of the data module it runs with.

Methods (:mod:`cloc_lightning.methods`) and data modules (:mod:`cloc_lightning.data`) never import
each other; both meet here.  :class:`DataContract` names the fields every data module attached to a
model provides (:class:`~cloc_lightning.data.BaseDataModule` and its subclasses do);
:class:`DataInfo` is the one way a model or callback reads the attached data module
(``BaseModule.datamodule_info`` in a model, :func:`datamodule_info` elsewhere): typed values, and
a :class:`DataContractError` naming the fix when a data module lacks a field that is asked for.

The command line takes ``num_classes`` from the same contract: ``cloc-lightning fit`` links the
data module's ``num_classes`` into the model's when the data module is built
(:mod:`cloc_lightning.cli`), so a config names the classes once, on the data module.

Fields (the two required ones are :class:`DataContract`):

* ``num_classes``: number of classes (ranks for ordinal data); classifiers check theirs against it,
  the online probe takes its size from it, the command line links it into the model.
* ``task``: ``'ordinal'`` or ``'nominal'``; what ``task: auto`` of a classifier or of the online
  probe becomes.
* ``class_names`` (optional): class names in label order; error messages and plots.
* ``n_views`` and ``train_views`` (optional): training views per sample and the multi-view
  specification; the view checks of SupCon/SimCLR, RnC and ReLIC.
* ``image_size`` (optional): side of the images the model sees; OrdinalCLIP (CLIP's fixed input size).
* ``mean``, ``std`` (optional): the per-channel input normalisation; the command line warns when it differs
  from what a pretrained backbone's weights were trained with (:mod:`cloc_lightning.nn.pretrained`).
* ``batch_size``, ``drop_last``, ``train_set`` (optional): ReLIC's ``mini_batch_size`` check.
* ``val_fraction`` (optional): held-out share of the training set (0: validation is the test split);
  the end-of-fit summary says so.
* ``whole_split_dataloader(split)`` (optional): every sample of a split on one process; the plots.

``BaseDataModule`` and its subclasses have all of them (``val_fraction`` only the modules that hold
part of the training set out).  Any other ``LightningDataModule`` used with these models needs
``num_classes`` and ``task``; a missing optional field turns the check that reads it off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, get_args

from cloc_lightning.metrics import Task

__all__ = ["DataContract", "DataContractError", "DataInfo", "datamodule_info"]

_SPLITS = ("val", "test")


class DataContractError(ValueError):
    """A data module lacks a field of :class:`DataContract` that a model needs, or gives an invalid value."""


class DataContract(Protocol):
    """The fields every data module attached to a model provides (:class:`~cloc_lightning.data.BaseDataModule` does).

    A structural type: any object with these attributes (or properties) fits; nothing is
    registered or subclassed.  The optional fields a model may also read are listed in the
    module docstring; :class:`DataInfo` reads all of them.
    """

    @property
    def num_classes(self) -> int:
        """Number of classes (ranks for ordinal data); the model's ``num_classes`` must equal it."""
        ...

    @property
    def task(self) -> Task:
        """``'ordinal'`` (ranked classes: MAE, QWK, ...) or ``'nominal'`` (top-1 / top-5)."""
        ...


class DataInfo:
    """The attached data module as a model or callback reads it: one typed view of its :class:`DataContract` fields.

    :attr:`num_classes` and :attr:`task` are required: a data module without them raises
    :class:`DataContractError` naming the fix.  The optional fields are ``None`` when the data
    module does not have them (the checks that read them are then skipped).

    Args:
        datamodule: the data module (any object; a ``LightningDataModule`` in practice).
        owner: who asks (a class name), named in the errors.
    """

    def __init__(self, datamodule: object, owner: str = "the model") -> None:
        self.datamodule = datamodule
        self.owner = owner

    @property
    def name(self) -> str:
        """The data module's class name (for messages)."""
        return type(self.datamodule).__name__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, owner={self.owner})"

    # ------------------------------------------------------------------ required
    def _require(self, field: str, what: str, alternative: str = "") -> Any:
        try:
            return getattr(self.datamodule, field)
        except AttributeError:
            if hasattr(type(self.datamodule), field):
                raise  # a property of the data module failed inside: its own error says why
        raise DataContractError(
            f"{self.owner} needs the data module's {field} ({what}), but {self.name} has no attribute '{field}'; give "
            f"{self.name} a '{field}' attribute or property{alternative}, or subclass cloc_lightning.data.BaseDataModule "
            "(it has every field of cloc_lightning.data_contract.DataContract)"
        ) from None

    @property
    def num_classes(self) -> int:
        """The data module's number of classes (required)."""
        value = self._require("num_classes", "the number of classes, ranks for ordinal data")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataContractError(f"{self.name}.num_classes must be a positive integer, got {value!r}")
        return value

    @property
    def task(self) -> Task:
        """The data module's task, ``'ordinal'`` or ``'nominal'`` (required)."""
        value = self._require(
            "task",
            "'ordinal' or 'nominal'",
            alternative=f" (e.g. a class attribute task = 'ordinal') or give {self.owner} an explicit task instead of auto",
        )
        if value not in get_args(Task):
            raise DataContractError(f"{self.name}.task must be one of {list(get_args(Task))}, got {value!r}")
        task: Task = value
        return task

    # ------------------------------------------------------------------ optional
    def provides(self, field: str) -> bool:
        """Whether the data module has ``field`` (reading it: a property runs)."""
        return hasattr(self.datamodule, field)

    @property
    def class_names(self) -> list[str] | None:
        """Class names in label order (``None``: not given)."""
        names = getattr(self.datamodule, "class_names", None)
        return None if names is None else [str(n) for n in names]

    def check_num_classes(self, given: int | None, fix: str, subject: str | None = None) -> None:
        """Refuse a model ``num_classes`` (``given``; ``None``: not given) other than the data module's.

        The one wording of the mismatch, for the CLI's ``data -> model`` link, the classifiers' and the
        online probe's ``setup``: ``"model.num_classes=5 but UTKFaceDataModule has 8 classes (['0-4', ...]);
        <fix>"``.  ``fix`` says what to do, with ``{n}`` (the data module's count) and ``{given}`` filled in;
        ``subject`` replaces the ``model.num_classes=<given>`` that starts the message.
        """
        if given is None:
            return
        n = self.num_classes
        if given == n:
            return
        names = (self.class_names or [])[:10]
        shown = f" ({names})" if names else ""
        lead = f"model.num_classes={given}" if subject is None else subject
        raise ValueError(f"{lead} but {self.name} has {n} classes{shown}; {fix.format(n=n, given=given)}")

    @property
    def n_views(self) -> int | None:
        """Training views per sample (``None``: the data module does not say)."""
        value = getattr(self.datamodule, "n_views", None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def train_views(self) -> Any:
        """The multi-view specification (``None``: single-view training, or not given)."""
        return getattr(self.datamodule, "train_views", None)

    @property
    def image_size(self) -> int | Sequence[int] | None:
        """Side (or ``(height, width)``) of the images the model sees (``None``: not given)."""
        value: int | Sequence[int] | None = getattr(self.datamodule, "image_size", None)
        return value

    @property
    def normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The input normalisation ``(mean, std)``, one value per channel (``None``: the data module does not say)."""
        mean, std = getattr(self.datamodule, "mean", None), getattr(self.datamodule, "std", None)
        if mean is None or std is None:
            return None
        return tuple(float(v) for v in mean), tuple(float(v) for v in std)

    @property
    def batch_size(self) -> int | None:
        """Training batch size per process (``None``: not given)."""
        value = getattr(self.datamodule, "batch_size", None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def drop_last(self) -> bool | None:
        """Whether the last incomplete training batch is dropped (``None``: not given)."""
        value = getattr(self.datamodule, "drop_last", None)
        return None if value is None else bool(value)

    @property
    def train_size(self) -> int | None:
        """Images in the training set once it is set up (``None`` before ``setup`` or when not given)."""
        train_set = getattr(self.datamodule, "train_set", None)
        return None if train_set is None else len(train_set)

    @property
    def val_fraction(self) -> float | None:
        """Held-out share of the training set (0: the validation set is the test split; ``None``: not given)."""
        value = getattr(self.datamodule, "val_fraction", None)
        return None if value is None else float(value)

    def whole_split_dataloader(self, split: Literal["val", "test"]) -> Any:
        """A loader of the whole ``split`` on one process (``whole_split_dataloader`` when the data module has one).

        Under DDP the data modules' ``val_dataloader`` / ``test_dataloader`` give each process its
        share only; a reader on rank 0 that wants every sample (the plots) asks for this one.
        """
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {list(_SPLITS)}, got {split!r}")
        whole = getattr(self.datamodule, "whole_split_dataloader", None)
        if callable(whole):
            return whole(split)
        loader = self.datamodule.val_dataloader() if split == "val" else self.datamodule.test_dataloader()  # type: ignore[attr-defined]
        return loader


def datamodule_info(trainer: Any, owner: str = "the model") -> DataInfo | None:
    """The :class:`DataInfo` of the data module attached to ``trainer`` (``None`` without a trainer or a data module).

    Without a data module (plain dataloaders: ``trainer.fit(model, train_loader)``) there is
    nothing to read, and each reader keeps its documented default.
    """
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    return None if datamodule is None else DataInfo(datamodule, owner)
