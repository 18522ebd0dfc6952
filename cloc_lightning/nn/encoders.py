"""The one registry of image-encoder builders: how an encoder is rebuilt from a record, without pickled code.

A record names a builder and its JSON-like arguments, ``{"name": ..., "kwargs": {...}}``; the builder
returns a randomly initialised ``nn.Module`` whose ``state_dict`` then receives the stored weights.
Both places that rebuild an encoder go through :data:`ENCODER_BUILDERS`:

* :func:`cloc_lightning.checkpoints.build_encoder` (the stage-one encoder of ``cloc-lightning probe``,
  ``LinearProbeModule`` and the other linear stages) builds with ``"timm"``;
* :meth:`PrototypeClassifier.load <cloc_lightning.nn.prototype_classifier.PrototypeClassifier.load>`
  (an exported OrdinalCLIP classifier) builds with the name recorded in the file,
  ``"open_clip_visual"`` or ``"timm_projected"``.

Builders shipped here:

* ``"timm"``: a bare timm feature extractor, :func:`build_timm`
  (``backbone``, ``cifar_stem``, ``backbone_kwargs``, as a checkpoint records them);
* ``"timm_projected"``: a timm feature extractor followed by a projection to the CLIP width,
  :func:`build_timm_projected` (:class:`ProjectedEncoder`);
* ``"open_clip_visual"``: the visual tower of an open_clip architecture
  (:func:`~cloc_lightning.nn.clip.build_open_clip_visual`).

Add an encoder kind in one place, with :func:`register_encoder_builder`::

    @register_encoder_builder("my_encoder")
    def build_my_encoder(width: int) -> nn.Module: ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from cloc_lightning.nn.backbones import create_backbone, infer_feature_dim

__all__ = [
    "ENCODER_BUILDERS",
    "register_encoder_builder",
    "get_encoder_builder",
    "build_registered_encoder",
    "encoder_feature_dim",
    "build_timm",
    "ProjectedEncoder",
    "build_timm_projected",
]

#: Builders that re-create an image encoder's architecture from JSON-like kwargs (randomly
#: initialised; the weights come from the checkpoint or the export). Register your own with
#: :func:`register_encoder_builder`.
ENCODER_BUILDERS: dict[str, Callable[..., nn.Module]] = {}


def register_encoder_builder(name: str, builder: Callable[..., nn.Module] | None = None) -> Any:
    """Register ``builder(**kwargs) -> nn.Module`` under ``name`` (usable as a decorator).

    A name registered again is replaced by the new builder.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"an encoder builder needs a non-empty string name, got {name!r}")

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if not callable(fn):
            raise TypeError(f"the encoder builder {name!r} must be callable (kwargs -> nn.Module), got {type(fn).__name__}")
        ENCODER_BUILDERS[name] = fn
        return fn

    return deco(builder) if builder is not None else deco


def get_encoder_builder(name: Any, needed_by: str | None = None) -> Callable[..., nn.Module]:
    """The builder registered under ``name``; a clear error names the registered builders and the fix.

    Args:
        name: a name in :data:`ENCODER_BUILDERS`.
        needed_by: what asks for it (e.g. a file path), named in the error.

    Raises:
        ValueError: no builder is registered under ``name``.
    """
    builder = ENCODER_BUILDERS.get(name) if isinstance(name, str) else None
    if builder is None:
        what = (
            f"{needed_by} needs the encoder builder {name!r}, which is not registered" if needed_by else f"unknown encoder builder {name!r}"
        )
        raise ValueError(
            f"{what} (registered: {sorted(ENCODER_BUILDERS)}); import the module that registers it, or register it "
            f"with cloc_lightning.nn.encoders.register_encoder_builder({name!r}, builder)"
        )
    return builder


def build_registered_encoder(name: str, /, **kwargs: Any) -> nn.Module:
    """``ENCODER_BUILDERS[name](**kwargs)``: a randomly initialised encoder (see :func:`get_encoder_builder` for the error)."""
    return get_encoder_builder(name)(**kwargs)


def encoder_feature_dim(encoder: nn.Module) -> int:
    """The feature width of a built encoder: timm's ``num_features``, else found by a forward pass on 32 px images."""
    width = getattr(encoder, "num_features", None)
    if isinstance(width, int) and not isinstance(width, bool):
        return width
    return infer_feature_dim(encoder)


def build_timm(backbone: str, cifar_stem: bool = False, backbone_kwargs: dict[str, Any] | None = None) -> nn.Module:
    """Randomly initialised timm feature extractor (:func:`~cloc_lightning.nn.backbones.create_backbone` without weights).

    Registered as ``"timm"``, the builder of :func:`cloc_lightning.checkpoints.build_encoder`.  The
    module has timm's ``num_features`` (the feature width, :func:`encoder_feature_dim`).
    """
    net, _ = create_backbone(backbone, False, cifar_stem, **(backbone_kwargs or {}))
    return net


register_encoder_builder("timm", build_timm)


def _open_clip_visual(**kwargs: Any) -> nn.Module:
    from cloc_lightning.nn.clip import build_open_clip_visual

    return build_open_clip_visual(**kwargs)


register_encoder_builder("open_clip_visual", _open_clip_visual)


class ProjectedEncoder(nn.Module):
    """A feature extractor followed by a linear projection to the CLIP embedding width D.

    ``forward(x [B, 3, H, W]) -> [B, D]`` = ``proj(encoder(x))``: the image encoder of
    ``image_encoder: timm`` as one module, as exported (in
    :class:`~cloc_lightning.methods.ordinal_clip.OrdinalCLIPModule` the two parts are ``backbone``
    and ``image_proj``, so that ``backbone.*`` is a bare timm network like in every other module).  The reference replaces ``clip_model.visual`` by a torchvision network with
    ``num_classes=embed_dim`` the same way.

    Args:
        encoder: module mapping images to ``[B, F]`` features.
        in_features: F.
        embed_dim: D.
    """

    def __init__(self, encoder: nn.Module, in_features: int, embed_dim: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.proj = nn.Linear(in_features, embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, 3, H, W]`` → ``[B, D]``."""
        features: Tensor = self.proj(self.encoder(x))
        return features


def build_timm_projected(
    backbone: str, embed_dim: int, cifar_stem: bool = False, backbone_kwargs: dict[str, Any] | None = None
) -> ProjectedEncoder:
    """Randomly initialised ``ProjectedEncoder(timm backbone, Linear(F, embed_dim))``.

    Registered as ``"timm_projected"``, the builder an exported OrdinalCLIP classifier with
    ``image_encoder: timm`` records (weights come from the exported state dict).
    """
    net = build_timm(backbone, cifar_stem, backbone_kwargs)
    return ProjectedEncoder(net, encoder_feature_dim(net), embed_dim)


register_encoder_builder("timm_projected", build_timm_projected)
