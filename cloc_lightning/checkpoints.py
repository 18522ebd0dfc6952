"""What a checkpoint records about the module that wrote it, the check that a checkpoint fits a module, and the one checkpoint reader.

Every :class:`~cloc_lightning.methods.base.BaseModule` checkpoint holds
``checkpoint[MODULE_META_KEY]``: the module's class path, the class paths of its bases
(so a subclass may resume its parent's checkpoint and vice versa) and the encoder
architecture (``backbone``, ``cifar_stem``, ``backbone_kwargs``).  Resuming or evaluating
with ``--ckpt_path`` (or ``trainer.fit(..., ckpt_path=...)``) a checkpoint of another
method or backbone is refused with a message naming both, instead of silently running
the checkpoint's model (``init_from`` is the way to take matching weights from another
module).

Pre-training checkpoints also hold ``checkpoint[ENCODER_META_KEY]`` (:func:`encoder_metadata`):
which weights form the evaluation encoder and how to rebuild it, read by
:func:`encoder_state_dict` / :func:`load_encoder` for ``cloc-lightning probe``, the
``LinearProbeModule`` and ``init_from``.  The lookup, in order: the writing class's
classmethod ``encoder_state_dict(checkpoint)``; else its ``encoder_prefix`` (e.g.
``'target_encoder.'``); else :data:`DEFAULT_ENCODER_PREFIX`.  A plain ``state_dict`` file
works too, with the architecture given explicitly.

Every checkpoint file the package reads itself goes through :func:`read_checkpoint` (clear
errors for a missing file, a text/YAML file or an unreadable one): ``init_from``
(:func:`load_matching_weights`, ``BaseModule.load_weights``), the encoder of the probes
(:func:`load_encoder`), ``export-prototypes``, ``--ckpt_path`` and exact resume.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cloc_lightning.nn.encoders import build_registered_encoder, encoder_feature_dim

__all__ = [
    "MODULE_META_KEY",
    "module_record",
    "checkpoint_mismatch",
    "check_checkpoint",
    "CheckpointMismatchError",
    "ENCODER_META_KEY",
    "DEFAULT_ENCODER_PREFIX",
    "EncoderCheckpoint",
    "encoder_metadata",
    "encoder_state_dict",
    "load_encoder",
    "load_encoder_weights",
    "import_class",
    "build_encoder",
    "read_checkpoint",
    "INIT_FROM_HINT",
    "load_matching_weights",
    "match_weights",
]

#: checkpoint entry written by :func:`module_record`
MODULE_META_KEY = "cloc_lightning/module"
_ARCH_KEYS = ("backbone", "cifar_stem", "backbone_kwargs")
#: checkpoint entry written by :func:`encoder_metadata` (class path, prefix, architecture)
ENCODER_META_KEY = "cloc_lightning/encoder"
#: where :class:`~cloc_lightning.methods.base.BaseModule` keeps its encoder
DEFAULT_ENCODER_PREFIX = "backbone."


class CheckpointMismatchError(ValueError):
    """A checkpoint was written by another module class or encoder architecture than the configured one."""


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _lineage(cls: type) -> list[str]:
    """Class paths of ``cls`` and its bases up to (not including) ``LightningModule``."""
    import lightning as L

    return [_class_path(c) for c in cls.__mro__ if issubclass(c, L.LightningModule) and c is not L.LightningModule]


def _arch(hparams: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "backbone": hparams.get("backbone"),
        "cifar_stem": bool(hparams.get("cifar_stem", False)),
        "backbone_kwargs": dict(hparams.get("backbone_kwargs") or {}),
    }


def module_record(module: Any) -> dict[str, Any]:
    """``checkpoint[MODULE_META_KEY]`` of ``module``: class path, base classes, encoder architecture."""
    cls = type(module)
    return {"class_path": _class_path(cls), "lineage": _lineage(cls), **_arch(getattr(module, "hparams", {}) or {})}


def _recorded(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The module record of a checkpoint, also for checkpoints written before :data:`MODULE_META_KEY` existed."""
    meta = checkpoint.get(MODULE_META_KEY)
    if isinstance(meta, dict):
        return meta
    hp = checkpoint.get("hyper_parameters") or {}
    class_path = hp.get("_class_path") or (checkpoint.get("cloc_lightning/encoder") or {}).get("class_path")
    if class_path is None and "backbone" not in hp:
        return None
    return {"class_path": class_path, "lineage": [class_path] if class_path else [], **_arch(hp)}


