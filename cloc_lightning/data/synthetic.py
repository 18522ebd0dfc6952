"""A built-in ordinal dataset that needs no download: counting shapes.

Each image shows ``k = class + 1`` objects (disks, squares, triangles, rings) of
random colour, size and position on a noisy, randomly tinted background, with a
few faint distractor strokes.  Neighbouring classes (``k`` vs ``k + 1`` objects)
look more alike than distant ones, which is exactly the structure ordinal
methods exploit; occlusions are avoided but objects may touch, sizes vary and
the noise is strong enough that the task is learnable without being trivial
(a ResNet-18 trained for a few epochs at 32 px is far from perfect).

Generation is deterministic in ``(seed, split)`` and takes about a second for the
default sizes, so the data module is the default of the main job and of the
fast tests on any machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data.datasets import LabelledDataset, TensorImageDataset
from cloc_lightning.data.errors import config_errors
from cloc_lightning.validation import check_float, check_int

__all__ = ["make_ordinal_shapes", "OrdinalShapesDataModule"]


def _shape_mask(kind: int, yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, r: float) -> np.ndarray:
    dy, dx = yy - cy, xx - cx
    if kind == 0:  # disk
        return dy**2 + dx**2 <= r**2
    if kind == 1:  # square
        return (np.abs(dy) <= r * 0.85) & (np.abs(dx) <= r * 0.85)
    if kind == 2:  # upward triangle
        return (dy <= r * 0.8) & (dy >= -r) & (np.abs(dx) <= (dy + r) * 0.6)
    ring = dy**2 + dx**2  # ring
    return (ring <= r**2) & (ring >= (0.45 * r) ** 2)


def make_ordinal_shapes(
    n: int, num_classes: int = 6, image_size: int = 32, seed: int = 0, noise: float = 24.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate ``n`` counting images.

    Returns:
        ``(images, labels)``: ``uint8`` ``[n, 3, image_size, image_size]`` and
        ``int64`` ``[n]`` with balanced labels in ``[0, num_classes)``; image ``i``
        shows ``labels[i] + 1`` objects.
    """
    with config_errors():
        check_int("num_classes", num_classes, 2)
        check_int("image_size", image_size, 16, hint="smaller shapes are not visible")
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % num_classes
    rng.shuffle(labels)
    s = image_size
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    images = np.empty((n, s, s, 3), dtype=np.uint8)
    r_min, r_max = 0.07 * s, 0.13 * s
    for i, label in enumerate(labels):
        tint = rng.uniform(30, 150, size=3)
        img = tint + rng.normal(0.0, noise, size=(s, s, 3))
        for _ in range(rng.integers(1, 4)):  # faint distractor strokes
            y0, x0, y1, x1 = rng.uniform(0, s, size=4)
            t = np.clip(((yy - y0) * (y1 - y0) + (xx - x0) * (x1 - x0)) / ((y1 - y0) ** 2 + (x1 - x0) ** 2 + 1e-6), 0, 1)
            d2 = (yy - y0 - t * (y1 - y0)) ** 2 + (xx - x0 - t * (x1 - x0)) ** 2
            img[d2 < 0.5] += rng.uniform(-40, 40, size=3)
        placed: list[tuple[float, float, float]] = []
        for _ in range(int(label) + 1):
            for _attempt in range(60):
                r = rng.uniform(r_min, r_max)
                cy, cx = rng.uniform(r, s - r, size=2)
                if all((cy - py) ** 2 + (cx - px) ** 2 > (r + pr) ** 2 for py, px, pr in placed):
                    break
            placed.append((cy, cx, r))
            colour = rng.uniform(0, 255, size=3)
            colour[rng.integers(0, 3)] = rng.choice([20.0, 235.0])  # saturated, never background-like
            y0, y1 = max(0, int(cy - r) - 1), min(s, int(cy + r) + 2)  # only the bounding box
            x0, x1 = max(0, int(cx - r) - 1), min(s, int(cx + r) + 2)
            box = img[y0:y1, x0:x1]
            box[_shape_mask(int(rng.integers(0, 4)), yy[y0:y1, x0:x1], xx[y0:y1, x0:x1], cy, cx, r)] = colour
        images[i] = np.clip(img, 0, 255).astype(np.uint8)
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels).long()


class OrdinalShapesDataModule(BaseDataModule):
    """Built-in, offline ordinal data: count the shapes (class ``c`` shows ``c + 1`` objects).

    Generated in memory at ``setup`` (deterministic in ``data_seed``); no files, no
    download.  The default of the main job (``configs/cloc/demo.yaml``) and of the
    fast tests.

    Args:
        num_classes: number of ranks (1..num_classes objects).
        train_size: images in the training split (balanced classes).
        val_size: images in the validation split (balanced classes).
        test_size: images in the test split (balanced classes).
        noise: standard deviation of the background noise (0..255 scale).
        data_seed: seed of the generator (splits use ``data_seed``, ``+1``, ``+2``).
        **kwargs: :class:`BaseDataModule` arguments (``batch_size``, ``image_size``
            (default 32), ``augment``, ``train_views``, ``few_shot``, ...).
    """

    task = "ordinal"
    default_mean = (0.5, 0.5, 0.5)
    default_std = (0.25, 0.25, 0.25)

    def __init__(
        self,
        num_classes: int = 6,
        train_size: int = 3000,
        val_size: int = 600,
        test_size: int = 600,
        noise: float = 24.0,
        data_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("image_size", 32)
        super().__init__(**kwargs)
        with config_errors():
            self.n_classes = check_int("num_classes", num_classes, 2)
            check_int("image_size", self.image_size, 16, hint="smaller shapes are not visible")
            for name, size in (("train_size", train_size), ("val_size", val_size), ("test_size", test_size)):
                check_int(name, size, 1, hint="images in the split")
            check_float("noise", noise, minimum=0.0, hint="standard deviation on the 0..255 scale, e.g. 24")
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.noise = noise
        self.data_seed = data_seed

    def discover_class_names(self) -> list[str]:
        return [f"{k} object{'s' if k > 1 else ''}" for k in range(1, self.n_classes + 1)]

    def build_base_sets(self) -> dict[str, LabelledDataset]:
        self.class_names = self.discover_class_names()
        out: dict[str, LabelledDataset] = {}
        for offset, (split, n) in enumerate(self.sizes.items()):
            images, labels = make_ordinal_shapes(n, self.n_classes, self.image_size, self.data_seed + offset, self.noise)
            out[split] = TensorImageDataset(images, labels.tolist())
        return out
