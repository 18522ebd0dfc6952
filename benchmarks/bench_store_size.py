"""How much a decode-once store smaller than the stored-size rule blurs the training views.

``data.cache`` stores the training images of a RandomResizedCrop pipeline with the aspect kept and
long side ``S`` (``StoreLayout("fit", S)``, :mod:`cloc_lightning.data.cache`); the rule
``fit_store_size`` picks ``S`` (166 px for the 64 px SimCLR views of the 200 px UTKFace faces) and
``data.cache_size`` overrides it.  A crop read from a smaller store has fewer source pixels than
output pixels and comes out blurred.  This benchmark measures by how much, as the loss of
**gradient energy** of the views: per view, the mean squared neighbour difference, vertical plus
horizontal terms (``mean(dy**2) + mean(dx**2)`` over channels and pixels), on pixels in ``[0, 1]``
(the views un-normalised with the data module's mean/std), exactly as
``tests/data/test_device_augment.py`` (``image_statistics``) defines it.

Set-up: ``configs/simclr/utkface.yaml``'s data module (``UTKFaceDataModule``, its ``image_size`` and
its ``train_views``, ``SupConViews`` with the config's crop scale, seed 0), restricted with
``few_shot: 64`` to a fixed sample of 512 training faces (64 per age group, hash order of the file
names), both views of each.  For every stored size ``S`` (the originals, the rule's size, 128, 96,
72, 64, 48, 32 px) one data module per path is built with ``cache: memory, cache_size: S``, and:

* **loader** (``augment_on: loader``): the data module's own ``train_set`` (torchvision's v2
  pipeline on the stored image, seeded per sample from ``(seed, epoch, index)``).  Its crop boxes
  are drawn in the *stored* image's pixels, so the same seed gives the same area fraction, aspect
  and flip at every ``S`` but not the same position (``torch.randint`` over a different range) nor
  the same integer rounding: identical boxes cannot be reused through the library here, so these
  rows compare the same draws, paired by sample.  Reference: ``cache: none`` (the files decoded by
  the loader, as without a store).
* **loader, same boxes**: the identical crops in the original's coordinates (the device path's
  boxes and flips, below) cut from the loader data module's stored image with torchvision's
  ``resized_crop`` (antialiased, as ``RandomResizedCrop``), each box mapped onto the stored image
  and rounded to its pixel grid (the loader path only crops whole pixels).  Reference: the same
  boxes on the originals.  Resolution only.
* **device** (``augment_on: device``): the data module's training loader and its
  ``on_after_batch_transfer`` (:mod:`cloc_lightning.data.device_augment`): crops drawn in the
  original image's pixels from ``(seed, epoch, index, view)`` alone and read from the stored pixels
  with ``roi_align``, so every ``S`` gets exactly the same crops and flips.  Reference: a
  200 px store (the originals' own pixels: nothing resized); ``cache: none`` would lay the images
  out at the rule's size on the fly.

The data module refuses a ``cache_size`` below the largest view (64 px): the 48 and 32 px stores are
built through a subclass whose ``store_layout`` returns ``fit`` at ``cache_size`` (only that method
changes; the store, the training set and the device path stay the library's).

Each path twice: **resolution only** (the config's views with ``jitter_p = grayscale_p = 0``: crop
and flip alone; same crops and flips as the full pipeline) and the **full pipeline** (the config's
views: colour jitter p 0.8, grayscale p 0.2; the colour draws are the same at every ``S``).
Per image the two views' energies are averaged; the relative loss is ``1 - mean(E_S) / mean(E_ref)``
over the 512 images with a paired bootstrap 95 % interval (2,000 resamples of the images, fixed
seed).  The ``vs loader originals`` column divides by the loader path's ``cache: none`` energy
(how a device-path view compares with what the loader path makes from the files).

``python -m benchmarks.bench_store_size`` (or ``python -m benchmarks --only store_size``) writes
``results/store_size.{md,json}``; ``--quick`` (``run(quick=True)``): 64 images, four sizes, writes
nothing.  Needs ``../shared/data/utkface``; about 3 minutes on 2 CPU cores.
"""

