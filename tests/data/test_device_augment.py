"""The batched device augmentation (:mod:`cloc_lightning.data.device_augment`) against torchvision's v2 pipelines.

Every reference here is torchvision itself or a formula written in this file, never the code under test:

* RandomResizedCrop boxes: area fraction, log aspect and box centre against ``v2.RandomResizedCrop.make_params``
  (two-sample KS, N = 2,000, fixed seeds) on square, wide, tall and tiny images, with negative controls for the
  power; the centre-crop fallback (its frequency and its boxes); pad-crop offsets; boxes mapped onto a smaller
  stored image land on the same pixels (a ramp image); a crop that touches the edge of a stored image smaller
  than its slot reads the image's edge, never the slot's padding.
* Rates of flip, jitter, grayscale, blur and solarize (binomial tests against p), independent across views and
  purposes (chi-square); blur sigma against ``v2.GaussianBlur.make_params`` (KS).
* ColorJitter: each factor against ``v2.ColorJitter.make_params`` (KS); the order of the four operations
  uniform over the 24 permutations (chi-square) and drawn per sample (kornia draws one per batch).
* The batched ops against torchvision's functional ops with per-sample factors (1e-5), and the whole colour
  chain of :meth:`DeviceAugment.apply` against a per-sample chain of torchvision's functional ops in each
  sample's own order.
* Output statistics of whole pipelines: per-image per-channel means and standard deviations and a gradient
  energy of the device views from a stored batch against ``SupConViews.build`` / ``MultiCropViews.build`` on the
  *original* images (KS, and Welch's t on the log gradient energy; Bonferroni over a view's 8 tests at 0.01),
  on synthetic images here and on UTKFace faces in the slow real-data tier; a store too small for the crops
  (72 px for 64 px crops with scale 0.2) is the negative control the gradient-energy test must reject.
* Determinism: a sample's parameters depend on (seed, epoch, index, view) alone.
* Evaluation: :func:`eval_images` on the stored batch equals ``eval_transform`` on the files.

Known differences these tests do not resolve at their sample sizes (measured with the same parameters on both
paths, 2026-11-29): torchvision's ``uint8`` colour ops truncate, so its views are ~1.2/255 darker than the float
device path; roi_align's area filter is sharper than torchvision's antialiased (triangle) resize, +5 % gradient
energy on the synthetic images, +10 % on 200 px faces from a lossless store.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from cloc_lightning.data.cache import StoreLayout, fit_store_size, store_image
from cloc_lightning.data.device_augment import (
    DeviceAugment,
    ViewSpec,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    eval_images,
    gaussian_blur,
    grayscale,
    pad_crop,
    rrc_boxes,
)
from cloc_lightning.data.transforms import IMAGENET_MEAN, IMAGENET_STD, MultiCropViews, SupConViews, ViewTransform, eval_transform
from tests.conftest import UTKFACE, needs


def _crops(views: ViewTransform, size: int) -> list[tuple[int, float, float]]:
    """The rule's inputs per view: output size, min crop area, narrowest crop aspect."""
    return [(s.size, s.scale[0], min(s.ratio[0], 1 / s.ratio[1])) for s in views.device_specs(size)]


ALPHA = 0.01
RATIO = (3 / 4, 4 / 3)


# ---------------------------------------------------------------------------------------------------
# helpers: draws from torchvision (the reference) and from the device path
# ---------------------------------------------------------------------------------------------------
def _tv_draws(transform: v2.Transform, image_hw: tuple[int, int], n: int, seed: int) -> list[dict]:
    """``n`` parameter draws of a torchvision v2 transform for an image of ``image_hw``, from a seeded generator."""
    image = tv_tensors.Image(torch.zeros(3, *image_hw, dtype=torch.uint8))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return [transform.make_params([image]) for _ in range(n)]


def _tv_boxes(hw: tuple[int, int], scale: tuple[float, float], n: int, seed: int, ratio: tuple[float, float] = RATIO) -> np.ndarray:
    """``[n, 4]`` (top, left, height, width) boxes of ``v2.RandomResizedCrop``."""
    draws = _tv_draws(v2.RandomResizedCrop(8, scale=scale, ratio=ratio, antialias=True), hw, n, seed)
    return np.array([[d["top"], d["left"], d["height"], d["width"]] for d in draws], dtype=np.float64)


def _draw(
    specs: Sequence[ViewSpec],
    n: int,
    hw: tuple[int, int] = (64, 64),
    seed: int = 0,
    epoch: int = 0,
    stored_hw: tuple[int, int] | None = None,
    index: np.ndarray | None = None,
) -> dict[str, torch.Tensor]:
    aug = DeviceAugment(specs, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), seed=seed)
    index = np.arange(n) if index is None else index
    native = np.tile(hw, (len(index), 1))
    stored = native if stored_hw is None else np.tile(stored_hw, (len(index), 1))
    return aug.draw(index, np.full(len(index), epoch), native, stored)


def _device_boxes(hw: tuple[int, int], scale: tuple[float, float], n: int, seed: int, ratio: tuple[float, float] = RATIO) -> np.ndarray:
    """``[n, 4]`` (top, left, height, width) boxes of the device path, drawn in the native pixels (stored = native)."""
    b = _draw([ViewSpec(8, "rrc", scale=scale, ratio=ratio, flip_p=0.0)], n, hw, seed)["g0_boxes"][:, 1:].double().numpy()
    return np.column_stack([b[:, 1], b[:, 0], b[:, 3] - b[:, 1], b[:, 2] - b[:, 0]])


