"""Batched augmentation on the training device: the views of a whole batch in a few kernels.

The loader hands over ``uint8`` images of one fixed size (see :mod:`cloc_lightning.data.cache`
for the stored layout); :meth:`DeviceAugment.draw` draws every random parameter of the batch
on the host (a few numbers per sample, no device work), and :meth:`DeviceAugment.apply` makes
the views on whatever device the images are on.  The data modules call the two from
``on_before_batch_transfer`` and ``on_after_batch_transfer`` (``data.augment_on: device``).

**Random parameters are data.**  The draws of sample ``index`` in epoch ``epoch`` come from a
counter-based hash of ``(seed, epoch, index, view, draw)`` (SplitMix64's finaliser, Steele et
al. 2014), so they depend on nothing else: not on the batch the sample lands in, the number of
processes, the rank, or whether the run was resumed from a checkpoint.  A resumed run, and a
2-process DDP run, draw exactly the augmentations of one uninterrupted process.

**The same distributions as torchvision's v2 pipelines** (:mod:`cloc_lightning.data.transforms`),
per sample, in the same order:

* ``RandomResizedCrop``: torchvision's sampler (10 tries of area fraction and log-uniform aspect
  in the *original* image's pixels, integer boxes, the same centre-crop fallback), then the box is
  mapped onto the stored image and resampled with :func:`torchvision.ops.roi_align`
  (``aligned=True``: half-pixel centres as ``align_corners=False``; adaptive sampling averages
  ``ceil(box / output)`` bilinear samples per output pixel, an area filter where torchvision's
  antialiased resize uses a triangle filter);
* ``RandomCrop`` with reflect padding, horizontal flip;
* ``ColorJitter``: brightness, contrast, saturation and hue factors drawn as torchvision draws
  them and applied **in a random order per sample** (kornia's ``ColorJitter`` draws one order per
  batch); the formulas are torchvision's ``adjust_*`` (grayscale weights 0.2989/0.587/0.114,
  contrast about the mean of the grayscale image, hue through HSV);
* grayscale, Gaussian blur (separable, reflect padding, sigma uniform in ``blur_sigma``),
  solarize at torchvision's fixed threshold, then ``x / 255`` and the mean/std.

What differs from the loader path: the loader path rounds to ``uint8`` after every colour
operation (torchvision's integer kernels truncate), the device path stays in float; the crop is
resampled from the stored image, not the file; so the distributions are the same and the pixels
are not.  ``tests/data/test_device_augment.py`` tests the distributions against torchvision's.

kornia was measured for this (``shared/notes/device-augmentation.md``, docs/benchmarks.md):
its ``ColorJitter`` draws one colour order per batch, ``ColorJiggle`` has other statistics, its
crop has no antialiasing and its parameters come from torch's global generator, which a resume
would have to restore; these ops are written here in plain torch instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["ViewSpec", "DeviceAugment", "DeviceCollate", "uniforms", "rrc_boxes", "eval_images", "CropKind"]

#: how a view is cut from the stored image: RandomResizedCrop, a plain resize, or RandomCrop with reflect padding
CropKind = Literal["rrc", "resize", "pad_crop"]

_GRAY = (0.2989, 0.587, 0.114)


@dataclass(frozen=True)
class ViewSpec:
    """One view's pipeline, in torchvision's terms (every probability in ``[0, 1]``).

    ``crop``: ``rrc`` (``RandomResizedCrop(size, scale, ratio)``), ``resize`` (the stored image is
    already ``size`` px: nothing random) or ``pad_crop`` (``RandomCrop(size, padding,
    padding_mode='reflect')``).  Then flip (``flip_p``), ``ColorJitter(*jitter)`` with ``jitter_p``,
    grayscale (``grayscale_p``), Gaussian blur (``blur_kernel``, ``blur_sigma``, ``blur_p``),
    solarize (``solarize_threshold`` on the 0-255 scale, ``solarize_p``).
    """

    size: int
    crop: CropKind = "rrc"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    padding: int = 0
    flip_p: float = 0.5
    jitter: tuple[float, float, float, float] | None = None
    jitter_p: float = 0.0
    grayscale_p: float = 0.0
    blur_kernel: int = 0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    blur_p: float = 0.0
    solarize_threshold: float = 128.0
    solarize_p: float = 0.0


# ----------------------------------------------------------------------------
# counter-based uniforms on the host
# ----------------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's step on ``uint64`` arrays (wrapping arithmetic)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def uniforms(seed: int, epoch: np.ndarray, index: np.ndarray, stream: int, n: int) -> np.ndarray:
    """``[B, n]`` float64 uniforms in ``[0, 1)`` that depend only on ``(seed, epoch[b], index[b], stream, k)``.

    ``epoch`` and ``index`` are ``[B]`` integer arrays; ``stream`` names the draw (view and purpose).
    """
    with np.errstate(over="ignore"):
        z = _mix(np.full(len(index), int(seed) & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64))
        z = _mix(z ^ np.asarray(epoch, dtype=np.int64).astype(np.uint64))
        z = _mix(z ^ np.asarray(index, dtype=np.int64).astype(np.uint64))
        z = _mix(z ^ np.uint64((int(stream) & 0xFFFFFFFF) << 20))
        counters = np.arange(n, dtype=np.uint64)
        out = _mix(z[:, None] ^ counters[None, :])
    result: np.ndarray = (out >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)
    return result


def rrc_boxes(
    height: np.ndarray, width: np.ndarray, scale: tuple[float, float], ratio: tuple[float, float], u: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """torchvision's ``RandomResizedCrop`` boxes ``(top, left, h, w)`` for images of ``height`` x ``width`` px.

    ``u``: ``[B, 22]`` uniforms (10 area fractions, 10 log-aspects, then the top and left
    positions).  Same algorithm as ``torchvision.transforms.v2.RandomResizedCrop``: the first of
    10 tries whose rounded box fits, else the centre crop with the aspect clamped into ``ratio``.
    """
    H = height.astype(np.float64)[:, None]
    W = width.astype(np.float64)[:, None]
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    target = H * W * (scale[0] + (scale[1] - scale[0]) * u[:, :10])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, 10:20])
    w = np.rint(np.sqrt(target * aspect))
    h = np.rint(np.sqrt(target / aspect))
    fits = (w > 0) & (w <= W) & (h > 0) & (h <= H)
    first = fits.argmax(axis=1)
    rows = np.arange(len(u))
    found = fits.any(axis=1)
    H1, W1 = H[:, 0], W[:, 0]
    in_ratio = W1 / H1
    fw = np.where(in_ratio < ratio[0], W1, np.where(in_ratio > ratio[1], np.rint(H1 * ratio[1]), W1))
    fh = np.where(in_ratio < ratio[0], np.rint(W1 / ratio[0]), H1)
    bw = np.where(found, w[rows, first], fw)
    bh = np.where(found, h[rows, first], fh)
    top = np.where(found, np.floor(u[:, 20] * (H1 - bh + 1)), np.floor((H1 - bh) / 2))
    left = np.where(found, np.floor(u[:, 21] * (W1 - bw + 1)), np.floor((W1 - bw) / 2))
    return top, left, bh, bw


# streams: view * 64 + purpose
_RRC, _FLIP, _JIT_P, _JIT_F, _JIT_ORDER, _GRAY_P, _BLUR_P, _BLUR_S, _SOL_P, _PAD = range(10)


@dataclass
class _Group:
    """Consecutive views with one spec, augmented as one batch of ``B * len(views)`` rows (view-major)."""

    spec: ViewSpec
    views: list[int] = field(default_factory=list)


class DeviceAugment:
    """The views of a batch of stored ``uint8`` images, made on the images' device.

    Args:
        specs: one :class:`ViewSpec` per view, in the order the views are returned.
        mean: per-channel mean subtracted after ``x / 255``.
        std: per-channel standard deviation.
        seed: the data module's seed (the first key of every draw).

    Usage (what the data modules' batch hooks do)::

        params = aug.draw(index, epoch, native_hw, stored_hw)   # host, numpy + CPU tensors
        views = aug.apply(images_u8.to(device), {k: v.to(device) for k, v in params.items()})
    """

    def __init__(self, specs: Sequence[ViewSpec], mean: Sequence[float], std: Sequence[float], seed: int = 0) -> None:
        if not specs:
            raise ValueError("DeviceAugment needs at least one ViewSpec")
        self.specs = list(specs)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.seed = int(seed)
        self.groups: list[_Group] = []
        for v, spec in enumerate(self.specs):
            if self.groups and self.groups[-1].spec == spec:
                self.groups[-1].views.append(v)
            else:
                self.groups.append(_Group(spec, [v]))

    @property
    def n_views(self) -> int:
        return len(self.specs)

    # ------------------------------------------------------------------ host
    def draw(self, index: np.ndarray, epoch: np.ndarray, native_hw: np.ndarray, stored_hw: np.ndarray) -> dict[str, torch.Tensor]:
        """Every random parameter of a batch, as small CPU tensors keyed ``g{group}_{name}``.

        ``index``/``epoch``: ``[B]`` sample indices in the base set and their epochs;
        ``native_hw``: ``[B, 2]`` the original images' sizes (the crop is drawn in their pixels);
        ``stored_hw``: ``[B, 2]`` the part of the stored image that holds each one.
        """
        index = np.asarray(index, dtype=np.int64)
        epoch = np.asarray(epoch, dtype=np.int64)
        native = np.asarray(native_hw, dtype=np.float64).reshape(-1, 2)
        stored = np.asarray(stored_hw, dtype=np.float64).reshape(-1, 2)
        B = len(index)
        out: dict[str, torch.Tensor] = {}
        for g, group in enumerate(self.groups):
            s = group.spec
            rows = [self._draw_view(s, v, index, epoch, native, stored) for v in group.views]
            merged = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
            if s.crop == "rrc":
                batch = np.tile(np.arange(B, dtype=np.float64), len(group.views))
                out[f"g{g}_boxes"] = torch.from_numpy(np.column_stack([batch, merged["box"]]).astype(np.float32))
            elif s.crop == "pad_crop":
                out[f"g{g}_offsets"] = torch.from_numpy(merged["offset"].astype(np.int64))
            out[f"g{g}_flip"] = torch.from_numpy(merged["flip"])
            if s.jitter is not None and s.jitter_p > 0:
                factors = merged["factors"]
                out[f"g{g}_factors"] = torch.from_numpy(factors.astype(np.float32))
                order, applied = merged["order"], merged["jitter"]
                for pos in range(4):
                    for op in range(4):
                        rows_ = np.nonzero(applied & (order[:, pos] == op) & self._op_active(s, op))[0]
                        out[f"g{g}_jit{pos}{op}"] = torch.from_numpy(rows_.astype(np.int64))
            if s.grayscale_p > 0:
                out[f"g{g}_gray"] = torch.from_numpy(merged["gray"])
            if s.blur_p > 0 and s.blur_kernel > 1:
                rows_ = np.nonzero(merged["blur"])[0]
                out[f"g{g}_blur_rows"] = torch.from_numpy(rows_.astype(np.int64))
                out[f"g{g}_blur_sigma"] = torch.from_numpy(merged["sigma"][rows_].astype(np.float32))
            if s.solarize_p > 0:
                out[f"g{g}_solarize"] = torch.from_numpy(merged["solarize"])
        return out

    @staticmethod
    def _op_active(spec: ViewSpec, op: int) -> bool:
        assert spec.jitter is not None
        return bool(spec.jitter[op] > 0)

    def _draw_view(
        self, s: ViewSpec, view: int, index: np.ndarray, epoch: np.ndarray, native: np.ndarray, stored: np.ndarray
    ) -> dict[str, np.ndarray]:
        def u(purpose: int, n: int) -> np.ndarray:
            return uniforms(self.seed, epoch, index, view * 64 + purpose, n)

        out: dict[str, np.ndarray] = {}
        if s.crop == "rrc":
            top, left, h, w = rrc_boxes(native[:, 0], native[:, 1], s.scale, s.ratio, u(_RRC, 22))
            sy, sx = stored[:, 0] / native[:, 0], stored[:, 1] / native[:, 1]
            out["box"] = np.column_stack([left * sx, top * sy, (left + w) * sx, (top + h) * sy])
        elif s.crop == "pad_crop":
            out["offset"] = np.floor(u(_PAD, 2) * (2 * s.padding + 1))
        out["flip"] = u(_FLIP, 1)[:, 0] < s.flip_p
        if s.jitter is not None and s.jitter_p > 0:
            b, c, sat, hue = s.jitter
            f = u(_JIT_F, 4)
            lo = np.array([max(0.0, 1 - b), max(0.0, 1 - c), max(0.0, 1 - sat), -hue])
            hi = np.array([1 + b, 1 + c, 1 + sat, hue])
            out["factors"] = lo + (hi - lo) * f
            out["order"] = np.argsort(u(_JIT_ORDER, 4), axis=1)
            out["jitter"] = u(_JIT_P, 1)[:, 0] < s.jitter_p
        if s.grayscale_p > 0:
            out["gray"] = u(_GRAY_P, 1)[:, 0] < s.grayscale_p
        if s.blur_p > 0 and s.blur_kernel > 1:
            out["blur"] = u(_BLUR_P, 1)[:, 0] < s.blur_p
            out["sigma"] = s.blur_sigma[0] + (s.blur_sigma[1] - s.blur_sigma[0]) * u(_BLUR_S, 1)[:, 0]
        if s.solarize_p > 0:
            out["solarize"] = u(_SOL_P, 1)[:, 0] < s.solarize_p
        return out

    # ---------------------------------------------------------------- device
    @torch.no_grad()
    def apply(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """``n_views`` normalised ``float32`` views ``[B, 3, size_v, size_v]`` of ``uint8`` ``images [B, 3, S, S]``."""
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"DeviceAugment.apply takes uint8 images [B, 3, S, S], got {images.dtype} {tuple(images.shape)}")
        B = images.shape[0]
        x = images.float()
        views: list[torch.Tensor] = [x] * self.n_views
        for g, group in enumerate(self.groups):
            y = self._crop(x, group, g, params) * (1.0 / 255.0)
            y = self._colour(y, group.spec, g, params)
            y = normalize(y, self.mean, self.std)
            for j, v in enumerate(group.views):
                views[v] = y[j * B : (j + 1) * B]
        return views

    def _crop(self, x: torch.Tensor, group: _Group, g: int, params: dict[str, torch.Tensor]) -> torch.Tensor:
        s = group.spec
        n = len(group.views)
        if s.crop == "rrc":
            from torchvision.ops import roi_align

            y: torch.Tensor = roi_align(x, params[f"g{g}_boxes"], output_size=s.size, spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        elif s.crop == "pad_crop":
            if x.shape[-1] != s.size or x.shape[-2] != s.size:
                raise ValueError(f"pad_crop views need images stored at {s.size} px, got {tuple(x.shape[-2:])}")
            y = pad_crop(x.repeat(n, 1, 1, 1), params[f"g{g}_offsets"], s.size, s.padding)
        else:
            y = x if n == 1 else x.repeat(n, 1, 1, 1)
            if y.shape[-1] != s.size or y.shape[-2] != s.size:
                y = F.interpolate(y, size=(s.size, s.size), mode="bilinear", align_corners=False, antialias=True)
        flip = params[f"g{g}_flip"].view(-1, 1, 1, 1)
        return torch.where(flip, y.flip(-1), y)

    def _colour(self, y: torch.Tensor, s: ViewSpec, g: int, params: dict[str, torch.Tensor]) -> torch.Tensor:
        if s.jitter is not None and s.jitter_p > 0:
            factors = params[f"g{g}_factors"]
            for pos in range(4):
                for op in range(4):
                    rows = params[f"g{g}_jit{pos}{op}"]
                    if rows.numel() == 0:  # the shape is known on the host: no device read
                        continue
                    sub = y.index_select(0, rows)
                    f = factors.index_select(0, rows)[:, op].view(-1, 1, 1, 1)
                    y.index_copy_(0, rows, _JITTER_OPS[op](sub, f))  # y is this view group's own tensor
        if s.grayscale_p > 0:
            gray = grayscale(y).expand_as(y)
            y = torch.where(params[f"g{g}_gray"].view(-1, 1, 1, 1), gray, y)
        if s.blur_p > 0 and s.blur_kernel > 1:
            rows = params[f"g{g}_blur_rows"]
            if rows.numel():
                y.index_copy_(0, rows, gaussian_blur(y.index_select(0, rows), params[f"g{g}_blur_sigma"], s.blur_kernel))
        if s.solarize_p > 0:
            on = params[f"g{g}_solarize"].view(-1, 1, 1, 1) & (y >= s.solarize_threshold / 255.0)
            y = torch.where(on, 1.0 - y, y)
        return y


# ----------------------------------------------------------------------------
# the batched operations (float images in [0, 1], per-sample factors [N, 1, 1, 1])
# ----------------------------------------------------------------------------
_CONSTANTS: dict[tuple[tuple[float, ...], torch.device, torch.dtype], torch.Tensor] = {}


def _constant(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """``values`` as a ``[1, C, 1, 1]`` tensor on ``like``'s device, copied there once (a copy from the host each step could wait)."""
    key = (tuple(float(v) for v in values), like.device, like.dtype)
    found = _CONSTANTS.get(key)
    if found is None:
        found = _CONSTANTS[key] = torch.tensor(key[0], dtype=like.dtype).view(1, -1, 1, 1).to(like.device)
    return found


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x - mean) / std`` per channel of ``[N, 3, H, W]``."""
    return (x - _constant(mean, x)) / _constant(std, x)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """``[N, 1, H, W]`` luma with torchvision's weights."""
    r, g, b = x.unbind(1)
    return (_GRAY[0] * r + _GRAY[1] * g + _GRAY[2] * b).unsqueeze(1)


