"""What a checkpoint records about the module that wrote it, and the check that a checkpoint fits a module.

Every :class:`~cloc_lightning.methods.base.BaseModule` checkpoint holds
``checkpoint[MODULE_META_KEY]``: the module's class path, the class paths of its bases
(so a subclass may resume its parent's checkpoint and vice versa) and the encoder
architecture (``backbone``, ``cifar_stem``, ``backbone_kwargs``).  Resuming or evaluating
with ``--ckpt_path`` (or ``trainer.fit(..., ckpt_path=...)``) a checkpoint of another
method or backbone is refused with a message naming both, instead of silently running
the checkpoint's model (``init_from`` is the way to take matching weights from another
module).
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["MODULE_META_KEY", "module_record", "checkpoint_mismatch", "check_checkpoint", "CheckpointMismatchError"]

#: checkpoint entry written by :func:`module_record`
MODULE_META_KEY = "cloc_lightning/module"
_ARCH_KEYS = ("backbone", "cifar_stem", "backbone_kwargs")


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
    ``backbone``, ``cifar_stem`` and ``backbone_kwargs`` are equal.
    """
    meta = _recorded(checkpoint)
    if meta is None:
        return None
    own_path = _class_path(module_cls)
    own_lineage = _lineage(module_cls)
    theirs = meta.get("class_path")
    if theirs and theirs not in own_lineage and own_path not in (meta.get("lineage") or [theirs]):
        # the same class re-exported under another module path still matches by name
        if _short(theirs) != _short(own_path):
            return (
                f"the checkpoint was written by {_short(theirs)} ({theirs}), but the configured model is "
                f"{_short(own_path)} ({own_path})"
            )
    own_arch, their_arch = _arch(module_hparams), {k: meta.get(k) for k in _ARCH_KEYS}
    their_arch["cifar_stem"] = bool(their_arch["cifar_stem"])
    their_arch["backbone_kwargs"] = dict(their_arch["backbone_kwargs"] or {})
    if their_arch["backbone"] is not None and own_arch["backbone"] is not None and own_arch != their_arch:
        diff = ", ".join(f"{k}: checkpoint {their_arch[k]!r} vs configured {own_arch[k]!r}" for k in _ARCH_KEYS if own_arch[k] != their_arch[k])
        return f"the checkpoint's encoder differs from the configured one ({diff})"
    return None


def check_checkpoint(module: Any, checkpoint: Mapping[str, Any], source: str = "the checkpoint") -> None:
    """Raise :class:`CheckpointMismatchError` naming both sides when ``checkpoint`` does not fit ``module``."""
    why = checkpoint_mismatch(type(module), getattr(module, "hparams", {}) or {}, checkpoint)
    if why is not None:
        raise CheckpointMismatchError(
            f"cannot load {source}: {why}. Use the config the checkpoint was trained with (it is saved as "
            "config.yaml next to the checkpoints folder), pick a checkpoint of this model, or take its matching "
            "weights only with --model.init_from <ckpt> (no optimiser state, epoch or hyper-parameters)."
        )