from __future__ import annotations

import gc
import importlib
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/simclr/utkface.yaml"
#: the stored sizes below the rule's, in px (long side); the originals and the rule's size come first
SIZES = (128, 96, 72, 64, 48, 32)
QUICK_SIZES = (72, 32)
PER_CLASS = 64  # few_shot: 8 age groups x 64 = 512 faces
QUICK_PER_CLASS = 8
BOOTSTRAP = 2000
SEED = 0  # the bootstrap's generator; the data module's seed is the config's (0)


# ----------------------------------------------------------------------------
# measure
# ----------------------------------------------------------------------------
def gradient_energy(views: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """Per view of ``[N, 3, H, W]`` normalised views: ``mean(dy**2) + mean(dx**2)`` of the pixels in ``[0, 1]``."""
    x = views.double() * torch.tensor(std, dtype=torch.float64).view(1, 3, 1, 1) + torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)
    dy, dx = x[..., 1:, :] - x[..., :-1, :], x[..., :, 1:] - x[..., :, :-1]
    return ((dy**2).mean(dim=(1, 2, 3)) + (dx**2).mean(dim=(1, 2, 3))).numpy()


def _config() -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load((REPO / CONFIG).read_text())
    return cfg


def _views_class(cfg: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    spec = cfg["data"]["init_args"]["train_views"]
    module, name = spec["class_path"].rsplit(".", 1)
    return getattr(importlib.import_module(module), name), dict(spec.get("init_args") or {})


def data_module(cfg: dict[str, Any], per_class: int, **overrides: Any) -> Any:
    """The config's data module (its views, image size, seed), on a fixed sample, with ``overrides`` (cache, path)."""
    data = cfg["data"]
    module, name = data["class_path"].rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    args = {k: v for k, v in data["init_args"].items() if k != "train_views"}
    args["root"] = str((REPO / args["root"]).resolve())
    views_cls, views_args = _views_class(cfg)
    args.update(
        train_views=views_cls(**views_args),
        seed=int(cfg.get("seed_everything", 0)),
        few_shot=per_class,
        num_workers=0,
        drop_last=False,
        pin_memory=False,
    )
    args.update(overrides)
    size = args.get("cache_size")
    if size is not None and size < max(spec.size for spec in args["train_views"].device_specs(int(args.get("image_size", 64)))):
        cls = _any_store_size(cls)
    dm = cls(**args)
    dm.setup("fit")
    return dm


def _any_store_size(cls: type) -> type:
    """``cls`` with its training store at ``cache_size`` even below the largest view, which the data module refuses.

    Only :meth:`~cloc_lightning.data.base.BaseDataModule.store_layout` changes (``fit``, long side ``cache_size``);
    building the store, the training set and the device path stay the library's.
    """
    from cloc_lightning.data.cache import StoreLayout

    class AnyStoreSize(cls):  # type: ignore[misc]
        def store_layout(self, split: str, base: Any) -> Any:
            if split == "train" and self.cache_size is not None:
                return StoreLayout("fit", self.cache_size)
            return super().store_layout(split, base)

    AnyStoreSize.__name__ = AnyStoreSize.__qualname__ = cls.__name__
    return AnyStoreSize


def _resolution_only(cfg: dict[str, Any]) -> Any:
    views_cls, views_args = _views_class(cfg)
    return views_cls(**{**views_args, "jitter_p": 0.0, "grayscale_p": 0.0})


def loader_energy(dm: Any, cfg: dict[str, Any]) -> dict[str, dict[int, float]]:
    """``{pipeline: {base index: mean energy of the views}}`` from the loader path's training set (full and resolution only)."""
    from cloc_lightning.data.datasets import TransformedSubset

    ts = dm.train_set
    res = TransformedSubset(ts.base, ts.indices, _resolution_only(cfg).build(dm.image_size, dm.mean, dm.std), seed=dm.seed)
    out: dict[str, dict[int, float]] = {"full": {}, "resolution": {}}
    for name, ds in (("full", ts), ("resolution", res)):
        for i in range(len(ds)):
            views, _ = ds[i]
            out[name][ds.indices[i]] = float(gradient_energy(torch.stack(views), dm.mean, dm.std).mean())
    return out


def device_energy(dm: Any, cfg: dict[str, Any]) -> tuple[dict[str, dict[int, float]], dict[int, Any]]:
    """As :func:`loader_energy` on the device path (the data module's loader and batch hook), and each sample's crops.

    The crops: ``{base index: (native (h, w), boxes [V, 4] x1 y1 x2 y2 in the original's pixels, flips [V])}``.
    """
    from cloc_lightning.data.device_augment import DeviceAugment

    res_aug = DeviceAugment(_resolution_only(cfg).device_specs(dm.image_size), dm.mean, dm.std, seed=dm.seed)
    out: dict[str, dict[int, float]] = {"full": {}, "resolution": {}}
    crops: dict[int, Any] = {}
    for batch in dm.train_dataloader():
        index, epoch = batch["index"].numpy(), batch["epoch"].numpy()
        assert (epoch == 0).all(), epoch
        native, stored = batch["native"].numpy(), batch["stored"].numpy()
        full_views, _ = dm.on_after_batch_transfer(batch, 0)
        res_views = res_aug.apply(batch["images"], res_aug.draw(index, epoch, native, stored))
        for name, views in (("full", full_views), ("resolution", res_views)):
            e = np.stack([gradient_energy(v, dm.mean, dm.std) for v in views]).mean(axis=0)
            out[name].update({int(i): float(v) for i, v in zip(index, e, strict=True)})
        # the same crops in the original's pixels (every group of this pipeline is one spec: view-major rows)
        p = res_aug.draw(index, epoch, native, native)
        B, V = len(index), res_aug.n_views
        boxes, flips = p["g0_boxes"][:, 1:].numpy().reshape(V, B, 4), p["g0_flip"].numpy().reshape(V, B)
        for b, i in enumerate(index):
            crops[int(i)] = (tuple(int(v) for v in native[b]), boxes[:, b], flips[:, b])
    return out, crops


def same_box_energy(dm: Any, crops: dict[int, Any]) -> dict[int, float]:
    """The loader path's torchvision crop of the same boxes (mapped onto the stored image, rounded) from ``dm``'s store."""
    from torchvision.transforms.v2 import functional as TF

    base, size = dm.train_set.base, dm.image_size
    out = {}
    for i, (native, boxes, flips) in crops.items():
        image = base.load(i)  # the stored image (its valid part): uint8 [3, h, w]; the file's pixels without a store
        if not isinstance(image, torch.Tensor):
            image = TF.pil_to_tensor(image)
        h, w = int(image.shape[-2]), int(image.shape[-1])
        sy, sx = h / native[0], w / native[1]
        views = []
        for (x1, y1, x2, y2), flip in zip(boxes, flips, strict=True):
            top, left = round(y1 * sy), round(x1 * sx)
            bh, bw = max(1, round(y2 * sy) - top), max(1, round(x2 * sx) - left)
            v = TF.resized_crop(image, top, left, bh, bw, [size, size], antialias=True)
            views.append(TF.horizontal_flip(v) if flip else v)
        x = torch.stack(views).double() / 255.0
        out[i] = float(gradient_energy(x, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)).mean())
    return out