def _jitter_rows(params: dict[str, torch.Tensor], g: int, n: int) -> np.ndarray:
    """``[n, 4]`` each row's colour-op order from the draw's row lists (-1 where jitter is off or the op inactive)."""
    order = np.full((n, 4), -1)
    for pos, op in itertools.product(range(4), range(4)):
        order[params[f"g{g}_jit{pos}{op}"].numpy(), pos] = op
    return order


def _ks(x: np.ndarray, y: np.ndarray) -> float:
    return float(stats.ks_2samp(x, y).pvalue)


# ---------------------------------------------------------------------------------------------------
# 1. RandomResizedCrop boxes
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "hw, scale",
    [((200, 200), (0.08, 1.0)), ((120, 300), (0.2, 1.0)), ((300, 120), (0.08, 1.0)), ((32, 32), (0.2, 1.0))],
    ids=["200x200", "120x300", "300x120", "32x32"],
)
def test_rrc_boxes_match_torchvision(hw: tuple[int, int], scale: tuple[float, float]) -> None:
    n, (H, W) = 2000, hw
    ref, dev = _tv_boxes(hw, scale, n, seed=1), _device_boxes(hw, scale, n, seed=2)
    for boxes in (ref, dev):  # every box lies inside the image
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
        assert (boxes[:, 0] + boxes[:, 2] <= H).all() and (boxes[:, 1] + boxes[:, 3] <= W).all()
    measures = {
        "area fraction": lambda b: b[:, 2] * b[:, 3] / (H * W),
        "log aspect": lambda b: np.log(b[:, 3] / b[:, 2]),
        "centre y": lambda b: (b[:, 0] + b[:, 2] / 2) / H,
        "centre x": lambda b: (b[:, 1] + b[:, 3] / 2) / W,
    }
    pvalues = {name: _ks(f(ref), f(dev)) for name, f in measures.items()}
    assert all(p > ALPHA for p in pvalues.values()), pvalues


def test_rrc_ks_detects_a_wrong_sampler() -> None:
    """The KS tests above have the power to see plausible sampler bugs at N = 2,000 (negative controls).

    The same box sampler (``rrc_boxes``: tries, rounding, fallback) fed uniforms that make the aspect uniform
    instead of log-uniform, or the crop's side instead of its area uniform.
    """
    n, (H, W), scale = 2000, (200, 200), (0.08, 1.0)
    ref = _tv_boxes((H, W), scale, n, seed=1)
    u = np.random.default_rng(0).random((n, 22))
    lo, hi = math.log(RATIO[0]), math.log(RATIO[1])
    aspect_linear = u.copy()
    aspect_linear[:, 10:20] = (np.log(RATIO[0] + (RATIO[1] - RATIO[0]) * u[:, 10:20]) - lo) / (hi - lo)
    side_uniform = u.copy()
    side_uniform[:, :10] = ((math.sqrt(scale[0]) + (1 - math.sqrt(scale[0])) * u[:, :10]) ** 2 - scale[0]) / (1 - scale[0])
    hh, ww = np.full(n, H), np.full(n, W)
    _, _, h, w = rrc_boxes(hh, ww, scale, RATIO, aspect_linear)
    assert _ks(np.log(ref[:, 3] / ref[:, 2]), np.log(w / h)) < 1e-4
    _, _, h, w = rrc_boxes(hh, ww, scale, RATIO, side_uniform)
    assert _ks(ref[:, 2] * ref[:, 3], h * w) < 1e-4
    _, _, h, w = rrc_boxes(hh, ww, scale, RATIO, u)  # the right uniforms pass
    assert _ks(np.log(ref[:, 3] / ref[:, 2]), np.log(w / h)) > ALPHA and _ks(ref[:, 2] * ref[:, 3], h * w) > ALPHA