def _short(path: str | None) -> str:
    return (path or "an unknown module").rsplit(".", 1)[-1]


def checkpoint_mismatch(module_cls: type, module_hparams: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> str | None:
    """Why ``checkpoint`` cannot be resumed/evaluated by a ``module_cls`` with ``module_hparams`` (``None`` if it can).

    Classes match when one is the other or a subclass of it (by class path, so the
    checkpoint's class need not be importable); the architecture matches when
    ``backbone``, ``cifar_stem`` and ``backbone_kwargs`` are equal; ``num_classes`` (when both
    sides have one) must be equal, and so must every hyper-parameter that ``module_cls`` names in
    its ``identity_hparams`` class attribute (when both sides have it; e.g.
    :class:`~cloc_lightning.methods.OrdinalRegressionModule`'s ``head``, which decides what its
    weights and outputs mean).
    """
    meta = _recorded(checkpoint)
    if meta is None:
        return None
    own_path = _class_path(module_cls)
    own_lineage = _lineage(module_cls)
    theirs = meta.get("class_path")
    # (the same class re-exported under another module path still matches by name)
    if theirs and theirs not in own_lineage and own_path not in (meta.get("lineage") or [theirs]) and _short(theirs) != _short(own_path):
        return f"the checkpoint was written by {_short(theirs)} ({theirs}), but the configured model is {_short(own_path)} ({own_path})"
    own_arch, their_arch = _arch(module_hparams), {k: meta.get(k) for k in _ARCH_KEYS}
    their_arch["cifar_stem"] = bool(their_arch["cifar_stem"])
    their_arch["backbone_kwargs"] = dict(their_arch["backbone_kwargs"] or {})
    if their_arch["backbone"] is not None and own_arch["backbone"] is not None and own_arch != their_arch:
        diff = ", ".join(
            f"{k}: checkpoint {their_arch[k]!r} vs configured {own_arch[k]!r}" for k in _ARCH_KEYS if own_arch[k] != their_arch[k]
        )
        return f"the checkpoint's encoder differs from the configured one ({diff})"
    # the class count: LightningCLI adopts the checkpoint's hyper-parameters, so a later
    # "model.num_classes=8 but the data has 5" would name the checkpoint's value as the config's
    theirs_n = (checkpoint.get("hyper_parameters") or {}).get("num_classes")
    own_n = module_hparams.get("num_classes")
    if _is_count(theirs_n) and _is_count(own_n) and theirs_n != own_n:
        return (
            f"the checkpoint was trained with num_classes={theirs_n}, but the configured model says "
            f"num_classes={own_n} (the data module must have {theirs_n} classes to evaluate or resume it)"
        )
    their_hparams = checkpoint.get("hyper_parameters") or {}
    for name in getattr(module_cls, "identity_hparams", ()):
        theirs_v, own_v = their_hparams.get(name), module_hparams.get(name)
        if theirs_v is not None and own_v is not None and theirs_v != own_v:
            return (
                f"the checkpoint was trained with {name}: {theirs_v}, but the configured {_short(own_path)} has "
                f"{name}: {own_v} (set --model.{name} {theirs_v} to evaluate or resume it)"
            )
    return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_checkpoint(module: Any, checkpoint: Mapping[str, Any], source: str = "the checkpoint") -> None:
    """Raise :class:`CheckpointMismatchError` naming both sides when ``checkpoint`` does not fit ``module``."""
    why = checkpoint_mismatch(type(module), getattr(module, "hparams", {}) or {}, checkpoint)
    if why is not None:
        raise CheckpointMismatchError(
            f"cannot load {source}: {why}. Use the config the checkpoint was trained with (it is saved as "
            "config.yaml next to the checkpoints folder), pick a checkpoint of this model, or take its matching "
            "weights only with --model.init_from <ckpt> (no optimiser state, epoch or hyper-parameters)."
        )


# ------------------------------------------------------------ encoder entry
def encoder_metadata(module: nn.Module) -> dict[str, Any]:
    """The ``checkpoint[ENCODER_META_KEY]`` entry of ``module``: class path, encoder prefix and architecture.

    Call it from ``on_save_checkpoint``::

        def on_save_checkpoint(self, checkpoint):
            checkpoint[ENCODER_META_KEY] = encoder_metadata(self)
    """
    cls = type(module)
    hp = getattr(module, "hparams", {}) or {}
    return {
        "class_path": f"{cls.__module__}.{cls.__qualname__}",
        "prefix": getattr(module, "encoder_prefix", DEFAULT_ENCODER_PREFIX),
        "backbone": hp.get("backbone"),
        "cifar_stem": bool(hp.get("cifar_stem", False)),
        "backbone_kwargs": dict(hp.get("backbone_kwargs") or {}),
        "feature_dim": getattr(module, "feature_dim", None),
    }


@dataclass
class EncoderCheckpoint:
    """The encoder found in a checkpoint.

    Attributes:
        state_dict: the encoder's weights, keyed as in the bare encoder.
        backbone: timm model name (``None`` if the checkpoint does not say).
        cifar_stem: whether the CIFAR stem was applied.
        backbone_kwargs: extra ``timm.create_model`` arguments.
        source: what the weights were taken from (for messages).
        class_path: the module class that wrote the checkpoint, if known.
    """

    state_dict: dict[str, torch.Tensor]
    backbone: str | None
    cifar_stem: bool = False
    backbone_kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    class_path: str | None = None

    def info(self) -> dict[str, Any]:
        """The architecture as a plain dict (stored in a LinearProbeModule's hyper-parameters)."""
        return {
            "backbone": self.backbone,
            "cifar_stem": self.cifar_stem,
            "backbone_kwargs": dict(self.backbone_kwargs),
            "source": self.source,
            "class_path": self.class_path,
        }


def import_class(path: str | None) -> type | None:
    """The class a dotted ``class_path`` names (``None`` when it is empty or cannot be imported)."""
    if not path or "." not in path:
        return None
    module, _, name = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError):
        return None
    return obj if isinstance(obj, type) else None