def paired(a: dict[int, float], ref: dict[int, float], rng: np.random.Generator) -> dict[str, float]:
    """Mean energy of ``a`` with a bootstrap CI, and ``1 - mean(a) / mean(ref)`` (%) with a paired bootstrap CI."""
    keys = sorted(ref)
    assert sorted(a) == keys, "the two measurements cover different samples"
    x, y = np.array([a[k] for k in keys]), np.array([ref[k] for k in keys])
    idx = rng.integers(0, len(keys), size=(BOOTSTRAP, len(keys)))
    means = x[idx].mean(axis=1)
    loss = 100 * (1 - means / y[idx].mean(axis=1))
    return {
        "n": len(keys),
        "mean": float(x.mean()),
        "mean_lo": float(np.percentile(means, 2.5)),
        "mean_hi": float(np.percentile(means, 97.5)),
        "loss_pct": float(100 * (1 - x.mean() / y.mean())),
        "loss_lo": float(np.percentile(loss, 2.5)),
        "loss_hi": float(np.percentile(loss, 97.5)),
    }


def _store_info(dm: Any) -> dict[str, Any]:
    base = dm.train_set.base
    layout = getattr(base, "layout", None)
    info: dict[str, Any] = {
        "store": type(base).__name__,
        "layout": None if layout is None else [layout.mode, layout.size],
        "store_layout_overridden": type(dm).store_layout.__qualname__.startswith("_any_store_size"),
    }
    if hasattr(base, "stored_hw"):
        hw = np.asarray(base.stored_hw)[dm.train_set.indices]
        info["stored_hw"] = sorted({tuple(int(v) for v in r) for r in hw})
    return info


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(quick: bool = False, command: str = "python -m benchmarks --only store_size") -> tuple[str, dict[str, Any]]:
    """Measure every stored size on both paths; return ``(markdown, data)`` (and write results/store_size.* unless quick)."""
    from cloc_lightning.data.cache import fit_store_size, native_sizes

    t_start = time.perf_counter()
    torch.set_num_threads(1)  # per-sample torchvision is fastest on one thread; the store's decoding uses its own threads
    cfg = _config()
    per_class = QUICK_PER_CLASS if quick else PER_CLASS
    rng = np.random.default_rng(SEED)

    # references: the device path from a lossless (native-size) store, whose crops every size reuses; the loader path on the files
    dm = data_module(cfg, per_class, cache="none", augment_on="loader")
    files_base = dm.train_set.base
    specs = dm.train_view_specs()
    long, aspect = native_sizes(files_base)
    rule = fit_store_size([(s.size, s.scale[0], min(s.ratio[0], 1 / s.ratio[1])) for s in specs], long, aspect)
    layout = dm.store_layout("train", files_base)
    assert layout.mode == "fit" and layout.size == rule, (layout, rule)
    assert long is not None
    native_long = int(long)
    loader_ref = loader_energy(dm, cfg)

    dm_ref = data_module(cfg, per_class, cache="memory", cache_size=native_long, augment_on="device")
    info_ref = _store_info(dm_ref)
    device_ref, crops = device_energy(dm_ref, cfg)
    dm_ref = None  # free its store now
    gc.collect()
    # the reference store holds the originals' pixels: every stored size is its original size
    assert info_ref["stored_hw"] == sorted({c[0] for c in crops.values()}), (info_ref, "the reference store resized images")
    boxes_ref = same_box_energy(dm, crops)
    dm = None  # free its store now
    gc.collect()

    sizes: list[int | None] = [None, native_long, rule, *(QUICK_SIZES if quick else SIZES)]
    rows: list[dict[str, Any]] = []

    def add(S: int | None, path: str, pipeline: str, energy: dict[int, float], ref: dict[int, float], store: Any) -> None:
        r = paired(energy, ref, rng)
        r["reference"] = energy is ref
        vs_loader = paired(energy, loader_ref[pipeline], rng)
        rows.append(
            {
                "S": S,
                "path": path,
                "pipeline": pipeline,
                **r,
                "vs_loader_originals_pct": vs_loader["loss_pct"],
                "vs_loader_originals_lo": vs_loader["loss_lo"],
                "vs_loader_originals_hi": vs_loader["loss_hi"],
                "store": store,
            }
        )
        print(
            f"S={S!s:>4} {path:18s} {pipeline:10s} E={r['mean']:.5f} loss={r['loss_pct']:6.2f} % [{r['loss_lo']:.2f}, {r['loss_hi']:.2f}]",
            flush=True,
        )

    for S in sizes:
        if S is None:  # the files themselves: the references
            for pipeline in ("resolution", "full"):
                add(None, "loader", pipeline, loader_ref[pipeline], loader_ref[pipeline], {"store": "none (files)"})
            add(None, "loader, same boxes", "resolution", boxes_ref, boxes_ref, {"store": "none (files)"})
            continue
        dm = data_module(cfg, per_class, cache="memory", cache_size=S, augment_on="loader")
        lo, info = loader_energy(dm, cfg), _store_info(dm)
        boxes = same_box_energy(dm, crops)
        dm = None  # free its store now
        gc.collect()
        for pipeline in ("resolution", "full"):
            add(S, "loader", pipeline, lo[pipeline], loader_ref[pipeline], info)
        add(S, "loader, same boxes", "resolution", boxes, boxes_ref, info)
        if native_long == S:
            de, info = device_ref, info_ref
        else:
            dm = data_module(cfg, per_class, cache="memory", cache_size=S, augment_on="device")
            (de, crops_s), info = device_energy(dm, cfg), _store_info(dm)
            assert all(np.array_equal(crops_s[i][1], crops[i][1]) and np.array_equal(crops_s[i][2], crops[i][2]) for i in crops)
            dm = None  # free its store now
            gc.collect()
        for pipeline in ("resolution", "full"):
            add(S, "device", pipeline, de[pipeline], device_ref[pipeline], info)

    _, views_args = _views_class(cfg)
    data: dict[str, Any] = {
        "config": CONFIG,
        "image_size": int(cfg["data"]["init_args"].get("image_size", 64)),
        "train_views": cfg["data"]["init_args"]["train_views"],
        "views_scale": views_args.get("scale"),
        "seed": int(cfg.get("seed_everything", 0)),
        "images": len(crops),
        "per_class": per_class,
        "bootstrap": BOOTSTRAP,
        "native_long_side": native_long,
        "native_aspect": aspect,
        "rule_size": rule,
        "rule_layout": [layout.mode, layout.size],
        "gradient_energy": "per view mean(dy^2) + mean(dx^2) over channels and pixels, pixels in [0, 1] (views un-normalised); "
        "mean of the two views per image",
        "rows": rows,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": command,
        "quick": quick,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    md = render(data)
    if not quick:
        from benchmarks.harness import write_results

        write_results("store_size", md, data, command)
    return md, data


# ----------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------
def _size_label(S: int | None, data: dict[str, Any]) -> str:
    if S is None:
        return "none (the files)"
    notes = []
    if data["native_long_side"] == S:
        notes.append("originals' size: lossless")
    if data["rule_size"] == S:
        notes.append("the rule")
    if data["image_size"] > S:
        notes.append("below the view size*")
    return f"{S}" + (f" ({', '.join(notes)})" if notes else "")


def render(data: dict[str, Any]) -> str:
    from benchmarks.harness import markdown_table

    head = [
        "stored long side S (px)",
        "path",
        "pipeline",
        "mean gradient energy (x 1e-3) [95 % CI]",
        "loss vs the path's reference, % [95 % CI]",
        "loss vs loader path on the files, %",
    ]
    refs = {
        "loader": "`cache: none`",
        "loader, same boxes": "the same boxes on the files",
        "device": f"{data['native_long_side']} px store",
    }
    order = {"device": 0, "loader": 1, "loader, same boxes": 2}
    table = []
    for pipeline in ("resolution", "full"):
        for r in sorted((r for r in data["rows"] if r["pipeline"] == pipeline), key=lambda r: (order[r["path"]], -(r["S"] or 10**6))):
            ref = r["reference"]
            table.append(
                [
                    _size_label(r["S"], data),
                    r["path"],
                    "crop + flip only" if pipeline == "resolution" else "full (jitter, grayscale)",
                    f"{1e3 * r['mean']:.3f} [{1e3 * r['mean_lo']:.3f}, {1e3 * r['mean_hi']:.3f}]",
                    f"reference ({refs[r['path']]})" if ref else f"{r['loss_pct']:.1f} [{r['loss_lo']:.1f}, {r['loss_hi']:.1f}]",
                    f"{r['vs_loader_originals_pct']:.1f}",
                ]
            )

    def pick(S: int, path: str) -> str:
        r = next((r for r in data["rows"] if r["S"] == S and r["path"] == path and r["pipeline"] == "resolution"), None)
        return "-" if r is None else f"{r['loss_pct']:.1f} % [{r['loss_lo']:.1f}, {r['loss_hi']:.1f}]"

    summary = [
        [f"{S} px" + (" (rule)" if data["rule_size"] == S else ""), pick(S, "device"), pick(S, "loader"), pick(S, "loader, same boxes")]
        for S in sorted({r["S"] for r in data["rows"] if r["S"] is not None and r["S"] != data["native_long_side"]}, reverse=True)
    ]
    return "\n".join(
        [
            "# Stored image size and the sharpness of the training views",
            "",
            f"`{data['config']}`: {data['image_size']} px views, `{data['train_views']['class_path']}` with scale "
            f"{data['views_scale']}, seed {data['seed']}; {data['images']} UTKFace training faces "
            f"({data['per_class']} per age group, `few_shot`), {data['native_long_side']} px originals; both views of each. "
            f"The library's rule stores {data['rule_size']} px (`BaseDataModule.store_layout`, = `fit_store_size` of the views "
            "and `native_sizes`). Every store: `cache: memory, cache_size: S`, one data module per path and size.",
            "",
            f"Gradient energy of a view: {data['gradient_energy']}. Loss = 1 - mean(E_S) / mean(E_ref) over the images, "
            f"95 % intervals from a paired bootstrap over the images ({data['bootstrap']} resamples, fixed seed).",
            "",
            "Paths: **device** = `augment_on: device` (the data module's loader and `on_after_batch_transfer`): crops drawn in "
            "the original's pixels, read from the store with `roi_align`, so every S gets exactly the same crops and flips; "
            "reference: a store at the originals' size (their own pixels). **loader** = `augment_on: loader`, the data module's "
            "`train_set` (torchvision per sample, seeded from (seed, epoch, index)): its boxes are drawn in the *stored* image's "
            "pixels, so the same seed gives the same area, aspect and flip but not the same position or rounding (identical "
            "boxes cannot be reused through the library there); reference: `cache: none`. **loader, same boxes** = the device "
            "path's crops cut from the loader data module's store with torchvision's antialiased `resized_crop`, each box "
            "mapped onto the stored image and rounded to its pixel grid; reference: the same boxes on the files.",
            "",
            "Loss of gradient energy below the originals, crop + flip only (the resolution alone):",
            "",
            markdown_table(["store", "device path", "loader path (train_set)", "loader path, same boxes"], summary),
            "",
            markdown_table(head, table),
            "",
            f"\\* The data module refuses a `cache_size` below the largest view ({data['image_size']} px); these stores were built "
            "through a subclass of it whose `store_layout` returns `fit` at `cache_size` (the store, the training set and the "
            "device path stay the library's).",
            "",
            f"The last column divides by the loader path's energy on the files (same pipeline): roi_align's area filter is "
            "sharper than torchvision's antialiased resize, so the device path starts above the loader path. "
            f"Machine: {data['cores']} cores, {data['cpu']}, {data['threads']} torch thread. Command: `{data['command']}`; "
            f"wall time {data['wall_s']:.0f} s.",
            "",
        ]
    )


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    md, _ = run(quick=quick, command="python -m benchmarks.bench_store_size" + (" --quick" if quick else ""))
    print(md)