def _blend(a: torch.Tensor, b: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return (f * a + (1 - f) * b).clamp_(0.0, 1.0)


def adjust_brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_brightness``: ``x * f``, clamped."""
    return (x * f).clamp_(0.0, 1.0)


def adjust_contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_contrast``: blend with the mean of the grayscale image."""
    return _blend(x, grayscale(x).mean(dim=(1, 2, 3), keepdim=True), f)


def adjust_saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_saturation``: blend with the grayscale image."""
    return _blend(x, grayscale(x), f)


def adjust_hue(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_hue``: rotate the hue in HSV by ``f`` turns (``f`` in ``[-0.5, 0.5]``)."""
    r, g, b = x.unbind(1)
    maxc = torch.maximum(torch.maximum(r, g), b)
    minc = torch.minimum(torch.minimum(r, g), b)
    delta = maxc - minc
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    sat = torch.where(maxc > 0, delta / torch.where(maxc > 0, maxc, torch.ones_like(maxc)), torch.zeros_like(maxc))
    rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
    h = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.where(delta > 0, h, torch.zeros_like(h))
    h = torch.remainder(h / 6.0 + f.view(-1, 1, 1), 1.0)
    v = maxc
    i6 = torch.floor(h * 6.0)
    frac = h * 6.0 - i6
    p = v * (1 - sat)
    q = v * (1 - sat * frac)
    t = v * (1 - sat * (1 - frac))
    i = i6.long().remainder(6).unsqueeze(1)  # [N, 1, H, W]
    cands_r = torch.stack([v, q, p, p, t, v], 1)
    cands_g = torch.stack([t, v, v, q, p, p], 1)
    cands_b = torch.stack([p, p, t, v, v, q], 1)
    return torch.cat([cands_r.gather(1, i), cands_g.gather(1, i), cands_b.gather(1, i)], 1).clamp_(0.0, 1.0)


_JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """torchvision's ``gaussian_blur`` with one ``sigma`` per image: separable, reflect padding."""
    N, C, H, W = x.shape
    half = (kernel - 1) / 2
    pos = torch.linspace(-half, half, kernel, dtype=x.dtype, device=x.device)
    k = torch.exp(-0.5 * (pos.view(1, -1) / sigma.to(x.dtype).view(-1, 1)) ** 2)
    k = (k / k.sum(dim=1, keepdim=True)).repeat_interleave(C, dim=0)  # [N*C, kernel]
    pad = kernel // 2
    y = F.pad(x.reshape(1, N * C, H, W), (pad, pad, pad, pad), mode="reflect")
    y = F.conv2d(y, k.view(N * C, 1, 1, kernel), groups=N * C)
    y = F.conv2d(y, k.view(N * C, 1, kernel, 1), groups=N * C)
    return y.view(N, C, H, W)


def pad_crop(x: torch.Tensor, offsets: torch.Tensor, size: int, padding: int) -> torch.Tensor:
    """``RandomCrop(size, padding, padding_mode='reflect')`` with per-image ``offsets [N, 2]`` (top, left)."""
    N = x.shape[0]
    y = F.pad(x, (padding, padding, padding, padding), mode="reflect")
    ar = torch.arange(size, device=x.device)
    rows = (offsets[:, 0:1] + ar).view(N, 1, size, 1)
    cols = (offsets[:, 1:2] + ar).view(N, 1, 1, size)
    n = torch.arange(N, device=x.device).view(N, 1, 1, 1)
    c = torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1)
    return y[n, c, rows, cols]


def eval_images(images: torch.Tensor, size: int, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """The evaluation transform of ``uint8 [B, 3, S, S]`` on their device: resize to ``size`` (when ``S`` differs), ``/ 255``, normalise."""
    x = images.float()
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return normalize(x * (1.0 / 255.0), mean, std)


class DeviceCollate:
    """The training loader's ``collate_fn`` for ``augment_on: device``: stacks the stored items and adds their parameters.

    Runs in the loader workers, so the parameters are drawn beside the indexing, off the training
    process, and pinned with the batch; ``params`` is a dict of small CPU tensors
    (:meth:`DeviceAugment.draw`).
    """

    def __init__(self, augment: DeviceAugment) -> None:
        self.augment = augment

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, object]:
        from torch.utils.data import default_collate

        batch: dict[str, Any] = default_collate(items)
        batch["params"] = self.augment.draw(
            batch["index"].numpy(),
            batch["epoch"].numpy(),
            batch["native"].numpy(),
            batch["stored"].numpy(),
        )
        return batch