def _text_file_kind(path: str, limit: int = 1 << 20) -> str | None:
    """What a non-checkpoint file is, when it is text: a margins YAML, another YAML/JSON file or text (``None``: binary)."""
    try:
        with open(path, "rb") as f:
            head = f.read(limit + 1)
    except OSError:
        return None
    if b"\0" in head[:4096]:
        return None
    try:
        text = head[:limit].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(head) > limit:
        return "a text file"
    import yaml

    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        return "a text file"
    if isinstance(loaded, dict) and "learnable_map" in loaded:
        return "a YAML file of CLOC margins (written by CLOCMarginFreeze: give it to --model.learnable_map)"
    if isinstance(loaded, (dict, list)):
        return "a YAML (or JSON) file"
    return "a text file"


def read_checkpoint(
    path: str,
    *,
    mmap: bool = False,
    what: str = "encoder checkpoint",
    hint: str = "give the .ckpt of a stage-one run (e.g. runs/<name>/version_0/checkpoints/best-*.ckpt or last.ckpt)",
) -> dict[str, Any]:
    """Load a checkpoint (or ``state_dict``) file onto the CPU; clear errors for a missing or unreadable file.

    ``mmap=True`` memory-maps the tensors (for reading metadata without loading the weights;
    a legacy non-zip file falls back to a normal load).  ``what`` names the file in messages,
    ``hint`` says what to give instead of a missing file.
    """
    full = os.path.expanduser(str(path))
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist; {hint}")
    try:
        try:
            ckpt = torch.load(full, map_location="cpu", weights_only=False, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            ckpt = torch.load(full, map_location="cpu", weights_only=False)  # a legacy (non-zip) file cannot be memory-mapped
    except Exception as e:
        kind = _text_file_kind(full)
        if kind is not None:
            raise ValueError(f"cannot read {str(path)!r} as a PyTorch checkpoint: it is {kind}, not a checkpoint; {hint}") from e
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"cannot read {str(path)!r} as a PyTorch checkpoint ({type(e).__name__}: {first}); {hint}") from e
    if not isinstance(ckpt, dict):
        raise ValueError(f"{str(path)!r} holds a {type(ckpt).__name__}, not a checkpoint dict or state_dict")
    return ckpt