def test_rrc_fallback_matches_torchvision() -> None:
    """The centre-crop fallback after 10 failed tries: how often (40 x 400 px), and the boxes (always, 20 x 400 px)."""
    n, H, W = 2000, 40, 400
    ref, dev = _tv_boxes((H, W), (0.08, 1.0), n, seed=3), _device_boxes((H, W), (0.08, 1.0), n, seed=4)
    h_fb = H
    w_fb = round(H * RATIO[1])  # wider than the ratio range: full height, the widest allowed aspect
    fallback = np.array([(H - h_fb) // 2, (W - w_fb) // 2, h_fb, w_fb], dtype=np.float64)
    ref_fb, dev_fb = (ref == fallback).all(1), (dev == fallback).all(1)
    table = np.array([[ref_fb.sum(), n - ref_fb.sum()], [dev_fb.sum(), n - dev_fb.sum()]])
    assert 0.5 < ref_fb.mean() < 0.95, ref_fb.mean()  # the case does exercise the fallback, and the tries
    assert stats.fisher_exact(table).pvalue > ALPHA, table
    found_ref, found_dev = ref[~ref_fb], dev[~dev_fb]
    assert _ks(found_ref[:, 2] * found_ref[:, 3], found_dev[:, 2] * found_dev[:, 3]) > ALPHA
    assert _ks(found_ref[:, 3] / found_ref[:, 2], found_dev[:, 3] / found_dev[:, 2]) > ALPHA
    # no box fits in 10 tries: every box is the centre crop, for wide and tall images alike
    for (H, W), box in (((20, 400), [0, (400 - 27) // 2, 20, 27]), ((400, 20), [(400 - 27) // 2, 0, 27, 20])):
        ref, dev = _tv_boxes((H, W), (0.08, 1.0), 200, seed=5), _device_boxes((H, W), (0.08, 1.0), 200, seed=6)
        assert (ref == box).all() and (dev == box).all()


def test_pad_crop_offsets_match_torchvision() -> None:
    """``RandomCrop(size, padding)``: (top, left) uniform over the (2 padding + 1)^2 positions, as torchvision draws them."""
    n, size, padding = 2500, 16, 2
    dev = _draw([ViewSpec(size, "pad_crop", padding=padding)], n, (size, size), seed=8)["g0_offsets"].numpy()
    ref = _tv_draws(v2.RandomCrop(size, padding=padding, padding_mode="reflect"), (size, size), n, seed=9)
    ref = np.array([[d["top"], d["left"]] for d in ref])
    cells = 2 * padding + 1
    counts = [np.bincount(o[:, 0] * cells + o[:, 1], minlength=cells * cells) for o in (dev, ref)]
    assert len(counts[0]) == cells * cells  # no offset outside [0, 2 padding]
    assert stats.chisquare(counts[0]).pvalue > ALPHA, counts[0]
    assert stats.chi2_contingency(np.stack(counts)).pvalue > ALPHA, counts


def _ramp(H: int, W: int) -> torch.Tensor:
    """``uint8 [3, H, W]``: red rises left to right, green top to bottom, blue along the diagonal (pixel centres)."""
    x = (torch.arange(W, dtype=torch.float64) + 0.5) / W
    y = (torch.arange(H, dtype=torch.float64) + 0.5) / H
    X, Y = torch.meshgrid(x, y, indexing="xy")
    return (torch.stack([X, Y, (X + Y) / 2]) * 255).round().to(torch.uint8)


@pytest.mark.parametrize(
    "layout, stored_hw", [(StoreLayout("fit", 150), (60, 150)), (StoreLayout("resize", 96), (96, 96))], ids=["fit", "resize"]
)
def test_rrc_boxes_map_onto_a_smaller_stored_image(layout: StoreLayout, stored_hw: tuple[int, int]) -> None:
    """Boxes drawn in the original's pixels, cut from a smaller store (by 2, or by 1.25 and 3.1 per axis), sample the original's positions.

    A linear ramp survives every linear resampling, so each output pixel must equal the ramp at the native
    position its centre maps to (``align_corners=False``: ``left + (j + 0.5) * w / size - 0.5``), to the store's
    ``uint8`` rounding; a box misplaced by half a stored pixel is off by 1.1-2.1 levels here.
    """
    H, W, size, n = 120, 300, 32, 64
    image = _ramp(H, W)
    slot, native, stored = store_image(image, layout)
    assert native == (H, W) and stored == stored_hw and slot.shape == (3, layout.size, layout.size)
    aug = DeviceAugment([ViewSpec(size, "rrc", scale=(0.08, 1.0), flip_p=0.0)], (0, 0, 0), (1, 1, 1), seed=7)
    index = np.arange(n)
    params = aug.draw(index, np.zeros(n), np.tile(native, (n, 1)), np.tile(stored, (n, 1)))
    out = aug.apply(slot.expand(n, -1, -1, -1).contiguous(), params)[0].double() * 255
    native_boxes = _device_boxes((H, W), (0.08, 1.0), n, seed=7)  # the same draws, in native pixels
    j = torch.arange(size, dtype=torch.float64) + 0.5
    errors = []
    for k, (top, left, h, w) in enumerate(native_boxes):
        xs, ys = left + j * w / size - 0.5, top + j * h / size - 0.5
        # interior: the store's filter (2 px) and the crop's own footprint (half a bin) inside the image
        mx, my = 0.5 * w / size + 4, 0.5 * h / size + 4
        ok_x, ok_y = (xs >= mx) & (xs <= W - 1 - mx), (ys >= my) & (ys <= H - 1 - my)
        X, Y = torch.meshgrid((xs + 0.5) / W, (ys + 0.5) / H, indexing="xy")
        expected = torch.stack([X, Y, (X + Y) / 2]) * 255
        mask = (ok_y.view(-1, 1) & ok_x.view(1, -1)).expand(3, -1, -1)
        if mask.any():
            errors.append((out[k] - expected)[mask].abs().max().item())
    assert len(errors) > n // 2
    assert max(errors) < 1.1, max(errors)


def test_rrc_crop_at_the_stored_edge_does_not_see_the_slot_padding() -> None:
    """A constant image stays constant under any crop, as torchvision's crop of the original does."""
    image = torch.full((3, 120, 300), 200, dtype=torch.uint8)
    slot, native, stored = store_image(image, StoreLayout("fit", 150))
    n = 500
    aug = DeviceAugment([ViewSpec(64, "rrc", scale=(0.08, 1.0), flip_p=0.0)], (0, 0, 0), (1, 1, 1), seed=0)
    params = aug.draw(np.arange(n), np.zeros(n), np.tile(native, (n, 1)), np.tile(stored, (n, 1)))
    out = aug.apply(slot.expand(n, -1, -1, -1).contiguous(), params)[0] * 255
    assert (out - 200).abs().max().item() < 1e-3, f"darkest crop pixel {out.min().item():.1f} of a constant 200"


# ---------------------------------------------------------------------------------------------------
# 2. rates of the random decisions
# ---------------------------------------------------------------------------------------------------
RATES_SPEC = ViewSpec(
    16, "rrc", flip_p=0.3, jitter=(0.4, 0.4, 0.4, 0.1), jitter_p=0.8, grayscale_p=0.2, blur_kernel=3, blur_p=0.5, solarize_p=0.2
)


def test_rates_are_binomial_with_p_and_independent() -> None:
    n = 4000
    specs = [RATES_SPEC, RATES_SPEC]
    params = _draw(specs, n, seed=11)
    rows = 2 * n  # one group of two views, view-major
    decisions = {
        "flip": (params["g0_flip"].numpy(), 0.3),
        "jitter": ((_jitter_rows(params, 0, rows) >= 0).any(1), 0.8),
        "grayscale": (params["g0_gray"].numpy(), 0.2),
        "blur": (np.isin(np.arange(rows), params["g0_blur_rows"].numpy()), 0.5),
        "solarize": (params["g0_solarize"].numpy(), 0.2),
    }
    pvalues = {}
    for name, (hit, p) in decisions.items():
        assert hit.shape == (rows,)
        for view in range(2):
            pvalues[f"{name} v{view}"] = stats.binomtest(int(hit[view * n : (view + 1) * n].sum()), n, p).pvalue
    assert min(pvalues.values()) > ALPHA, pvalues
    # independent across views of one sample and across the decisions of one view (2 x 2 chi-square)
    names = list(decisions)
    pairs = [(decisions[a][0][:n], decisions[a][0][n:]) for a in names]  # view 0 against view 1
    pairs += [(decisions[a][0], decisions[b][0]) for a, b in itertools.combinations(names, 2)]
    for a, b in pairs:
        table = np.array([[(a & b).sum(), (a & ~b).sum()], [(~a & b).sum(), (~a & ~b).sum()]])
        assert stats.chi2_contingency(table).pvalue > ALPHA / len(pairs), table
    # a different p is honoured, not a constant
    other = _draw([ViewSpec(16, "rrc", flip_p=0.7, grayscale_p=0.05)], n, seed=12)
    assert stats.binomtest(int(other["g0_flip"].sum()), n, 0.7).pvalue > ALPHA
    assert stats.binomtest(int(other["g0_gray"].sum()), n, 0.05).pvalue > ALPHA


def test_blur_sigma_matches_torchvision() -> None:
    n = 2000
    params = _draw([RATES_SPEC], n, seed=13)
    dev = params["g0_blur_sigma"].double().numpy()
    ref = np.array([d["sigma"][0] for d in _tv_draws(v2.GaussianBlur(3, sigma=(0.1, 2.0)), (16, 16), n, seed=14)])
    assert dev.min() >= 0.1 and dev.max() <= 2.0
    assert _ks(dev, ref) > ALPHA


# ---------------------------------------------------------------------------------------------------
# 3. ColorJitter: factors and the per-sample order
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("jitter", [(0.4, 0.4, 0.4, 0.1), (0.8, 0.8, 0.8, 0.2), (1.5, 0.0, 0.3, 0.5)], ids=["supcon", "relic", "mixed"])
def test_jitter_factors_match_torchvision(jitter: tuple[float, float, float, float]) -> None:
    n = 2000
    params = _draw([ViewSpec(16, "rrc", jitter=jitter, jitter_p=1.0)], n, seed=21)
    dev = params["g0_factors"].double().numpy()
    ref = _tv_draws(v2.ColorJitter(*jitter), (16, 16), n, seed=22)
    order = _jitter_rows(params, 0, n)
    for op, key in enumerate(("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")):
        if jitter[op] == 0:  # torchvision skips the op (factor None); the device leaves it out of every order
            assert all(d[key] is None for d in ref)
            assert not (order == op).any()
            continue
        lo, hi = (max(0.0, 1 - jitter[op]), 1 + jitter[op]) if op < 3 else (-jitter[op], jitter[op])
        assert dev[:, op].min() >= lo and dev[:, op].max() <= hi
        p = _ks(dev[:, op], np.array([d[key] for d in ref]))
        assert p > ALPHA, (key, p)


def test_jitter_order_uniform_over_permutations_and_per_sample() -> None:
    n = 4800
    params = _draw([ViewSpec(16, "rrc", jitter=(0.4, 0.4, 0.4, 0.1), jitter_p=1.0)], n, seed=23)
    order = _jitter_rows(params, 0, n)
    assert (np.sort(order, axis=1) == np.arange(4)).all()  # each row: a permutation of the four ops
    perms = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.bincount([perms[tuple(r)] for r in order], minlength=24)
    assert stats.chisquare(counts).pvalue > ALPHA, counts
    # torchvision: one randperm per sample; so is the device's order, within any one batch (kornia: one per batch)
    ref = np.array([d["fn_idx"].tolist() for d in _tv_draws(v2.ColorJitter(0.4, 0.4, 0.4, 0.1), (16, 16), 64, seed=24)])
    for batch in (order[:64], ref):
        assert len({tuple(r) for r in batch}) >= 12  # 22.5 distinct orders expected in 64 draws
    # the position of each op is independent of its factor
    factors = params["g0_factors"].numpy()
    first = order[:, 0]
    assert _ks(factors[first == 0, 0], factors[first != 0, 0]) > ALPHA


# ---------------------------------------------------------------------------------------------------
# 4. the batched ops against torchvision's functional ops, per sample
# ---------------------------------------------------------------------------------------------------
def _float_images(n: int, H: int, W: int, seed: int) -> torch.Tensor:
    """Float images in [0, 1] with the HSV corner cases: gray pixels, 0 and 1, ties between channels, 8-bit values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, H, W, generator=g)
    x[0] = x[0, :1]  # gray
    x[1, :, :2] = 0.0
    x[1, :, 2:4] = 1.0
    x[1, 0, 4:6] = 1.0  # saturated red rows
    x[2, 1] = x[2, 0]  # red == green
    x[3] = (x[3] * 255).round() / 255
    x[4, 2] = x[4, 0]  # red == blue
    return x


def _per_sample(fn, x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    return torch.stack([fn(x[i], float(factors[i])) for i in range(len(x))])


@pytest.mark.parametrize(
    "device_op, tv_op, lo, hi",
    [
        (adjust_brightness, TF.adjust_brightness, 0.0, 2.0),
        (adjust_contrast, TF.adjust_contrast, 0.0, 2.5),
        (adjust_saturation, TF.adjust_saturation, 0.0, 2.5),
        (adjust_hue, TF.adjust_hue, -0.5, 0.5),
    ],
    ids=["brightness", "contrast", "saturation", "hue"],
)
def test_colour_ops_match_torchvision(device_op, tv_op, lo: float, hi: float) -> None:
    n = 12
    x = _float_images(n, 17, 23, seed=31)
    g = torch.Generator().manual_seed(32)
    f = lo + (hi - lo) * torch.rand(n, generator=g)
    f[:3] = torch.tensor([lo, hi, 1.0 if lo >= 0 else 0.0])
    out = device_op(x.clone(), f.view(-1, 1, 1, 1))
    ref = _per_sample(tv_op, x, f)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_grayscale_matches_torchvision() -> None:
    x = _float_images(6, 9, 11, seed=33)
    torch.testing.assert_close(grayscale(x), TF.rgb_to_grayscale(x, num_output_channels=1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("kernel", [3, 5, 9])
def test_gaussian_blur_matches_torchvision(kernel: int) -> None:
    n = 8
    x = _float_images(n, 20, 24, seed=34)
    sigma = torch.linspace(0.1, 2.0, n)
    out = gaussian_blur(x, sigma, kernel)
    ref = torch.stack([TF.gaussian_blur(x[i], [kernel, kernel], [float(sigma[i])] * 2) for i in range(n)])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("size, padding", [(16, 2), (12, 4), (32, 4)])
def test_pad_crop_matches_torchvision(size: int, padding: int) -> None:
    offsets = torch.tensor(list(itertools.product(range(2 * padding + 1), repeat=2)))
    x = _float_images(len(offsets), size, size, seed=35)
    out = pad_crop(x, offsets, size, padding)
    for i, (top, left) in enumerate(offsets.tolist()):
        ref = TF.pad(x[i], [padding], padding_mode="reflect")[:, top : top + size, left : left + size]
        assert torch.equal(out[i], ref)


def test_apply_colour_chain_matches_torchvision_per_sample() -> None:
    """:meth:`DeviceAugment.apply` with every colour op against torchvision's functional ops, per sample and view.

    Each sample's own flip, jitter order and factors, grayscale, blur sigma and solarize decision, read from the
    draw, are applied with torchvision's ops on the float image; two equal specs make one group of two views.
    """
    n, size = 48, 24
    spec = ViewSpec(
        size,
        "resize",
        flip_p=0.5,
        jitter=(0.8, 0.8, 0.8, 0.2),
        jitter_p=0.8,
        grayscale_p=0.2,
        blur_kernel=5,
        blur_p=0.5,
        solarize_p=0.2,
        solarize_threshold=128.0,
    )
    aug = DeviceAugment([spec, spec], (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), seed=41)
    images = (_float_images(n, size, size, seed=42) * 255).round().to(torch.uint8)
    hw = np.tile([size, size], (n, 1))
    params = aug.draw(np.arange(n), np.zeros(n), hw, hw)
    views = aug.apply(images, params)
    order = _jitter_rows(params, 0, 2 * n)
    factors = params["g0_factors"]
    sigma = dict(zip(params["g0_blur_rows"].tolist(), params["g0_blur_sigma"].tolist(), strict=True))
    tv_ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    assert len(sigma) > 0 and (order[:, 0] >= 0).any() and params["g0_gray"].any() and params["g0_solarize"].any()
    for v in range(2):
        for i in range(n):
            r = v * n + i
            x = images[i].float() / 255
            if params["g0_flip"][r]:
                x = TF.horizontal_flip(x)
            for op in order[r]:
                if op >= 0:
                    x = tv_ops[op](x, float(factors[r, op]))
            if params["g0_gray"][r]:
                x = TF.rgb_to_grayscale(x, num_output_channels=3)
            if r in sigma:
                x = TF.gaussian_blur(x, [5, 5], [sigma[r], sigma[r]])
            if params["g0_solarize"][r]:
                x = TF.solarize(x, 128 / 255)
            torch.testing.assert_close(views[v][i], x, atol=2e-5, rtol=0, msg=lambda m, v=v, i=i: f"view {v} sample {i}: {m}")


# ---------------------------------------------------------------------------------------------------
# 5. output statistics of whole pipelines: device views of a stored batch vs torchvision on the originals
# ---------------------------------------------------------------------------------------------------
def _bicubic_matrix(cells: int, size: int) -> torch.Tensor:
    """``[size, cells + 1]``: torch's bicubic upsampling (``align_corners=True``) of ``cells + 1`` samples, as a matrix."""
    basis = torch.eye(cells + 1).view(cells + 1, 1, cells + 1, 1)
    return F.interpolate(basis, size=(size, 1), mode="bicubic", align_corners=True)[:, 0, :, 0].T


def synthetic_images(n: int, H: int, W: int, seed: int) -> torch.Tensor:
    """``uint8 [n, 3, H, W]`` natural-ish images: a 1/f sum of smooth colour fields, three straight edges, sensor noise."""
    g = torch.Generator().manual_seed(seed)
    low = torch.zeros(n, 3, 33, 33)  # octaves of 2-32 cells summed on a 33 x 33 grid, then one bicubic upsampling
    for cells, amp in ((2, 0.2), (4, 0.15), (8, 0.1), (16, 0.05), (32, 0.025)):
        low += _bicubic_matrix(cells, 33) @ (torch.randn(n, 3, cells + 1, cells + 1, generator=g) * amp) @ _bicubic_matrix(cells, 33).T
    x = _bicubic_matrix(32, H) @ low @ _bicubic_matrix(32, W).T
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, H), torch.linspace(-1, 1, W), indexing="ij")
    for _ in range(3):
        angle = torch.rand(n, 1, 1, generator=g) * 2 * math.pi
        offset = (torch.rand(n, 1, 1, generator=g) - 0.5) * 1.2
        colour = (torch.rand(n, 3, 1, 1, generator=g) - 0.5) * 0.5
        x.addcmul_((xx * angle.cos() + yy * angle.sin() > offset).unsqueeze(1), colour)
    x.add_(torch.randn(n, 3, H, W, generator=g), alpha=0.02).add_(0.5 + (torch.rand(n, 3, 1, 1, generator=g) - 0.5) * 0.3)
    return x.clamp_(0, 1).mul_(255).round_().to(torch.uint8)


def image_statistics(views: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> dict[str, np.ndarray]:
    """Per image: each channel's mean and standard deviation, and the gradient energy (mean squared neighbour difference)."""
    x = views * torch.tensor(std).view(1, 3, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1)
    out = {f"mean {c}": x[:, i].mean(dim=(1, 2)).numpy() for i, c in enumerate("RGB")}
    out.update({f"std {c}": x[:, i].std(dim=(1, 2)).numpy() for i, c in enumerate("RGB")})
    dy, dx = x[..., 1:, :] - x[..., :-1, :], x[..., :, 1:] - x[..., :, :-1]
    out["gradient energy"] = ((dy**2).mean(dim=(1, 2, 3)) + (dx**2).mean(dim=(1, 2, 3))).numpy()
    return {k: v.astype(np.float64) for k, v in out.items()}


def device_views(views: ViewTransform, size: int, images: Sequence[torch.Tensor], store_size: int, seed: int) -> list[torch.Tensor]:
    """The views of the device path: the images stored in the fit layout at ``store_size``, augmented as one batch."""
    stored = [store_image(im, StoreLayout("fit", store_size)) for im in images]
    slots = torch.stack([s[0] for s in stored])
    native, stored_hw = np.array([s[1] for s in stored]), np.array([s[2] for s in stored])
    aug = DeviceAugment(views.device_specs(size), IMAGENET_MEAN, IMAGENET_STD, seed=seed)
    n = len(images)
    return aug.apply(slots, aug.draw(np.arange(n), np.zeros(n, dtype=np.int64), native, stored_hw))


def torchvision_views(views: ViewTransform, size: int, images: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """The loader path's views: ``views.build`` applied to each original image, from a seeded generator."""
    pipeline = views.build(size, IMAGENET_MEAN, IMAGENET_STD)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        per_image = [pipeline(im) for im in images]
    return [torch.stack([p[v] for p in per_image]) for v in range(len(per_image[0]))]


def compare_statistics(dev: list[torch.Tensor], ref: list[torch.Tensor]) -> dict[str, tuple[float, float]]:
    """``{"view v: test": (p-value, mean ratio device / torchvision)}``: 8 tests a view.

    KS on each channel's mean and standard deviation and on the gradient energy, and Welch's t-test on the log
    gradient energy (a lost resolution scales it: the t-test has far more power against that than KS).
    """
    out = {}
    for v, (d, r) in enumerate(zip(dev, ref, strict=True)):
        sd, sr = image_statistics(d, IMAGENET_MEAN, IMAGENET_STD), image_statistics(r, IMAGENET_MEAN, IMAGENET_STD)
        for name in sd:
            out[f"view {v}: {name} (KS)"] = (_ks(sd[name], sr[name]), float(sd[name].mean() / sr[name].mean()))
        # a view clamped flat by the jitter has no energy at all: a floor far below a textured view's (~3e-3)
        ge_d, ge_r = np.log(sd["gradient energy"] + 1e-5), np.log(sr["gradient energy"] + 1e-5)
        out[f"view {v}: log gradient energy (t)"] = (
            float(stats.ttest_ind(ge_d, ge_r, equal_var=False).pvalue),
            float(np.exp(ge_d.mean() - ge_r.mean())),
        )
    return out


def print_statistics(title: str, result: dict[str, tuple[float, float]]) -> None:
    """One line a test (``pytest -s`` shows them): its p-value and the device / torchvision ratio of the means."""
    for name, (p, ratio) in result.items():
        print(f"{title} | {name:34s} p={p:<9.3g} device/torchvision={ratio:.3f}")


def _per_test_alpha(result: dict[str, tuple[float, float]], n_views: int) -> float:
    return ALPHA / (len(result) // n_views)  # Bonferroni over a view's 8 tests


def assert_same_statistics(result: dict[str, tuple[float, float]], n_views: int) -> None:
    alpha = _per_test_alpha(result, n_views)
    failed = {k: v for k, v in result.items() if v[0] <= alpha}
    assert not failed, f"device statistics differ from torchvision's (p <= {alpha:.4f}): {failed}; all: {result}"


def assert_gradient_energy_loss_detected(result: dict[str, tuple[float, float]], n_views: int) -> None:
    """The negative control: the same check rejects every view, on the gradient energy, with a lower energy."""
    alpha = _per_test_alpha(result, n_views)
    energy = {k: v for k, v in result.items() if "gradient energy (t)" in k}
    assert len(energy) == n_views and all(p < alpha and ratio < 0.9 for p, ratio in energy.values()), energy


@pytest.fixture(scope="module")
def synthetic_128() -> list[torch.Tensor]:
    return list(synthetic_images(500, 128, 128, seed=51))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Per-image torchvision pipelines run several times faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_supcon_statistics_match_torchvision_on_synthetic_images(synthetic_128: list[torch.Tensor], one_thread: None) -> None:
    """SupConViews at 64 px from 128 px originals stored by the cache rule; a 72 px store must be caught."""
    size, images = 64, synthetic_128
    views = SupConViews()
    store = fit_store_size(_crops(views, size), 128)
    assert store == 128  # the rule: ceil(64 / sqrt(0.2 * 3/4)) = 166, capped at the originals' side
    ref = torchvision_views(views, size, images, seed=52)
    result = compare_statistics(device_views(views, size, images, store, seed=53), ref)
    print_statistics("SupCon 64 px, synthetic 128 px, store 128", result)
    assert_same_statistics(result, 2)
    # negative control: a store too small for the 0.2-scale crops loses gradient energy, and the test sees it
    small = compare_statistics(device_views(views, size, images, 72, seed=53), ref)
    print_statistics("SupCon 64 px, synthetic 128 px, store 72", small)
    assert_gradient_energy_loss_detected(small, 2)


def test_multicrop_statistics_match_torchvision_on_synthetic_images(synthetic_128: list[torch.Tensor], one_thread: None) -> None:
    """MultiCropViews(1, 1) at 48 px (21 px local crops, blur and solarize included) stored by the cache rule."""
    size, images = 48, synthetic_128[:400]
    views = MultiCropViews(1, 1)
    store = fit_store_size(_crops(views, size), 128)
    assert store == 128  # global crops: ceil(48 / sqrt(0.1 * 3/4)) = 176, capped at the originals' side
    ref = torchvision_views(views, size, images, seed=55)
    result = compare_statistics(device_views(views, size, images, store, seed=56), ref)
    print_statistics(f"MultiCrop(1, 1) 48 px, synthetic 128 px, store {store}", result)
    assert_same_statistics(result, 2)


@pytest.mark.slow
def test_supcon_statistics_on_non_square_images_stored_by_the_rule(one_thread: None) -> None:
    """SupConViews at 64 px from 96 x 160 originals: the rule (short/long 0.6) keeps them at their own 160 px."""
    size = 64
    images = list(synthetic_images(500, 96, 160, seed=57))
    views = SupConViews()
    store = fit_store_size(_crops(views, size), 160, aspect=96 / 160)
    assert store == 160  # ceil(64 / sqrt(0.2 * 3/4 * 0.6)) = 214, capped at the originals' long side
    result = compare_statistics(device_views(views, size, images, store, seed=59), torchvision_views(views, size, images, seed=58))
    print_statistics("SupCon 64 px, synthetic 96x160 px, store 160", result)
    assert_same_statistics(result, 2)


def _faces(n: int) -> list[torch.Tensor]:
    from PIL import Image

    files = sorted(UTKFACE.glob("*.jpg"))
    if len(files) < n:
        pytest.skip(f"{UTKFACE} holds {len(files)} faces, the test needs {n}")
    pick = np.random.default_rng(0).choice(len(files), n, replace=False)
    out = []
    for i in sorted(pick):
        with Image.open(files[i]) as img:
            out.append(torch.from_numpy(np.asarray(img.convert("RGB")).copy()).permute(2, 0, 1).contiguous())
    return out


@pytest.mark.slow
@pytest.mark.realdata
@needs(UTKFACE)
@pytest.mark.parametrize("views", [SupConViews(), MultiCropViews(2, 2)], ids=["supcon", "multicrop-2-2"])
def test_statistics_match_torchvision_on_utkface(views: ViewTransform, one_thread: None) -> None:
    """UTKFace faces (200 px) at 64 px, stored by the cache rule; for SupCon a 72 px store must be caught."""
    n, size = 1000, 64
    images = _faces(n)
    long_side = max(max(im.shape[1:]) for im in images)
    store = fit_store_size(_crops(views, size), long_side)
    ref = torchvision_views(views, size, images, seed=61)
    result = compare_statistics(device_views(views, size, images, store, seed=62), ref)
    print_statistics(f"{type(views).__name__} 64 px, UTKFace, store {store}", result)
    assert_same_statistics(result, views.n_views)
    if isinstance(views, SupConViews):
        small = compare_statistics(device_views(views, size, images, 72, seed=62), ref)
        print_statistics(f"{type(views).__name__} 64 px, UTKFace, store 72", small)
        assert_gradient_energy_loss_detected(small, views.n_views)


# ---------------------------------------------------------------------------------------------------
# 6. determinism: (seed, epoch, index, view) and nothing else
# ---------------------------------------------------------------------------------------------------
DET_SPECS = [
    RATES_SPEC,
    RATES_SPEC,
    ViewSpec(8, "pad_crop", padding=2, jitter=(0.8, 0.8, 0.8, 0.2), jitter_p=0.8, blur_kernel=3, blur_p=0.5),
]


def _per_sample_params(index: np.ndarray, epoch: np.ndarray, seed: int = 0) -> dict[tuple[int, int], list[tuple]]:
    """``{(epoch, index): [view 0's parameters, view 1's, ...]}`` read back from one draw of the batch."""
    aug = DeviceAugment(DET_SPECS, (0, 0, 0), (1, 1, 1), seed=seed)
    B = len(index)
    hw = np.tile([40, 56], (B, 1))
    params = aug.draw(index, epoch, hw, hw)
    out: dict[tuple[int, int], list[tuple]] = {(int(e), int(i)): [] for e, i in zip(epoch, index, strict=True)}
    for g, group in enumerate(aug.groups):
        rows = B * len(group.views)
        order = _jitter_rows(params, g, rows)
        blurred = dict(zip(params[f"g{g}_blur_rows"].tolist(), params[f"g{g}_blur_sigma"].tolist(), strict=True))
        crop = params[f"g{g}_boxes"][:, 1:] if f"g{g}_boxes" in params else params[f"g{g}_offsets"]
        for r in range(rows):
            b = r % B
            key = (int(epoch[b]), int(index[b]))
            if f"g{g}_boxes" in params:
                assert int(params[f"g{g}_boxes"][r, 0]) == b  # the box reads its own sample's image
            out[key].append(
                (
                    tuple(crop[r].tolist()),
                    bool(params[f"g{g}_flip"][r]),
                    tuple(params[f"g{g}_factors"][r].tolist()),
                    tuple(order[r]),
                    bool(params[f"g{g}_gray"][r]) if f"g{g}_gray" in params else None,
                    blurred.get(r),
                    bool(params[f"g{g}_solarize"][r]) if f"g{g}_solarize" in params else None,
                )
            )
    return out


def test_parameters_depend_on_seed_epoch_index_view_alone() -> None:
    index = np.arange(100, 164)
    epoch = np.full(64, 3)
    whole = _per_sample_params(index, epoch)
    # the same samples in other batches: other sizes, positions, neighbours from other epochs
    rng = np.random.default_rng(0)
    perm = rng.permutation(64)
    again: dict = {}
    for chunk in (perm[:1], perm[1:8], perm[8:40], perm[40:]):
        mixed_index = np.concatenate([index[chunk], rng.integers(0, 1000, 5)])
        mixed_epoch = np.concatenate([epoch[chunk], rng.integers(4, 9, 5)])
        again.update({k: v for k, v in _per_sample_params(mixed_index, mixed_epoch).items() if k[0] == 3})
    assert again == whole

    # different for another epoch, another index, another view, another seed: every continuous draw differs
    def factors(params: dict, key: tuple[int, int]) -> np.ndarray:
        return np.array([view[2] for view in params[key]])  # [views, 4]

    next_epoch, other_seed = _per_sample_params(index, epoch + 1), _per_sample_params(index, epoch, seed=1)
    all_factors = np.stack([factors(whole, (3, int(i))) for i in index])  # [64, views, 4]
    assert len(np.unique(all_factors)) == all_factors.size  # no two samples, views or ops share a factor
    same_box = 0
    for i in index:
        f = factors(whole, (3, int(i)))
        assert (f != factors(next_epoch, (4, int(i)))).all() and (f != factors(other_seed, (3, int(i)))).all()
        same_box += sum(
            whole[(3, int(i))][v][0] == other[v][0] for other in (next_epoch[(4, int(i))], other_seed[(3, int(i))]) for v in range(2)
        )
    assert same_box <= 2, same_box


# ---------------------------------------------------------------------------------------------------
# 7. evaluation
# ---------------------------------------------------------------------------------------------------
def test_eval_images_match_eval_transform() -> None:
    size = 48
    rng = np.random.default_rng(71)
    originals = [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)) for h, w in ((50, 70), (48, 48), (200, 150), (31, 40))]
    originals[0] = synthetic_images(1, 50, 70, seed=72)[0]
    stored = torch.stack([store_image(im, StoreLayout("resize", size))[0] for im in originals])
    out = eval_images(stored, size, IMAGENET_MEAN, IMAGENET_STD)
    pipeline = eval_transform(size, IMAGENET_MEAN, IMAGENET_STD)
    on_files = torch.stack([pipeline(im) for im in originals])
    on_store = torch.stack([pipeline(im) for im in stored])
    torch.testing.assert_close(out, on_files, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, on_store, atol=1e-6, rtol=0)
    # a store of another size is resized on the device in float: torchvision's resize of the float image
    bigger = torch.stack([store_image(im, StoreLayout("resize", 64))[0] for im in originals])
    torch.testing.assert_close(
        eval_images(bigger, size, IMAGENET_MEAN, IMAGENET_STD),
        torch.stack([pipeline(im.float() / 255) for im in bigger]),
        atol=1e-5,
        rtol=0,
    )
