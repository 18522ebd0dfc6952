"""CLOC's margins and everything done with them: one owner.

Paper: D. Pitawela, G. Carneiro, H.-T. Chen, "CLOC: Contrastive Learning for Ordinal
Classification with Multi-Margin N-pair Loss", CVPR 2025 (arXiv:2504.17813).  Between each
pair of adjacent classes ``c, c+1`` (``c = 0 .. C-2``) sits a margin ``m_c = softplus(raw_c)``;
the class positions are ``pos = cumsum([0, m_0, ..., m_{C-2}])`` and the margin between
classes ``a`` and ``b`` is ``|pos_a - pos_b|``.  Phase one learns the raw values, phase two
keeps them fixed.

:class:`CLOCMargins` owns them:

* **parse and validate** -- a ``learnable_map`` (one ``[kind, value]`` pair per margin; kinds
  ``learnable`` / ``fixed``, ``value`` the margin itself or ``None`` for U(0.5, 1.0)), read
  from a list, a margins YAML file or an inline YAML list by :func:`load_learnable_map`;
* **hold** -- the raw values as parameters (learnable) and buffers (fixed), so they follow
  ``.to()``, live in ``state_dict`` and survive checkpoints;
* **freeze** -- :meth:`CLOCMargins.freeze` ends phase one (no gradient, the all-``fixed`` map
  returned); :attr:`CLOCMargins.frozen` / :attr:`CLOCMargins.frozen_at` are the only record of
  it, which the module, the callbacks and the checkpoint read;
* **log** -- names, detached device values (no host read until a logger writes), the
  TensorBoard "Class Distances" layout and the reference's ``SummaryWriter`` scalars;
* **YAML in/out** -- :meth:`CLOCMargins.to_yaml` writes the phase-two file,
  :meth:`CLOCMargins.from_yaml` / :func:`load_learnable_map` read it back.

Two layouts: :class:`MultiMargins` (``mm``: one margin per adjacent pair, the reference's
``learnables`` / ``fixed_raw`` / ``learnable_mask`` / ``learnable_index``) and
:class:`SingleMargin` (``sm``: one ``distance`` shared by every pair).  The CLOC losses
(:class:`~cloc_lightning.losses.OrdinalContrastiveLoss_mm` / ``_sm``) *are* their margins'
owner: they subclass these layouts, so the parameters keep the reference's attribute names
(``F.softplus(crit.learnables)``) and the ``state_dict`` keys of every earlier checkpoint.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, TypeVar

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from cloc_lightning.validation import check_choice, check_float, check_int, invalid_yaml, read_text

#: what a margins file is, in the errors that refuse one
_MARGINS_FIX = "learnable_map takes the margins YAML written by CLOCMarginFreeze (<log_dir>/cloc_margins.yaml)"

__all__ = [
    "CLOCMargins",
    "MultiMargins",
    "SingleMargin",
    "inverse_softplus",
    "load_learnable_map",
    "LAYOUT_TITLE",
]

LearnableMap = list[list[Any]]
MarginKind = Literal["learnable", "fixed"]
MarginMode = Literal["mm", "sm"]
_M = TypeVar("_M", bound="CLOCMargins")

#: layout title used by the reference for its TensorBoard custom-scalars chart.
LAYOUT_TITLE = "Class Distances"
#: what ``n_classes`` is, in its error messages
_N_CLASSES_HINT = "n_classes is the number of ordinal classes; CLOC needs at least two"
#: first line of a margins YAML file
_YAML_HEADER = "# CLOC margins at the end of phase one; use with --model.learnable_map <this file>\n"
#: how to avoid margins that are not finite and > 0 (said when they are refused)
_DIVERGED_FIX = "Lower the learning rate of the margins or clip gradients and train phase one again"


def inverse_softplus(value: torch.Tensor) -> torch.Tensor:
    """``softplus^{-1}(v) = log(exp(v) - 1)``, computed stably as ``v + log(-expm1(-v))``.

    Args:
        value: tensor of positive margins (any shape).

    Returns:
        Raw parameter values of the same shape with ``softplus(raw) == value``.
    """
    return value + torch.log(-torch.expm1(-value))


def load_learnable_map(value: LearnableMap | str | None) -> LearnableMap | None:
    """A ``learnable_map`` from a list, a YAML/JSON file path or a YAML string (not yet validated).

    Files written by :meth:`CLOCMargins.to_yaml` (``CLOCMarginFreeze``'s ``cloc_margins.yaml``)
    hold ``{'learnable_map': [[kind, value], ...], ...}``; a bare list works too.  ``None`` and
    lists are returned as they are.  :class:`CLOCMargins` validates the entries.
    """
    if value is None or isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise TypeError(f"learnable_map must be a list of [kind, value] pairs or a YAML file path, got {type(value).__name__}")
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        text = read_text(path, "learnable_map", _MARGINS_FIX)
        try:
            loaded = yaml.safe_load(text)
        except yaml.MarkedYAMLError as e:
            raise ValueError(
                f"{invalid_yaml(value, e)}; learnable_map takes the margins YAML written by "
                "CLOCMarginFreeze (<log_dir>/cloc_margins.yaml): fix the file or write it again"
            ) from None
    elif value.strip().startswith("["):
        try:
            loaded = yaml.safe_load(value)
        except yaml.MarkedYAMLError as e:
            raise ValueError(
                f"{invalid_yaml('learnable_map', e)}; write an inline list such as "
                "[[fixed, 0.5], [learnable, null]] or give a margins YAML file"
            ) from None
    else:
        raise FileNotFoundError(
            f"learnable_map file {value!r} does not exist; pass the margins YAML written by CLOCMarginFreeze "
            "(<log_dir>/cloc_margins.yaml) or an inline list like [[fixed, 0.5], [fixed, 0.7]]"
        )
    if isinstance(loaded, dict):
        if "learnable_map" not in loaded:
            raise ValueError(f"{value!r} has no 'learnable_map' key (keys: {sorted(loaded)})")
        loaded = loaded["learnable_map"]
    if not isinstance(loaded, list):
        raise ValueError(f"{value!r} does not hold a list of [kind, value] pairs")
    return loaded


def _check_kind(kind: Any) -> None:
    """The ``kind`` argument of ``to_learnable_map``: a :data:`MarginKind` or ``None``."""
    if kind is not None:
        check_choice(
            "kind", kind, MarginKind, hint="'fixed' or 'learnable' sets every margin's kind, None keeps each margin's current kind"
        )


def _parse_learnable_map(learnable_map: Any, n_entries: int, what: str) -> list[tuple[str, float | None]]:
    """Validate a ``learnable_map`` and return ``[(kind, value or None), ...]`` of length ``n_entries``."""
    if learnable_map is None:
        return [("learnable", None)] * n_entries
    if isinstance(learnable_map, (str, bytes)) or not isinstance(learnable_map, Sequence):
        raise TypeError(
            f"learnable_map must be None or a list of [kind, value] pairs such as "
            f"[['learnable', None], ['fixed', 0.4]], got {type(learnable_map).__name__}"
        )
    if len(learnable_map) != n_entries:
        raise ValueError(
            f"learnable_map has {len(learnable_map)} entries but {what} needs exactly {n_entries} "
            f"(one [kind, value] pair per margin); check n_classes or the phase-two margin YAML"
        )
    parsed: list[tuple[str, float | None]] = []
    for i, entry in enumerate(learnable_map):
        where = f"learnable_map[{i}]"
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise TypeError(f"{where} must be a pair [kind, value] such as ['fixed', 0.4], got {entry!r}")
        kind, value = entry[0], entry[1]
        check_choice(f"{where}: kind", kind, MarginKind)
        if value is None:
            if kind == "fixed":
                raise ValueError(f"{where}: a 'fixed' margin needs a value, e.g. ['fixed', 0.4]")
            parsed.append((kind, None))
        else:
            margin = check_float(
                f"{where}: the margin value",
                value,
                minimum=0.0,
                strict_minimum=True,
                expect="a number > 0 or None",
                hint="margins are distances between adjacent classes, finite and > 0",
            )
            parsed.append((kind, margin))
    return parsed


def _init_raw(value: float | None) -> torch.Tensor:
    """Raw (pre-softplus) float64 scalar: ``value`` itself, or a margin drawn from U(0.5, 1.0).

    The draw uses ``torch.rand(1)`` once per ``None`` entry, in map order, like the reference,
    so a seeded run initialises the same margins.
    """
    margin = 0.5 + torch.rand(1).double() * 0.5 if value is None else torch.tensor([value], dtype=torch.float64)
    return inverse_softplus(margin)[0]


class CLOCMargins(nn.Module):
    """The ``C - 1`` adjacent-class margins of CLOC (Pitawela et al., CVPR 2025) and all that is done with them.

    Holds the raw (pre-softplus) values; ``margins() = softplus(raw)`` ([C - 1]) are the
    distances between adjacent classes and :meth:`distance_matrix` the margin between any
    two classes, ``|pos_a - pos_b|`` with ``pos = cumsum([0, m_0, ..., m_{C-2}])``.  A
    layout (:class:`MultiMargins`, :class:`SingleMargin`) decides how the raw values are
    stored; everything else is here.

    Args:
        n_classes: number of ordinal classes ``C >= 2``.
        learnable_map: ``None`` (every margin learnable, initialised from U(0.5, 1.0)) or one
            ``[kind, value]`` pair per entry of the layout (``C - 1`` for ``mm``, 1 for
            ``sm``): ``['learnable', v]`` starts at margin ``v`` (``None``: U(0.5, 1.0)),
            ``['fixed', v]`` keeps margin ``v``.  A margins YAML goes through
            :func:`load_learnable_map` (or :meth:`from_yaml`) first.

    Frozen state: :meth:`freeze` is the one way to end phase one; :attr:`frozen` and
    :attr:`frozen_at` are its only record (the Lightning module's ``margins_frozen``, the
    callbacks and the checkpoint's ``cloc`` entry read them).
    """

    #: ``mm`` (a margin per adjacent class pair) or ``sm`` (one shared margin); the YAML's ``margin_mode``
    mode: ClassVar[MarginMode]
    n_classes: int
    n_distances: int

    def __init__(self, n_classes: int, learnable_map: Sequence[Sequence[Any]] | None = None) -> None:
        n = check_int("n_classes", n_classes, 2, hint=_N_CLASSES_HINT)
        entries = _parse_learnable_map(learnable_map, self._map_length(n), self._map_owner(n))
        super().__init__()
        self.n_classes = n
        self.n_distances = n - 1
        self._frozen_at: dict[str, int | None] | None = None
        self.writer: Any = None
        self._layout_registered = False
        self._build(entries)

    # -- the layout (what a subclass defines) ------------------------------
    @classmethod
    def _map_length(cls, n_classes: int) -> int:
        """How many ``[kind, value]`` entries a ``learnable_map`` of this layout has."""
        raise NotImplementedError

    @classmethod
    def _map_owner(cls, n_classes: int) -> str:
        """Who needs the map, in the wrong-length message."""
        return f"{cls.__name__}(n_classes={n_classes})"

    def _build(self, entries: list[tuple[str, float | None]]) -> None:
        """Create the parameters/buffers from the validated entries (draws ``None`` values in map order)."""
        raise NotImplementedError

    def raw_margins(self) -> torch.Tensor:
        """The ``[n_classes - 1]`` raw (pre-softplus) adjacent margins (differentiable)."""
        raise NotImplementedError

    def _entry_raw(self) -> torch.Tensor:
        """The raw values of the map's entries (``[C - 1]`` for ``mm``, ``[1]`` for ``sm``)."""
        raise NotImplementedError

    def _learnable_slots(self) -> list[bool]:
        """Which map entries were built learnable (whatever the frozen state)."""
        raise NotImplementedError

    def _margin_tensors(self) -> list[nn.Parameter]:
        """Every margin parameter (trainable or not)."""
        raise NotImplementedError

    # -- values ------------------------------------------------------------
    def margins(self) -> torch.Tensor:
        """All adjacent margins ``softplus(raw)``, shape ``[n_classes - 1]`` (differentiable)."""
        return F.softplus(self.raw_margins())

    def class_positions(self) -> torch.Tensor:
        """Class positions ``cumsum([0, margins])``, shape ``[n_classes]``."""
        m = self.margins()
        return torch.cat([m.new_zeros(1), torch.cumsum(m, 0)])

    def distance_matrix(self) -> torch.Tensor:
        """Margins between every pair of classes ``|pos_a - pos_b|``, shape ``[n_classes, n_classes]``."""
        pos = self.class_positions()
        return (pos.unsqueeze(0) - pos.unsqueeze(1)).abs()

    def margin_names(self) -> list[str]:
        """Names of the adjacent margins: ``['C0-C1', 'C1-C2', ...]`` (``n_classes - 1`` entries)."""
        return [f"C{i}-C{i + 1}" for i in range(self.n_distances)]

    def margin_parameters(self) -> list[nn.Parameter]:
        """The margin parameters that train now (empty when every margin is fixed or frozen)."""
        return [p for p in self._margin_tensors() if p.requires_grad and p.numel() > 0]

    def optimised_parameters(self) -> list[nn.Parameter]:
        """The margin parameters an optimiser holds: those built learnable, frozen or not.

        After :meth:`freeze` they stay in their optimiser group with their optimiser state; their
        ``grad`` stays ``None``, so Adam, AdamW, RAdam and SGD leave them and their state as they are.
        """
        return [p for p in self._margin_tensors() if p.numel() > 0]

    # -- frozen state ------------------------------------------------------
    @property
    def frozen(self) -> bool:
        """Whether :meth:`freeze` ended phase one (a map that was all ``fixed`` from the start is not frozen)."""
        return self._frozen_at is not None

    @property
    def frozen_at(self) -> dict[str, int | None] | None:
        """``{'epoch': e, 'step': s}`` as given to :meth:`freeze` (values ``None`` when not said); ``None`` before."""
        return None if self._frozen_at is None else dict(self._frozen_at)

    def freeze(self, epoch: int | None = None, step: int | None = None) -> LearnableMap:
        """End phase one: the margins keep their values, get no gradient and report kind ``fixed``.

        Safe to call again (the first call's ``epoch``/``step`` stay the record).  An optimiser
        holding the margins keeps them (:meth:`optimised_parameters`) and skips them from now on:
        their ``grad`` is ``None`` and stays so (``requires_grad`` is off).

        Returns:
            The all-``fixed`` ``learnable_map`` of the current margins (plain Python).
        """
        for p in self._margin_tensors():
            p.requires_grad_(False)
            p.grad = None
        if self._frozen_at is None:
            self._frozen_at = {"epoch": epoch, "step": step}
        return self.to_learnable_map("fixed")

    def margin_kinds(self) -> list[str]:
        """Each map entry's current kind: ``learnable`` (built learnable and not frozen) or ``fixed``."""
        return ["learnable" if slot and not self.frozen else "fixed" for slot in self._learnable_slots()]

    def checkpoint_record(self) -> dict[str, Any]:
        """What a Lightning checkpoint keeps beside the weights (its ``cloc`` entry).

        ``margins_frozen``, ``learnable_map`` (current kinds), ``margin_names`` and ``frozen_at``
        (``None`` while learning).  The weights themselves are in ``state_dict``.
        """
        return {
            "margins_frozen": self.frozen,
            "learnable_map": self.to_learnable_map(None),
            "margin_names": self.margin_names(),
            "frozen_at": self.frozen_at,
        }

    def load_checkpoint_record(self, record: dict[str, Any]) -> None:
        """Restore the frozen state of :meth:`checkpoint_record` (the values come from ``state_dict``)."""
        if record.get("margins_frozen"):
            when = record.get("frozen_at") or {}
            self.freeze(epoch=when.get("epoch"), step=when.get("step"))

    # -- learnable_map and YAML --------------------------------------------
    def to_learnable_map(self, kind: MarginKind | None = "fixed") -> LearnableMap:
        """The current margins as a ``learnable_map`` (plain Python, YAML-serialisable).

        ``kind='fixed'`` gives the map of CLOC's phase two (margins kept fixed);
        ``kind='learnable'`` restarts learning from the current values; ``kind=None``
        keeps each entry's current kind (:meth:`margin_kinds`).
        """
        _check_kind(kind)
        values = F.softplus(self._entry_raw().detach()).cpu().tolist()
        kinds = self.margin_kinds() if kind is None else [kind] * len(values)
        return [[k, float(v)] for k, v in zip(kinds, values, strict=True)]

    def usable_map(self, what: str = "the margins", fix: str = _DIVERGED_FIX) -> LearnableMap:
        """The all-``fixed`` map, refused unless every margin is finite and > 0 (what phase two accepts).

        A diverged phase one drives a raw margin to ``-inf`` (softplus 0) or NaN; such a map is
        never written.  ``what`` starts the one-line ``ValueError`` and ``fix`` ends it.
        """
        learnable_map = self.to_learnable_map("fixed")
        values = [pair[1] for pair in learnable_map]
        bad = [i for i, v in enumerate(values) if not math.isfinite(v) or v <= 0]
        if bad:
            raise ValueError(
                f"{what} are {values}; margin(s) {bad} are not finite and > 0 (phase one diverged: softplus of a raw "
                f"margin driven to -inf is 0), so no margins YAML is written and phase two cannot use them. {fix}"
            )
        return learnable_map

    def to_yaml(self, path: str | os.PathLike[str], **meta: Any) -> dict[str, Any]:
        """Write the phase-two margins YAML (all ``fixed``) to ``path``; returns what was written.

        The file holds ``learnable_map``, ``margin_mode``, ``n_classes``, ``margin_names`` and then
        ``meta`` in its order (``CLOCMarginFreeze``: ``epoch``, ``global_step``,
        ``frozen_in_this_run``).  Refuses margins that are not finite and > 0 (:meth:`usable_map`).
        """
        payload = {
            "learnable_map": self.usable_map(),
            "margin_mode": self.mode,
            "n_classes": self.n_classes,
            "margin_names": self.margin_names(),
            **meta,
        }
        folder = os.path.dirname(os.fspath(path))
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            f.write(_YAML_HEADER)
            yaml.safe_dump(payload, f, sort_keys=False)
        return payload

    @classmethod
    def from_yaml(cls: type[_M], source: str | os.PathLike[str], n_classes: int | None = None, **kwargs: Any) -> _M:
        """Margins (or a CLOC loss: ``OrdinalContrastiveLoss_mm.from_yaml(path)``) from a margins YAML.

        ``source`` is a file written by :meth:`to_yaml` or holding a bare list, or an inline YAML
        list.  ``n_classes`` defaults to the file's; a bare ``mm`` list gives ``len + 1``.
        ``kwargs`` go to the constructor (e.g. ``reduction`` of a loss).
        """
        text = os.fspath(source)
        learnable_map = load_learnable_map(text) or []
        path, payload = os.path.expanduser(text), None
        if os.path.isfile(path):
            payload = yaml.safe_load(read_text(path, "margins file", _MARGINS_FIX))
        if isinstance(payload, dict):
            mode = payload.get("margin_mode", cls.mode)
            if mode != cls.mode:
                raise ValueError(
                    f"{text!r} holds margin_mode {mode!r} margins but {cls.__name__} is margin_mode "
                    f"{cls.mode!r}; read it with the {mode!r} class or write the file again"
                )
            if n_classes is None:
                n_classes = payload.get("n_classes")
        if n_classes is None:
            if cls.mode == "sm":
                raise ValueError(
                    f"{text!r} does not say n_classes and one shared margin does not tell it; "
                    f"pass n_classes: {cls.__name__}.from_yaml(source, n_classes=...)"
                )
            n_classes = len(learnable_map) + 1
        return cls(n_classes, learnable_map=learnable_map, **kwargs)

    # -- logging -----------------------------------------------------------
    def logged_names(self) -> list[str]:
        """Names of the logged scalars (``C{i}-C{i+1}``; ``sm``: ``Margin``), one per map entry."""
        return self.margin_names()

    def margin_values(self) -> dict[str, torch.Tensor]:
        """What is logged: ``{'C0-C1': m_0, ...}`` (``sm``: ``{'Margin': m}``) as detached 0-d tensors on the
        margins' device (logging them reads nothing from the device until the logger writes)."""
        values = F.softplus(self._entry_raw().detach())
        return {name: values[i] for i, name in enumerate(self.logged_names())}

    def margin_scalars(self) -> dict[str, float]:
        """:meth:`margin_values` as Python floats (one host read)."""
        values = self.margin_values()
        return dict(zip(values, torch.stack(list(values.values())).cpu().tolist(), strict=True))

    def tensorboard_layout(self, prefix: str = "") -> dict[str, dict[str, list[Any]]]:
        """The "Class Distances" custom-scalars layout (one multi-line chart of the logged scalars ``prefix + name``)."""
        return {LAYOUT_TITLE: {"margin": ["Multiline", [prefix + name for name in self.logged_names()]]}}

    def set_writer(self, writer: Any) -> None:
        """Attach a ``torch.utils.tensorboard.SummaryWriter`` (or ``None`` to stop logging).

        The "Class Distances" custom-scalars layout is registered once per writer.
        """
        if writer is not None and not hasattr(writer, "add_scalar"):
            raise TypeError(f"summaryWriter must be a torch.utils.tensorboard.SummaryWriter (or None), got {type(writer).__name__}")
        if writer is self.writer and self._layout_registered:
            return
        self.writer = writer
        self._layout_registered = False
        if writer is not None and hasattr(writer, "add_custom_scalars"):
            writer.add_custom_scalars(self.tensorboard_layout())
            self._layout_registered = True

    def write_scalars(self, step: Any) -> None:
        """Write :meth:`margin_scalars` to the attached writer at ``step`` (nothing without a writer or a step)."""
        if self.writer is None or step is None:
            return
        for name, value in self.margin_scalars().items():
            self.writer.add_scalar(name, value, step)


class MultiMargins(CLOCMargins):
    """``mm``: one learnable or fixed margin between each pair of adjacent classes (Pitawela et al., CVPR 2025).

    Attributes:
        learnables: ``nn.Parameter`` [n_learnable], the raw learnable margins (empty and not
            trainable when every margin is fixed).
        fixed_raw: buffer [C - 1], raw values of the fixed margins (0 at learnable slots).
        learnable_mask: bool buffer [C - 1]; ``learnable_index``: long buffer [n_learnable].

    Example::

        >>> m = MultiMargins(4, [['fixed', 0.3], ['learnable', 0.6], ['fixed', 0.9]])
        >>> [round(v, 4) for v in m.margins().tolist()], m.margin_kinds()
        ([0.3, 0.6, 0.9], ['fixed', 'learnable', 'fixed'])
        >>> m.freeze()[1], m.frozen
        (['fixed', 0.6000000238418579], True)
    """

    mode: ClassVar[MarginMode] = "mm"
    learnable_mask: torch.Tensor
    learnable_index: torch.Tensor
    fixed_raw: torch.Tensor

    @classmethod
    def _map_length(cls, n_classes: int) -> int:
        return n_classes - 1

    def _build(self, entries: list[tuple[str, float | None]]) -> None:
        raw = torch.stack([_init_raw(v) for _, v in entries]).float()
        mask = torch.tensor([k == "learnable" for k, _ in entries], dtype=torch.bool)
        index = torch.nonzero(mask).flatten()
        self.register_buffer("fixed_raw", torch.where(mask, torch.zeros_like(raw), raw))
        self.register_buffer("learnable_mask", mask)
        self.register_buffer("learnable_index", index)
        self.learnables = nn.Parameter(raw[index].clone(), requires_grad=bool(index.numel() > 0))

    def raw_margins(self) -> torch.Tensor:
        if self.learnable_index.numel() == 0:
            return self.fixed_raw
        return self.fixed_raw.index_put((self.learnable_index,), self.learnables.to(self.fixed_raw.dtype))

    def _entry_raw(self) -> torch.Tensor:
        return self.raw_margins()

    def _learnable_slots(self) -> list[bool]:
        return [bool(m) for m in self.learnable_mask.tolist()]

    def _margin_tensors(self) -> list[nn.Parameter]:
        return [self.learnables]


class SingleMargin(CLOCMargins):
    """``sm``: one margin ``softplus(distance)`` shared by every pair of adjacent classes (Pitawela et al., CVPR 2025).

    Attributes:
        distance: raw margin [1]; an ``nn.Parameter`` when learnable, a buffer when fixed
            (``F.softplus(distance)`` works either way).
    """

    mode: ClassVar[MarginMode] = "sm"
    distance: torch.Tensor

    @classmethod
    def _map_length(cls, n_classes: int) -> int:
        return 1

    @classmethod
    def _map_owner(cls, n_classes: int) -> str:
        return f"{cls.__name__} (a single margin)"

    def _build(self, entries: list[tuple[str, float | None]]) -> None:
        ((kind, value),) = entries
        raw = _init_raw(value).float().reshape(1)
        if kind == "learnable":
            self.distance = nn.Parameter(raw)
        else:
            self.register_buffer("distance", raw)

    @property
    def learnable(self) -> bool:
        """Whether the single margin was built learnable (a parameter; else a fixed buffer)."""
        return isinstance(self.distance, nn.Parameter)

    def raw_margins(self) -> torch.Tensor:
        return self.distance.expand(self.n_distances)

    def _entry_raw(self) -> torch.Tensor:
        return self.distance

    def _learnable_slots(self) -> list[bool]:
        return [self.learnable]

    def _margin_tensors(self) -> list[nn.Parameter]:
        return [self.distance] if isinstance(self.distance, nn.Parameter) else []

    def logged_names(self) -> list[str]:
        return ["Margin"]