#: what ``init_from`` takes (the hint of its file errors)
INIT_FROM_HINT = (
    "init_from takes a .ckpt file (e.g. runs/<name>/version_0/checkpoints/best-*.ckpt or last.ckpt) or a "
    "state_dict saved with torch.save; a CLOC margins YAML goes to --model.learnable_map"
)


def match_weights(
    module: nn.Module, path: str, exclude: Sequence[str] = (), mmap: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, list[str]]]:
    """What ``init_from`` ``path`` would load into ``module``, without loading it: ``(tensors, report)``.

    The checks and the report of :func:`load_matching_weights` (which loads the tensors); used
    on its own (``mmap=True``: the tensors are not read) to see, before a run, which of the
    module's weights the file leaves at their initialisation (``cloc-lightning test``/``predict``
    refuse such a model).
    """
    ckpt = read_checkpoint(path, mmap=mmap, what="init_from checkpoint", hint=INIT_FROM_HINT)
    state = ckpt.get("state_dict", ckpt)
    if not isinstance(state, dict) or not any(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"init_from {path!r} is neither a Lightning checkpoint nor a state_dict of tensors")
    own = module.state_dict()
    skip = tuple(exclude)
    take = {k: v for k, v in state.items() if k in own and isinstance(v, torch.Tensor) and not k.startswith(skip)}
    bad = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in take.items() if v.shape != own[k].shape]
    if bad:
        raise ValueError(f"init_from {path!r} does not fit this model (shape mismatch): {bad[:5]}")
    if not take:
        raise ValueError(f"init_from {path!r} shares no weights with {type(module).__name__} (keys like {list(state)[:3]})")
    missing = [k for k in own if k not in take and not k.startswith(skip)]
    unexpected = [k for k in state if k not in own]
    return take, {"loaded": list(take), "missing": missing, "unexpected": unexpected}


def load_matching_weights(module: nn.Module, path: str, exclude: Sequence[str] = ()) -> dict[str, list[str]]:
    """Load the weights of the checkpoint (or ``state_dict`` file) ``path`` that ``module`` has too (``init_from``).

    Weights only: no optimiser state, epoch or hyper-parameters.  Keys starting with a prefix
    in ``exclude`` are skipped; a key present in both with a different shape is an error, and
    so is a file that shares no weight with ``module``.  Returns ``{'loaded', 'missing',
    'unexpected'}`` (key lists: loaded; in ``module`` but not loaded; in the file but not in
    ``module``).
    """
    take, report = match_weights(module, path, exclude)
    module.load_state_dict(take, strict=False)
    return report


def _prefixes(keys: Sequence[str]) -> list[str]:
    return sorted({k.split(".", 1)[0] + "." for k in keys if "." in k})


