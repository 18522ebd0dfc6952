"""The backbones (``cloc_lightning/nn/backbones.py``): unknown model names, and HalfSafeConv2d: float32 where
PyTorch's CPU bf16 convolution is wrong (one-pixel-wide strided outputs), nn.Conv2d elsewhere.

PyTorch 2.14's oneDNN bf16 convolution on CPU gives NaN or wrong weight gradients (and, for ``[*, *, 3, 1]``
inputs, wrong outputs) when a strided convolution's output is one pixel wide -- the 1x1 / 2x2 maps that
16 px crops reach in a ResNet's last stages.  The references here are float64 convolutions of the same
bf16-representable values; the tolerances are those of the bf16 roundings involved.
"""

from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.methods import CLOCModule, OrdinalCLIPModule
from cloc_lightning.nn.backbones import HalfSafeConv2d, create_backbone, use_half_safe_convs

BF16_EPS = 2.0**-8  # bf16 keeps 8 significant bits: one rounding is within 2**-9 relative, two within 2**-8

#: (input [H, W], kernel, stride, padding): one-pixel-wide outputs (taken in float32) and a larger map (kept in bf16)
CASES = [((1, 1), 3, 2, 1), ((2, 2), 3, 2, 1), ((3, 1), 3, 2, 1), ((2, 1), (1, 3), 2, (0, 1)), ((1, 1), 7, 2, 3)]


def _bf16_values(*shape: int, generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Normal values times ``scale``, rounded to bf16 and held in float32 (exactly representable in both)."""
    return (torch.randn(*shape, generator=generator) * scale).bfloat16().float()


def _reference(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: int, padding: int | tuple[int, int]):
    """Output, weight and input gradients of ``conv2d(x, w)`` under output gradient ``g``, in float64."""
    xd, wd = x.double().requires_grad_(True), w.double().requires_grad_(True)
    y = F.conv2d(xd, wd, stride=stride, padding=padding)
    y.backward(g.double())
    return y.detach(), wd.grad, xd.grad


def _close(value: torch.Tensor, ref: torch.Tensor, rel: float) -> bool:
    value = value.double()
    return bool(torch.isfinite(value).all()) and float((value - ref).abs().max()) <= rel * float(ref.abs().max()) + 1e-12


@pytest.mark.parametrize("mode", ["bf16-autocast", "bf16-weights"])
@pytest.mark.parametrize("size, kernel, stride, padding", CASES)
def test_one_pixel_wide_outputs_match_float64(size, kernel, stride, padding, mode: str) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(8):  # the plain kernel is wrong in most calls of these shapes; every call must be right
        conv = HalfSafeConv2d(48, 64, kernel, stride=stride, padding=padding, bias=False)
        w = _bf16_values(*conv.weight.shape, generator=gen, scale=0.1)
        x = _bf16_values(32, 48, *size, generator=gen)
        if mode == "bf16-autocast":  # bf16-mixed: float32 weights and inputs, autocast
            conv.weight.data.copy_(w)
            leaf = x.clone().requires_grad_(True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = conv(leaf)
        else:  # bf16-true: bf16 weights and inputs
            conv = conv.bfloat16()
            conv.weight.data.copy_(w.bfloat16())
            leaf = x.bfloat16().requires_grad_(True)
            y = conv(leaf)
        assert y.dtype == torch.bfloat16  # what the half convolution returns
        g = torch.randn(y.shape, generator=gen).bfloat16()
        y.backward(g)
        ref_y, ref_gw, ref_gx = _reference(x, w, g.float(), stride, padding)
        # the output is a float32 sum rounded once to bf16; float32 gradients (autocast) are sums of exact
        # products, bf16 gradients (bf16 weights) are rounded once more
        grad_rel = 1e-5 if mode == "bf16-autocast" else BF16_EPS
        assert _close(y.detach(), ref_y, BF16_EPS)
        assert _close(conv.weight.grad, ref_gw, grad_rel)
        assert _close(leaf.grad, ref_gx, grad_rel)


def test_elsewhere_it_is_nn_conv2d_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(1)
    plain = nn.Conv2d(8, 16, 3, stride=2, padding=1)
    safe = copy.deepcopy(plain)
    safe.__class__ = HalfSafeConv2d
    for x, autocast in [
        (torch.randn(4, 8, 1, 1, generator=gen), False),  # float32: no change, even on a 1x1 map
        (torch.randn(4, 8, 8, 8, generator=gen), True),  # bf16 autocast on a larger map: the half kernel
        (torch.randn(4, 8, 1, 1, generator=gen).double(), False),  # float64
    ]:
        outs, grads = [], []
        for conv in (plain, safe):
            conv.zero_grad()
            conv.to(x.dtype)
            leaf = x.clone().requires_grad_(True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = conv(leaf)
            y.float().sum().backward()
            outs.append(y.detach())
            grads.append((leaf.grad, conv.weight.grad, conv.bias.grad))
        assert outs[0].dtype == outs[1].dtype and torch.equal(outs[0], outs[1])
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_create_backbone_switches_the_strided_convolutions_only() -> None:
    torch.manual_seed(0)
    model, _ = create_backbone("test_resnet")
    torch.manual_seed(0)
    plain = timm.create_model("test_resnet", num_classes=0)
    convs = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    switched = {n for n, m in convs if type(m) is HalfSafeConv2d}
    strided = {n for n, m in convs if any(k > 1 and s > 1 for k, s in zip(m.kernel_size, m.stride, strict=True))}
    assert switched == strided and switched
    assert model.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values(), strict=True))
    assert type(copy.deepcopy(model).get_submodule(sorted(switched)[0])) is HalfSafeConv2d  # an EMA target copy keeps it
    assert use_half_safe_convs(model) == 0  # idempotent
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(model(x), plain(x))  # float32: the same network


def test_test_resnet_on_16px_crops_has_finite_bf16_gradients() -> None:
    """The ReLIC case: 16 px crops through test_resnet reach 2x2 and 1x1 maps; bf16 autocast gradients stay finite."""
    torch.manual_seed(0)
    model, _ = create_backbone("test_resnet")
    reference = copy.deepcopy(model).double()
    x = torch.randn(32, 3, 16, 16).bfloat16().float()
    for _ in range(4):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().square().mean().backward()
        assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    reference(x.double()).square().mean().backward()
    last = [n for n, m in model.named_modules() if type(m) is HalfSafeConv2d][-1] + ".weight"
    got, want = model.get_parameter(last).grad.double(), reference.get_parameter(last).grad
    # bf16 activations through the network: the last stage's weight gradient within a few bf16 roundings
    assert float((got - want).abs().max()) <= 0.1 * float(want.abs().max())


# ---------------------------------------------------------------- unknown model names
def test_unknown_timm_and_open_clip_model_names() -> None:
    from cloc_lightning.nn.backbones import create_backbone
    from cloc_lightning.nn.clip import load_clip

    with pytest.raises(ValueError, match=r"Unknown timm backbone 'resnet181'.*'resnet18'"):
        create_backbone("resnet181")
    with pytest.raises(ValueError, match=r"Unknown timm backbone 'resnet181'"):
        CLOCModule(num_classes=4, backbone="resnet181")
    with pytest.raises(ValueError, match=r"Unknown open_clip model name 'ViT-B-322'.*'ViT-B-32'"):
        load_clip("ViT-B-322", None)
    with pytest.raises(ValueError, match=r"Unknown open_clip model name 'ViT-B-322'"):
        OrdinalCLIPModule(num_classes=4, clip_model="ViT-B-322")
