"""Image transforms (torchvision v2) shared by all data modules.

Single-view pipelines (:func:`train_transform`, :func:`eval_transform`) and the
multi-view hook: a data module's ``train_views`` takes a :class:`ViewTransform`,
which turns one image into a list of augmented views.  Methods that need views
(SupCon/SimCLR, ReLIC) check the count they receive against their own setting.

Images arrive as PIL images or ``uint8`` tensors ``[3, H, W]``; every pipeline
ends with a normalised ``float32`` tensor ``[3, size, size]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torchvision.transforms import v2

from cloc_lightning.data.device_augment import ViewSpec
from cloc_lightning.data.errors import config_errors
from cloc_lightning.validation import check_choice, check_float, check_int

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CIFAR_MEAN",
    "CIFAR_STD",
    "Augment",
    "train_transform",
    "train_view_specs",
    "eval_transform",
    "ViewTransform",
    "MultiViewTransform",
    "SupConViews",
    "MultiCropViews",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)

Augment = Literal["none", "flip", "crop_flip", "rrc_flip"]
#: the size a multi-crop view's blur kernel follows: each crop's own, or the global views' (the seed)
BlurKernelFrom = Literal["crop", "global"]
#: how local crop sizes are rounded from the global size: ``round``, or ``floor`` (the seed's ``int()``)
LocalSizeRounding = Literal["round", "floor"]
Transform = Callable[[object], torch.Tensor]


def _to_tensor(mean: Sequence[float], std: Sequence[float]) -> list[v2.Transform]:
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]


def eval_transform(image_size: int, mean: Sequence[float], std: Sequence[float]) -> Transform:
    """Resize to ``image_size`` x ``image_size`` and normalise."""
    pipeline: Transform = v2.Compose([v2.ToImage(), v2.Resize((image_size, image_size), antialias=True), *_to_tensor(mean, std)[1:]])
    return pipeline


def train_transform(
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    augment: Augment = "crop_flip",
    rrc_scale: tuple[float, float] = (0.5, 1.0),
) -> Transform:
    """Single-view training pipeline.

    ``augment``: ``none`` (resize only), ``flip`` (+ horizontal flip), ``crop_flip``
    (resize, random crop with 1/8 padding, flip; the CIFAR recipe) or ``rrc_flip``
    (RandomResizedCrop with ``rrc_scale`` and flip; the ImageNet recipe).
    """
    check_choice("augment", augment, Augment)
    base: list[v2.Transform] = [v2.ToImage()]
    if augment == "rrc_flip":
        base += [v2.RandomResizedCrop(image_size, scale=rrc_scale, antialias=True), v2.RandomHorizontalFlip()]
    else:
        base.append(v2.Resize((image_size, image_size), antialias=True))
        if augment == "crop_flip":
            base.append(v2.RandomCrop(image_size, padding=max(1, image_size // 8), padding_mode="reflect"))
        if augment in ("crop_flip", "flip"):
            base.append(v2.RandomHorizontalFlip())
    pipeline: Transform = v2.Compose(base + _to_tensor(mean, std)[1:])
    return pipeline


def train_view_specs(image_size: int, augment: Augment = "crop_flip", rrc_scale: tuple[float, float] = (0.5, 1.0)) -> list[ViewSpec]:
    """:func:`train_transform`'s pipeline as a device :class:`~cloc_lightning.data.device_augment.ViewSpec` (``augment_on: device``)."""
    check_choice("augment", augment, Augment)
    if augment == "rrc_flip":
        return [ViewSpec(image_size, "rrc", scale=tuple(rrc_scale), flip_p=0.5)]  # type: ignore[arg-type]
    if augment == "crop_flip":
        return [ViewSpec(image_size, "pad_crop", padding=max(1, image_size // 8), flip_p=0.5)]
    return [ViewSpec(image_size, "resize", flip_p=0.5 if augment == "flip" else 0.0)]


def check_crop_scale(name: str, value: Sequence[float]) -> tuple[float, float]:
    """``value`` as a ``(min, max)`` crop-area pair with ``0 < min <= max <= 1``, else a ``ValueError``/``TypeError``."""
    hint = f"give two numbers [min, max] with 0 < min <= max <= 1, e.g. {name}: [0.2, 1.0]"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"{name} must be a pair [min, max] of image-area fractions, got {value!r}; {hint}")
    lo = check_float(f"{name} min", value[0], minimum=0.0, strict_minimum=True, maximum=1.0, hint=hint)
    hi = check_float(f"{name} max", value[1], minimum=lo, maximum=1.0, hint=hint)
    return (lo, hi)


def _check_probability(name: str, value: float) -> float:
    return check_float(name, value, minimum=0.0, maximum=1.0, hint="a probability in [0, 1]")


def _check_size(name: str, value: int | None) -> int | None:
    return None if value is None else check_int(name, value, 1, hint="pixels, or null: the data module's image_size")


class MultiViewTransform:
    """Apply several transforms to one image and return the list of views."""

    def __init__(self, transforms: Sequence[Transform]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: object) -> list[torch.Tensor]:
        return [t(image) for t in self.transforms]

    def __len__(self) -> int:
        return len(self.transforms)


class ViewTransform:
    """Base class of multi-view specifications (the data modules' ``train_views``).

    Subclasses describe the views with plain typed arguments (so they work from
    YAML) and build the callable once the data module knows the image size and
    normalisation.  ``n_views`` is the number of tensors per sample.
    """

    @property
    def n_views(self) -> int:
        raise NotImplementedError

    def build(self, image_size: int, mean: Sequence[float], std: Sequence[float]) -> MultiViewTransform:
        """The callable mapping one image to a list of ``n_views`` tensors."""
        raise NotImplementedError

    def device_specs(self, image_size: int) -> list[ViewSpec]:
        """The same views as :meth:`build`, one :class:`~cloc_lightning.data.device_augment.ViewSpec` each (``data.augment_on: device``).

        A subclass without a device form keeps this default, and ``augment_on: device`` is refused
        with a message naming it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no device form (device_specs); set data.augment_on: loader, or implement "
            f"{type(self).__name__}.device_specs returning one ViewSpec per view"
        )


class SupConViews(ViewTransform):
    """``n_views`` i.i.d. views with SupCon/SimCLR's augmentation (Khosla et al. 2020).

    RandomResizedCrop(scale) -> horizontal flip -> ColorJitter(0.4, 0.4, 0.4, 0.1)
    with p = 0.8 -> grayscale with p = 0.2 (HobbitLong/SupContrast ``main_supcon.py``).
    ``size`` overrides the data module's image size.
    """

    def __init__(
        self,
        n_views: int = 2,
        scale: tuple[float, float] = (0.2, 1.0),
        jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1),
        jitter_p: float = 0.8,
        grayscale_p: float = 0.2,
        size: int | None = None,
    ) -> None:
        check_int("n_views", n_views, 1)
        self._n_views = n_views
        self.scale = check_crop_scale("scale", scale)
        self.jitter = tuple(jitter)
        self.jitter_p = _check_probability("jitter_p", jitter_p)
        self.grayscale_p = _check_probability("grayscale_p", grayscale_p)
        self.size = _check_size("size", size)

    @property
    def n_views(self) -> int:
        return self._n_views

    def build(self, image_size: int, mean: Sequence[float], std: Sequence[float]) -> MultiViewTransform:
        size = self.size or image_size
        one = v2.Compose(
            [
                v2.ToImage(),
                v2.RandomResizedCrop(size, scale=self.scale, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.RandomApply([v2.ColorJitter(*self.jitter)], p=self.jitter_p),
                v2.RandomGrayscale(p=self.grayscale_p),
                *_to_tensor(mean, std)[1:],
            ]
        )
        return MultiViewTransform([one] * self._n_views)

    def device_specs(self, image_size: int) -> list[ViewSpec]:
        b, c, s, h = (float(v) for v in self.jitter)
        spec = ViewSpec(
            self.size or image_size,
            "rrc",
            scale=self.scale,
            flip_p=0.5,
            jitter=(b, c, s, h),
            jitter_p=self.jitter_p,
            grayscale_p=self.grayscale_p,
        )
        return [spec] * self._n_views


class MultiCropViews(ViewTransform):
    """Global + local crops (multi-crop, Caron et al. 2020) as the ReLIC-sigmoid seed uses.

    Views are ordered ``[global_1 .. global_G, local_1 .. local_L]``.  Global views:
    RandomResizedCrop(``global_size``, ``global_scale``) -> horizontal flip -> ColorJitter
    (``jitter``) with p = ``jitter_p`` -> grayscale p = ``grayscale_p`` -> Gaussian blur
    (sigma in [0.1, 2], p = ``blur_p``) -> solarize (``solarize_threshold``, p =
    ``solarize_p``).  Local views: the same at ``local_size``/``local_scale`` without
    solarisation.  Then float conversion and the data module's mean/std.

    Defaults, and the seed's values (``scl/aug.py``; a 96 px example in brackets):

    ======================  ==========================  =====================================
    argument                default                     the seed
    ======================  ==========================  =====================================
    num_global_views        2                           2 (``--num_global_views``)
    num_local_views         0                           4 (``--num_local_views``)
    global_size             the data module's size      the dataset's size (32, 96, ...)
    local_size              ``local_size_rounding`` of  ``int(3/7 * size)`` (41; 13 at 32 px)
                            ``3/7 * size``, >= 8
    local_size_rounding     ``'round'`` (14 at 32 px)   ``'floor'``
    global/local_scale      (0.1, 1) / (0.05, 1)        the same
    jitter, jitter_p        (0.8, 0.8, 0.8, 0.2), 0.8   the same
    grayscale_p             0.2                         0.2
    blur_p                  0.5                         1.0 (GaussianBlur always applied)
    blur_kernel_size        None (derived, below)       derived
    blur_kernel_from        ``'crop'``                  ``'global'``
    solarize_p              0.2                         0.2 (global views only)
    solarize_threshold      128                         127
    ======================  ==========================  =====================================

    The blur kernel is odd, about 10% of a size -- ``max(3, size // 10 rounded up to
    odd)`` -- of each crop's own size (``blur_kernel_from='crop'``: 9 for 96 px global,
    5 for 41 px local crops) or of the global size for both kinds of view
    (``blur_kernel_from='global'``, the seed's ``_round_up_to_odd(int(size * 0.1))``: 3 at
    32 px, 9 at 96 px; the two formulas agree for sizes >= 20, below that the seed's
    kernel is 1, i.e. no blur, ours 3), unless ``blur_kernel_size`` fixes it for both.
    ``MultiCropViews(num_local_views=4, blur_p=1.0, blur_kernel_from='global',
    local_size_rounding='floor', solarize_threshold=127)`` is the seed's pipeline at any
    image size (``configs/relic/cifar10.yaml``, ``stl10.yaml``).  The seed's mean/std are ImageNet's
    (set them on the data module).
    """

    def __init__(
        self,
        num_global_views: int = 2,
        num_local_views: int = 0,
        global_size: int | None = None,
        local_size: int | None = None,
        global_scale: tuple[float, float] = (0.1, 1.0),
        local_scale: tuple[float, float] = (0.05, 1.0),
        jitter: tuple[float, float, float, float] = (0.8, 0.8, 0.8, 0.2),
        jitter_p: float = 0.8,
        grayscale_p: float = 0.2,
        blur_p: float = 0.5,
        solarize_p: float = 0.2,
        blur_kernel_size: int | None = None,
        solarize_threshold: float = 128,
        blur_kernel_from: BlurKernelFrom = "crop",
        local_size_rounding: LocalSizeRounding = "round",
    ) -> None:
        if blur_kernel_size is not None:
            odd = "an odd positive integer (or null = ~10% of the crop)"
            if check_int("blur_kernel_size", blur_kernel_size, 1, expect=odd) % 2 == 0:
                raise ValueError(f"blur_kernel_size must be {odd}, got {blur_kernel_size}")
        check_int("num_global_views", num_global_views, 1)
        check_int("num_local_views", num_local_views, 0)
        check_choice("blur_kernel_from", blur_kernel_from, BlurKernelFrom, hint="'crop': each crop's size, 'global': the seed's")
        check_choice("local_size_rounding", local_size_rounding, LocalSizeRounding, hint="'floor' is the seed's int()")
        self.num_global_views = num_global_views
        self.num_local_views = num_local_views
        self.global_size = _check_size("global_size", global_size)
        self.local_size = _check_size("local_size", local_size)
        self.global_scale = check_crop_scale("global_scale", global_scale)  # (min, max) area fractions
        self.local_scale = check_crop_scale("local_scale", local_scale)
        self.jitter = tuple(jitter)
        self.jitter_p = _check_probability("jitter_p", jitter_p)
        self.grayscale_p = _check_probability("grayscale_p", grayscale_p)
        self.blur_p = _check_probability("blur_p", blur_p)
        self.solarize_p = _check_probability("solarize_p", solarize_p)
        self.blur_kernel_size = blur_kernel_size
        self.solarize_threshold = solarize_threshold
        self.blur_kernel_from = blur_kernel_from
        self.local_size_rounding = local_size_rounding

    @property
    def n_views(self) -> int:
        return self.num_global_views + self.num_local_views

    @staticmethod
    def blur_kernel_for(size: int) -> int:
        """The derived blur kernel of a ``size`` px view: odd, about ``size / 10``, at least 3."""
        return max(3, (int(size) // 10) | 1)

    def sizes(self, image_size: int) -> tuple[int, int]:
        """``(global crop size, local crop size)`` for a data module image size."""
        g_size = self.global_size or image_size
        if self.local_size:
            return g_size, self.local_size
        exact = image_size * 3 / 7
        local = int(exact) if self.local_size_rounding == "floor" else round(exact)
        return g_size, max(8, local)

    def blur_kernels(self, image_size: int) -> tuple[int, int]:
        """``(global view kernel, local view kernel)`` of the Gaussian blur for a data module image size."""
        if self.blur_kernel_size:
            return self.blur_kernel_size, self.blur_kernel_size
        g_size, l_size = self.sizes(image_size)
        g_kernel = self.blur_kernel_for(g_size)
        return g_kernel, g_kernel if self.blur_kernel_from == "global" else self.blur_kernel_for(l_size)

    def _pipeline(
        self, size: int, scale: tuple[float, float], solarize: bool, kernel: int, mean: Sequence[float], std: Sequence[float]
    ) -> Transform:
        ops: list[v2.Transform] = [
            v2.ToImage(),
            v2.RandomResizedCrop(size, scale=scale, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.RandomApply([v2.ColorJitter(*self.jitter)], p=self.jitter_p),
            v2.RandomGrayscale(p=self.grayscale_p),
            v2.RandomApply([v2.GaussianBlur(kernel, sigma=(0.1, 2.0))], p=self.blur_p),
        ]
        if solarize:
            ops.append(v2.RandomSolarize(threshold=self.solarize_threshold, p=self.solarize_p))
        pipeline: Transform = v2.Compose(ops + _to_tensor(mean, std)[1:])
        return pipeline

    def build(self, image_size: int, mean: Sequence[float], std: Sequence[float]) -> MultiViewTransform:
        g_size, l_size = self.sizes(image_size)
        g_kernel, l_kernel = self.blur_kernels(image_size)
        g = self._pipeline(g_size, self.global_scale, True, g_kernel, mean, std)
        loc = self._pipeline(l_size, self.local_scale, False, l_kernel, mean, std)
        return MultiViewTransform([g] * self.num_global_views + [loc] * self.num_local_views)

    def device_specs(self, image_size: int) -> list[ViewSpec]:
        g_size, l_size = self.sizes(image_size)
        g_kernel, l_kernel = self.blur_kernels(image_size)
        b, c, s, h = (float(v) for v in self.jitter)
        common: dict[str, Any] = dict(
            flip_p=0.5, jitter=(b, c, s, h), jitter_p=self.jitter_p, grayscale_p=self.grayscale_p, blur_p=self.blur_p
        )
        g = ViewSpec(
            g_size,
            "rrc",
            scale=self.global_scale,
            blur_kernel=g_kernel,
            solarize_p=self.solarize_p,
            solarize_threshold=float(self.solarize_threshold),
            **common,
        )
        loc = ViewSpec(l_size, "rrc", scale=self.local_scale, blur_kernel=l_kernel, **common)
        return [g] * self.num_global_views + [loc] * self.num_local_views


def check_rrc_scale(value: Any) -> tuple[float, float]:
    """``value`` as a ``(min, max)`` crop-area pair with ``0 < min <= max <= 1``, else a :class:`DataConfigError`."""
    with config_errors():
        return check_crop_scale("rrc_scale", value)