def encoder_state_dict(checkpoint: dict[str, Any], source: str = "checkpoint") -> EncoderCheckpoint:
    """The evaluation encoder of a loaded checkpoint dict (see the module docstring for the hook).

    Raises:
        ValueError: the checkpoint holds no encoder weights under the expected prefix.
    """
    meta = checkpoint.get(ENCODER_META_KEY) or {}
    hparams = checkpoint.get("hyper_parameters") or {}
    class_path = meta.get("class_path") or hparams.get("_class_path")
    cls = import_class(class_path)
    arch = {k: meta.get(k, hparams.get(k)) for k in _ARCH_KEYS}
    is_lightning = "state_dict" in checkpoint and isinstance(checkpoint["state_dict"], dict)
    state = checkpoint["state_dict"] if is_lightning else checkpoint
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{source} is neither a Lightning checkpoint nor a state_dict of tensors")

    hook: Callable[[dict[str, Any]], dict[str, torch.Tensor]] | None = getattr(cls, "encoder_state_dict", None)
    owner = class_path.rsplit(".", 1)[-1] if class_path else "an unknown module"
    if hook is not None:
        weights = dict(hook(checkpoint))
        where = f"{owner}.encoder_state_dict()"
    else:
        prefix = meta.get("prefix") or getattr(cls, "encoder_prefix", None) or DEFAULT_ENCODER_PREFIX
        weights = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        where = f"keys {prefix!r}* of {owner}"
        if not weights and not is_lightning:  # a bare encoder state_dict
            weights, where = dict(state), "a plain state_dict"
    if not weights:
        raise ValueError(
            f"{source} holds no encoder weights ({where}); its weights start with {_prefixes(list(state))[:8]}. "
            "Give a checkpoint of a pre-training module (SupConModule, RnCModule, CEModule, CLOCModule, ReLICModule, ...), "
            "or a module that names its encoder with an encoder_prefix class attribute / encoder_state_dict classmethod."
        )
    return EncoderCheckpoint(
        state_dict=weights,
        backbone=arch["backbone"],
        cifar_stem=bool(arch["cifar_stem"] or False),
        backbone_kwargs=dict(arch["backbone_kwargs"] or {}),
        source=f"{source} ({where})",
        class_path=class_path,
    )


def load_encoder(
    path: str,
    backbone: str | None = None,
    cifar_stem: bool | None = None,
    backbone_kwargs: dict[str, Any] | None = None,
) -> EncoderCheckpoint:
    """Read ``path`` and return its encoder; ``backbone``/``cifar_stem``/``backbone_kwargs`` override the stored ones.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: not a checkpoint, no encoder in it, or no architecture known.
    """
    enc = encoder_state_dict(read_checkpoint(path), source=repr(str(path)))
    if backbone is not None:
        enc.backbone = backbone
    if cifar_stem is not None:
        enc.cifar_stem = cifar_stem
    if backbone_kwargs is not None:
        enc.backbone_kwargs = dict(backbone_kwargs)
    if not enc.backbone:
        raise ValueError(
            f"{str(path)!r} does not record its backbone architecture; pass it explicitly "
            "(model.backbone / --backbone, e.g. resnet18, and cifar_stem if it was used)"
        )
    return enc


def load_encoder_weights(encoder: nn.Module, enc: EncoderCheckpoint) -> None:
    """Load ``enc.state_dict`` into ``encoder`` strictly; a clear error names the architecture mismatch."""
    own = encoder.state_dict()
    bad = [f"{k}: {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in enc.state_dict.items() if k in own and v.shape != own[k].shape]
    missing = [k for k in own if k not in enc.state_dict]
    unexpected = [k for k in enc.state_dict if k not in own]
    if missing or unexpected or bad:
        raise ValueError(
            f"backbone mismatch: the encoder weights of {enc.source} do not fit timm {enc.backbone!r} "
            f"(cifar_stem={enc.cifar_stem}): missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"shape mismatches (checkpoint vs model) {bad[:5]}. "
            "Set backbone/cifar_stem to the stage-one encoder's (or leave them unset to use the checkpoint's)."
        )
    encoder.load_state_dict(enc.state_dict, strict=True)


def build_encoder(enc: EncoderCheckpoint) -> tuple[nn.Module, int]:
    """``(encoder with the checkpoint's weights, feature_dim)``; the encoder is in eval mode.

    The architecture is rebuilt by the ``"timm"`` builder of the one encoder registry
    (:data:`~cloc_lightning.nn.encoders.ENCODER_BUILDERS`, the registry exported prototype
    classifiers load through too).
    """
    model = build_registered_encoder("timm", backbone=enc.backbone or "", cifar_stem=enc.cifar_stem, backbone_kwargs=enc.backbone_kwargs)
    dim = encoder_feature_dim(model)
    load_encoder_weights(model, enc)
    return model.eval(), dim
