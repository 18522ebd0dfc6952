"""LitData chunks (``data.stream_from``) beside ``data.cache: disk`` and the loader path: bytes per image and loader items/s per core.

Run with ``python -m benchmarks.bench_streaming`` (``--quick``: a few hundred symlinked images of the same data,
few repeats, writes nothing; ``--render-only``: rewrite ``results/streaming.md`` from ``results/streaming.json``,
measuring nothing).  Needs ``../shared/data`` (UTKFace and the CIFAR-10 JPEGs) and LitData.

For every shipped self-supervised config that runs on the shared data (:data:`CONFIGS`):

1. ``data optimize`` (:func:`cloc_lightning.data.optimize.optimize_data`, one writer: ``workers=1``, which LitData
   runs in this process) writes the config's splits in every :data:`FORMATS` (JPEG and WebP at quality
   :data:`QUALITY`), once per distinct data set and training layout (the three CIFAR-10 configs store the same
   32 px images, so they share one chunk set per format).  **Bytes per image** of the training split: the chunk
   files (LitData's item headers included) against the ``data.cache: disk`` store of the same layout
   (``images.u8``: one ``uint8 [3, S, S]`` slot per image) and against the original files; the first
   :data:`FIDELITY_IMAGES` training images of every format are decoded and compared with the store
   (max |difference|, PSNR).
2. **Items/s per loader core**: the real training loader of the data module (``dm.setup('fit')``,
   ``dm.train_dataloader()``, ``num_workers: 0``, one torch thread) over :data:`TRAIN_IMAGES` training images
   (``data.train_fraction``), for the loader path (``data.cache: none``: the original files decoded every epoch),
   ``data.cache: disk`` and the chunks in every format -- read as ``data.stream_from`` reads them (``ChunkSplit`` opens
   LitData's reader with ``batch_decode=0``: item by item) and with LitData's default ``batch_decode='auto'`` (the
   ``ChunkSplit``'s reader replaced by ``litdata.StreamingDataset(url, batch_decode="auto")`` before its first read) --
   each with ``augment_on: loader`` (torchvision makes the config's views in the loader) and ``augment_on: device``
   (the loader hands over ``uint8`` slots and the views' parameters; the views are made in ``on_after_batch_transfer``, which is timed as a case of its own, on this
   CPU, from batches of the disk store: it sees the same slots whatever the source).  All the cases of a config
   are timed interleaved in this process (each round runs every case once for :data:`BATCHES_PER_CASE` batches,
   the order rotated by one per round), so load drift hits them alike; items per second of wall time and items
   per CPU second of this process (every thread; the per-core figure under load) are reported as medians over
   the rounds, and the ratios chunks / disk and chunks / loader path as medians of the per-round ratios.

Every file involved (originals, stores, chunks) is in the page cache when timed: this is the CPU cost of
reading, not a cold disk or a network.  The machine's load is recorded: the 1-min load average before and
after and, per config, how many cores other processes kept busy during its timing (``/proc/stat`` minus this
process' CPU time).

Why the ``batch_decode='auto'`` rows: they show why the library reads item by item.  ``ChunkShuffleSampler`` reads a
chunk's items in random order, and LitData's default unpacks a block of items (``_auto_batch_rows`` in
``litdata/streaming/item_loader.py``: up to 256, about 16 MB of large ones) around every item it does not hold and keeps
only that block, so with the default nearly every shuffled read unpacks a block for one item (``results/streaming.md``
has the numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.harness import busy_jiffies

if TYPE_CHECKING:
    from cloc_lightning.data.optimize import ImageFormat

REPO = Path(__file__).resolve().parent.parent
#: the shipped self-supervised configs on the shared data (the others: CIFAR-10 pickles or STL-10, not in ../shared/data)
CONFIGS = (
    "configs/simclr/cifar10_cpu.yaml",
    "configs/supcon/cifar10_cpu.yaml",
    "configs/relic/cifar10_cpu.yaml",
    "configs/simclr/utkface.yaml",
)
FORMATS: tuple[ImageFormat, ...] = ("raw", "png", "jpeg", "webp")
QUALITY = 95
#: chunks read as ``data.stream_from`` reads them (``batch_decode=0``: each read deserialises the requested item alone), and
#: ``<format>-auto``: the same chunks with LitData's default, ``litdata.StreamingDataset(batch_decode="auto")``
CHUNK_SOURCES = (*FORMATS, *(f"{fmt}-auto" for fmt in FORMATS))
#: the sources of the training images, in the tables' order: the original files (``data.cache: none``), the store, the chunks
SOURCES = ("files", "disk", *CHUNK_SOURCES)
AUGMENT_ON = ("loader", "device")
TRAIN_IMAGES = 2000
FIDELITY_IMAGES = 200
BATCHES_PER_CASE = 2
ROUNDS = 9
SOURCE_LABELS = {
    "files": "loader path (`data.cache: none`, original files)",
    "disk": "`data.cache: disk` (uint8 memory map)",
    "raw": "chunks, raw",
    "png": "chunks, png",
    "jpeg": f"chunks, jpeg q{QUALITY}",
    "webp": f"chunks, webp q{QUALITY}",
    **{
        f"{fmt}-auto": f"chunks, {fmt}{f' q{QUALITY}' if fmt in ('jpeg', 'webp') else ''}, LitData's default `batch_decode='auto'`"
        for fmt in FORMATS
    },
}


# ----------------------------------------------------------------------------------------------------------------
# the data modules
# ----------------------------------------------------------------------------------------------------------------
def data_module(config: str, overrides: dict[str, Any]) -> Any:
    """The data module of ``config``'s ``data`` section with ``--data.<key> <value>`` overrides (as ``data optimize`` builds it)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from cloc_lightning.data.base import BaseDataModule

    parser = ArgumentParser(default_env=False, exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_subclass_arguments(BaseDataModule, "data", required=True)
    for key in ("model", "trainer", "optimizer", "lr_scheduler", "ckpt_path", "seed_everything"):  # a fit config's other sections
        parser.add_argument(f"--{key}", type=Any, default=None)
    argv = ["--config", str(REPO / config)]
    for key, value in overrides.items():
        argv += [f"--data.{key}", str(value)]
    return parser.instantiate(parser.parse_args(argv)).data


def _subset_root(root: Path, dest: Path, per_folder: int) -> Path:
    """``--quick``: a copy of ``root`` of symlinks to the first ``per_folder`` images (sorted) of every folder (made once)."""
    if dest.is_dir():
        return dest
    for folder, _, files in os.walk(root):
        images = sorted(f for f in files if f.lower().endswith((".jpg", ".jpeg", ".png")))[:per_folder]
        if not images:
            continue
        target = dest / Path(folder).relative_to(root)
        target.mkdir(parents=True, exist_ok=True)
        for name in images:
            (target / name).symlink_to(Path(folder) / name)
    return dest


def _endless(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def _describe_batch(batch: Any) -> str:
    """What the loader hands over: ``views x [B, 3, h, w] dtype`` or the device path's ``uint8`` slots and parameters."""
    if isinstance(batch, dict):
        images = batch["images"]
        params = batch.get("params")
        what = f"{len(params)} parameter tensors" if isinstance(params, dict) else type(params).__name__
        return f"{str(images.dtype).replace('torch.', '')} {list(images.shape)} + {what}"
    x = batch[0]
    views = x if isinstance(x, (list, tuple)) else [x]
    shapes = sorted({str(list(v.shape)) for v in views})
    return f"{len(views)} view(s) {', '.join(shapes)} {str(views[0].dtype).replace('torch.', '')}"


# ----------------------------------------------------------------------------------------------------------------
# the load of the machine
# ----------------------------------------------------------------------------------------------------------------


class _OtherCores:
    """Average number of cores that processes other than this one kept busy between construction and :meth:`stop`."""

    def __init__(self) -> None:
        self.wall, self.own, self.jiffies = time.perf_counter(), sum(os.times()[:2]), busy_jiffies()

    def stop(self) -> float | None:
        jiffies = busy_jiffies()
        if jiffies is None or self.jiffies is None:
            return None
        machine = (jiffies - self.jiffies) / os.sysconf("SC_CLK_TCK")
        own = sum(os.times()[:2]) - self.own
        return round(max(0.0, machine - own) / max(time.perf_counter() - self.wall, 1e-9), 2)


def _load() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


# ----------------------------------------------------------------------------------------------------------------
# 1. the chunk sets: bytes per image, fidelity, the cost of writing them
# ----------------------------------------------------------------------------------------------------------------
def _quietly(fn: Callable[[], Any]) -> Any:
    """``fn()`` with LitData's progress output captured (shown when it fails)."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            return fn()
    except Exception:
        print(out.getvalue()[-4000:])
        raise


def write_chunk_sets(dm: Any, root: Path, formats: tuple[ImageFormat, ...] = FORMATS) -> dict[str, Any]:
    """``data optimize`` of ``dm`` in every format (one writer), timed; ``{format: {out, seconds, splits}}``."""
    from cloc_lightning.data.optimize import optimize_data

    sets: dict[str, Any] = {}
    for fmt in formats:
        out = root / fmt
        t0 = time.perf_counter()
        _quietly(partial(optimize_data, dm, str(out), image_format=fmt, quality=QUALITY, workers=1))
        seconds = time.perf_counter() - t0
        splits = {split: json.loads((out / split / "cloc_split.json").read_text()) for split in ("train", "val", "test")}
        sets[fmt] = {
            "out": str(out),
            "seconds": round(seconds, 2),
            "images": sum(int(m["n"]) for m in splits.values()),
            "train": {"n": int(splits["train"]["n"]), "bytes": int(splits["train"]["bytes"]), "chunks": len(splits["train"]["chunks"])},
            "all_splits_bytes": sum(int(m["bytes"]) for m in splits.values()),
        }
    return sets


def fidelity(chunks_out: str, store: Any, n: int) -> dict[str, Any]:
    """The first ``n`` training images of a chunk set against the ``data.cache: disk`` store: max |diff| and PSNR (dB)."""
    from cloc_lightning.data.streaming import ChunkSplit

    url = os.path.join(chunks_out, "train")
    meta = json.loads(Path(url, "cloc_split.json").read_text())
    split = ChunkSplit(url, meta)
    sq, count, worst = 0.0, 0, 0
    for position in range(min(n, len(split))):
        a = split.load(position).to(torch.int32)
        b = store.load(int(meta["source_index"][position])).to(torch.int32)
        if a.shape != b.shape:
            raise AssertionError(f"{url} sample {position}: shape {tuple(a.shape)}, the store's {tuple(b.shape)}")
        d = a - b
        sq += float((d * d).sum())
        count += d.numel()
        worst = max(worst, int(d.abs().max()))
    mse = sq / max(count, 1)
    return {"max_abs_diff": worst, "psnr_db": None if mse == 0 else round(10 * math.log10(255**2 / mse), 2), "images": min(n, len(split))}


def optimize_workers_aside(dm: Any, root: Path) -> dict[str, float]:
    """One split (``val``, jpeg) written with ``workers=1`` (LitData in this process) and ``workers=2`` (spawned writers): seconds."""
    from cloc_lightning.data.optimize import optimize_data

    seconds: dict[str, float] = {}
    for workers in (1, 2):
        out = root / f"workers{workers}"
        t0 = time.perf_counter()
        _quietly(partial(optimize_data, dm, str(out), image_format="jpeg", workers=workers, splits=["val"]))
        seconds[str(workers)] = round(time.perf_counter() - t0, 2)
    seconds["images"] = int(json.loads((root / "workers1" / "val" / "cloc_split.json").read_text())["n"])
    return seconds


# ----------------------------------------------------------------------------------------------------------------
# 2. the training loader: items per second, interleaved
# ----------------------------------------------------------------------------------------------------------------
def time_rounds(cases: dict[str, Callable[[], int]], rounds: int, warmup: int = 1) -> dict[str, dict[str, list[float]]]:
    """Every case once per round, the order rotated by one per round; per case the items/s of wall time and of CPU time."""
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    out: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            items = cases[name]()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            out[name]["wall"].append(items / wall)
            out[name]["cpu"].append(items / max(cpu, 1e-9))
    return out


def _case(loader: Any, batches: int, batch_size: int) -> Callable[[], int]:
    it = _endless(loader)

    def case() -> int:
        for _ in range(batches):
            next(it)
        return batches * batch_size

    return case


def measure_config(
    config: str, common: dict[str, Any], store_dir: Path, chunks: dict[str, Any], rounds: int, batches: int
) -> dict[str, Any]:
    """The training loader of ``config`` from every source, with the views on the loader and on the device, interleaved."""
    cases: dict[str, Callable[[], int]] = {}
    variants: dict[str, Any] = {}
    disk_device: Any = None
    for aug in AUGMENT_ON:
        for src in SOURCES:
            over = {**common, "augment_on": aug}
            if src == "disk":
                over.update(cache="disk", cache_dir=str(store_dir))
            elif src in CHUNK_SOURCES:
                over["stream_from"] = chunks[src.removesuffix("-auto")]["out"]
            dm = _quietly(partial(data_module, config, over))
            _quietly(partial(dm.setup, "fit"))
            if src.endswith("-auto"):  # before the first read: ChunkSplit keeps the reader it finds
                import litdata

                split = dm._ensure_base()["train"]
                # ChunkSplit._dataset's reader but for batch_decode (LitData's default); whole chunks, as ChunkSplit reads them
                split._ds = litdata.StreamingDataset(split.url, batch_decode="auto")
                split._ds._on_demand_bytes = False
            loader = dm.train_dataloader()
            first = next(iter(loader))
            if src in CHUNK_SOURCES:  # the reader that served the batch decodes as its label says
                reader = dm._ensure_base()["train"]._ds
                expected = "auto" if src.endswith("-auto") else 0
                if getattr(reader, "batch_decode", None) != expected:
                    raise AssertionError(f"{config} {src}: the chunk reader has batch_decode {getattr(reader, 'batch_decode', None)!r}")
            variants[f"{aug}|{src}"] = {
                "dm": dm,
                "batch": _describe_batch(first),
                "sampler": type(loader.sampler).__name__,
                "train_images": len(dm.train_set),
            }
            if aug == "device" and src == "disk":
                disk_device = (dm, first)
            cases[f"{aug}|{src}"] = _case(loader, batches, dm.batch_size)
    dm, batch = disk_device
    cases["device stage"] = lambda: (dm.on_after_batch_transfer(batch, 0), dm.batch_size)[1]
    variants["device stage"] = {"batch": _describe_batch(dm.on_after_batch_transfer(batch, 0))}
    before, other = _load(), _OtherCores()
    timings = time_rounds(cases, rounds)
    other_cores, after = other.stop(), _load()
    result: dict[str, Any] = {"load_average_1m": [before, after], "other_processes_cores": other_cores, "cases": {}}
    for name, t in timings.items():
        result["cases"][name] = {
            **{k: v for k, v in variants[name].items() if k != "dm"},
            "items_per_s": _summary(t["wall"]),
            "items_per_cpu_s": _summary(t["cpu"]),
            "rounds": t,
        }
    result["ratios"] = {}
    for aug in AUGMENT_ON:
        for src in CHUNK_SOURCES:
            for ref in ("disk", "files"):
                mine, theirs = timings[f"{aug}|{src}"], timings[f"{aug}|{ref}"]
                result["ratios"][f"{aug}|{src}/{ref}"] = {
                    key: round(statistics.median(a / b for a, b in zip(mine[key], theirs[key], strict=True)), 3) for key in ("wall", "cpu")
                }
    store = variants["loader|disk"]["dm"]._stored["train"]
    result["store"] = {"folder": store.folder, "images": len(store), "bytes": Path(store.folder, "images.u8").stat().st_size}
    result["_store"] = store
    return result


def _summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": round(statistics.median(values), 1), "q25": round(q[0], 1), "q75": round(q[2], 1), "n": len(values)}


# ----------------------------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    found = {}
    for package in ("torch", "torchvision", "litdata", "pillow", "numpy", "lightning", "jsonargparse"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), with "virtual machine" when the CPU flags say so."""
    model, virtual = "", False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and " hypervisor" in line:
                    virtual = True
    except OSError:
        pass
    return (model or platform.processor() or platform.machine()) + (" (virtual machine)" if virtual else "")


def run(quick: bool = False) -> tuple[str, dict[str, Any]]:
    """Write the chunk sets, measure bytes and the loaders; return ``(markdown, data)`` (full runs write ``results/streaming.{md,json}``)."""
    from cloc_lightning.data.cache import store_key

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cwd = os.getcwd()
    os.chdir(REPO)  # the configs name ../shared/data relative to the repository
    train_images = 64 if quick else TRAIN_IMAGES
    rounds = 2 if quick else ROUNDS
    batches = 1 if quick else BATCHES_PER_CASE
    data: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores ({platform.machine()}, {platform.system()})",
        "versions": _versions(),
        "quick": quick,
        "load_average_1m_start": _load(),
        "conditions": {
            "train_images": train_images,
            "rounds": rounds,
            "batches_per_case": batches,
            "torch_threads": 1,
            "num_workers": 0,
            "quality": QUALITY,
            "optimize_workers": 1,
            "chunk_bytes": "64MB (data optimize's default)",
        },
        "datasets": {},
        "configs": {},
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench_streaming-") as tmp:
            root = Path(tmp)
            store_dir = root / "stores"
            datasets: dict[str, Any] = {}
            for config in CONFIGS:
                print(f"streaming: {config}", flush=True)
                common: dict[str, Any] = {"num_workers": 0, "seed": 0}
                if quick:
                    source = Path(data_module(config, {}).root).resolve()
                    common["root"] = str(_subset_root(source, root / "subsets" / source.name, 120))
                    common["batch_size"] = 32
                dm0 = _quietly(partial(data_module, config, dict(common)))
                train = dm0._ensure_base()["train"]
                layout = dm0.store_layout("train", train)
                key = f"{store_key(train, layout, 'the train split')}-{dm0.image_size}"
                common["train_fraction"] = round(min(1.0, train_images / len(train)), 6)
                if key not in datasets:
                    print(f"streaming: data optimize ({', '.join(FORMATS)}) of {dm0.data_source()}", flush=True)
                    files = [str(f) for f in train.files]
                    datasets[key] = {
                        "name": f"{type(dm0).__name__} ({Path(str(dm0.root)).name}), {layout.describe()}",
                        "source": dm0.data_source(),
                        "configs": [],
                        "train_split_images": len(train),
                        "original_bytes_per_image": sum(os.path.getsize(f) for f in files) / len(files),
                        "chunks": write_chunk_sets(dm0, root / "chunks" / key),
                    }
                    if not quick and not data.get("optimize_workers"):
                        data["optimize_workers"] = {"data": datasets[key]["name"], **optimize_workers_aside(dm0, root / "aside")}
                datasets[key]["configs"].append(config)
                print(f"streaming: timing the training loaders of {config}", flush=True)
                res = measure_config(config, common, store_dir, datasets[key]["chunks"], rounds, batches)
                store = res.pop("_store")
                if "store_bytes_per_image" not in datasets[key]:
                    datasets[key]["store_bytes_per_image"] = res["store"]["bytes"] / res["store"]["images"]
                    datasets[key]["fidelity"] = {
                        fmt: fidelity(datasets[key]["chunks"][fmt]["out"], store, 16 if quick else FIDELITY_IMAGES) for fmt in FORMATS
                    }
                res["train_fraction"] = common["train_fraction"]
                res["data"] = key
                data["configs"][config] = res
            data["datasets"] = datasets
        data["load_average_1m_end"] = _load()
        data["wall_s"] = round(time.perf_counter() - start, 1)
        md = render(data)
        if not quick:  # a smoke run never overwrites the published numbers
            from benchmarks.harness import write_results

            write_results("streaming", md, data, "python -m benchmarks.bench_streaming")
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return md, data


# ----------------------------------------------------------------------------------------------------------------
# the tables
# ----------------------------------------------------------------------------------------------------------------
def _bytes(n: float) -> str:
    return f"{n / 1024:,.1f} KiB" if n >= 1024 else f"{n:,.0f} B"


def render(data: dict[str, Any]) -> str:
    from benchmarks.harness import markdown_table

    c = data["conditions"]
    parts = [
        "### LitData chunks (`data.stream_from`) vs `data.cache: disk` vs the loader path",
        "",
        f"Machine: {data['machine']}, shared with other jobs; 1-min load average {data['load_average_1m_start']} at the start, "
        f"{data['load_average_1m_end']} at the end; run took {data['wall_s']:.0f} s"
        f"{' (smoke run: a few hundred symlinked images)' if data['quick'] else ''}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in data["versions"].items())
        + ".",
        *(["", data["note"]] if data.get("note") else []),
        "",
        "#### Bytes per training image",
        "",
        f"`data optimize` with one writer (`--workers 1`), chunks of {c['chunk_bytes']}, JPEG/WebP at quality {c['quality']}, "
        "PNG at `compress_level=1` (optimize's setting). Chunk bytes include LitData's per-item header (index, label, sizes, "
        f"codec). Fidelity: the first {FIDELITY_IMAGES if not data['quick'] else 16} training images decoded from the chunks "
        "against the `data.cache: disk` store (the same layout), max |difference| in uint8 levels and PSNR. "
        "`optimize s`: wall time of `data optimize` for all three splits of that format (one-time cost).",
        "",
    ]
    rows = []
    for ds in data["datasets"].values():
        orig, store = ds["original_bytes_per_image"], ds["store_bytes_per_image"]
        name = f"{ds['name']}, {ds['train_split_images']:,} training images"
        rows.append([name, "original files", _bytes(orig), f"{orig / store:.2f}", "1.00", "", ""])
        rows.append(["", "`data.cache: disk` store (uint8)", _bytes(store), "1.00", f"{store / orig:.2f}", "exact", ""])
        for fmt in FORMATS:
            ch = ds["chunks"][fmt]
            per = ch["train"]["bytes"] / ch["train"]["n"]
            fid = ds["fidelity"][fmt]
            exact = fid["max_abs_diff"] == 0
            rows.append(
                [
                    "",
                    SOURCE_LABELS[fmt],
                    _bytes(per),
                    f"{per / store:.3f}",
                    f"{per / orig:.2f}",
                    "exact" if exact else f"{fid['psnr_db']:.1f} dB (max {fid['max_abs_diff']})",
                    f"{ch['seconds']:.1f} ({ch['images']:,} images)",
                ]
            )
    parts.append(
        markdown_table(
            ["data (training split)", "stored as", "bytes / image", "/ store", "/ original files", "vs the store", "optimize s"], rows
        )
    )
    aside = data.get("optimize_workers")
    if aside:
        parts += [
            "",
            f"Writers: the {aside['images']:,}-image val split of {aside['data']} as jpeg took {aside['1']:.1f} s with `--workers 1` "
            f"(LitData writes in the calling process) and {aside['2']:.1f} s with `--workers 2` (spawned writer processes: "
            "start-up and shut-down dominate on a split this small); `--workers` defaults to the CPUs (at most 8).",
        ]
    parts += [
        "",
        "#### Training loader throughput per loader core",
        "",
        f"Items/s of `dm.train_dataloader()` after `dm.setup('fit')`, `num_workers: 0`, 1 torch thread, {c['train_images']:,} "
        f"training images (`data.train_fraction`), the config's own views and batch size; {c['rounds']} interleaved rounds of "
        f"{c['batches_per_case']} batch(es) per case after one untimed round; medians (inter-quartile range). **CPU** = items "
        "per CPU second of this process (the per-core figure, insensitive to other jobs); wall = items per second of wall time. "
        "Ratios: medians of the per-round ratios of the CPU figures. Chunks rows: read as `data.stream_from` reads them "
        "(`ChunkSplit` opens LitData's reader with `batch_decode=0`: every read deserialises its own item alone); "
        "`batch_decode='auto'` rows: the same chunks, the `ChunkSplit`'s reader replaced by "
        "`litdata.StreamingDataset(url, batch_decode='auto')` (LitData's default: a block of up to 256 items unpacked around "
        "every read it does not hold). `augment_on: device`: the loader's share only (uint8 slots + parameters); the views are made by `on_after_batch_transfer`, timed separately on this CPU (last line of each "
        "config; on a GPU it is the device's work, not the loader's).",
        "",
    ]
    head = [
        "config",
        "source",
        "views on the loader: CPU items/s",
        "wall items/s",
        "/ disk",
        "/ loader path",
        "views on the device: loader CPU items/s",
        "wall items/s",
        "/ disk",
        "/ loader path",
    ]
    rows = []
    for config, res in data["configs"].items():
        cases, ratios = res["cases"], res["ratios"]
        for src in SOURCES:
            row = [f"`{config}`" if src == SOURCES[0] else "", SOURCE_LABELS[src]]
            for aug in AUGMENT_ON:
                case = cases[f"{aug}|{src}"]
                cpu, wall = case["items_per_cpu_s"], case["items_per_s"]
                row += [f"{cpu['median']:,.0f} ({cpu['q25']:,.0f}-{cpu['q75']:,.0f})", f"{wall['median']:,.0f}"]
                if src in CHUNK_SOURCES:
                    row += [f"{ratios[f'{aug}|{src}/disk']['cpu']:.2f}", f"{ratios[f'{aug}|{src}/files']['cpu']:.2f}"]
                else:
                    row += [
                        "1.00" if src == "disk" else f"{_median_ratio(res, aug, src, 'disk'):.2f}",
                        "1.00" if src == "files" else f"{_median_ratio(res, aug, src, 'files'):.2f}",
                    ]
            rows.append(row)
        stage = cases["device stage"]
        rows.append(
            [
                "",
                "device stage (`on_after_batch_transfer`) on this CPU",
                "",
                "",
                "",
                "",
                f"{stage['items_per_cpu_s']['median']:,.0f}",
                f"{stage['items_per_s']['median']:,.0f}",
                "",
                "",
            ]
        )
    parts.append(markdown_table(head, rows))
    load_rows = []
    for config, res in data["configs"].items():
        some = next(iter(res["cases"].values()))
        load_rows.append(
            [
                f"`{config}`",
                f"{res['train_fraction']:.4f} ({some['train_images']:,} images)",
                str(res["cases"]["loader|jpeg"]["sampler"]),
                res["cases"]["loader|jpeg"]["batch"],
                res["cases"]["device|jpeg"]["batch"],
                f"{res['load_average_1m'][0]} / {res['load_average_1m'][1]}",
                str(res["other_processes_cores"]),
            ]
        )
    parts += [
        "",
        markdown_table(
            [
                "config",
                "train_fraction",
                "chunk sampler",
                "a batch, views on the loader",
                "a batch, views on the device (loader output)",
                "1-min load before / after",
                "other processes' cores during the timing",
            ],
            load_rows,
        ),
        "",
    ]
    parts += ["#### When to use which", "", *conclusion(data), ""]
    return "\n".join(parts)


def _span(values: list[float], fmt: str = ".2f") -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"


def conclusion(data: dict[str, Any]) -> list[str]:
    """The "when to use which" paragraphs, every figure taken from ``data`` (ranges over the configs or data sets)."""
    configs, datasets = list(data["configs"].values()), list(data["datasets"].values())

    def vs(aug: str, src: str, ref: str) -> list[float]:
        return [r["ratios"][f"{aug}|{src}/{ref}"]["cpu"] if src in CHUNK_SOURCES else _median_ratio(r, aug, src, ref) for r in configs]

    def chunk_rows(aug: str, ref: str, suffix: str = "") -> list[float]:
        """Every format's chunks read as shipped (``suffix=""``) or with LitData's default (``"-auto"``) against ``ref``."""
        return [v for fmt in FORMATS for v in vs(aug, f"{fmt}{suffix}", ref)]

    def rel(aug: str, a: str, b: str) -> list[float]:
        return [_median_ratio(r, aug, a, b) for r in configs]

    def size(ds: dict[str, Any], fmt: str) -> float:
        return float(ds["chunks"][fmt]["train"]["bytes"] / ds["chunks"][fmt]["train"]["n"])

    def psnr(fmt: str) -> str:
        return _span([ds["fidelity"][fmt]["psnr_db"] for ds in datasets], ".1f")

    of_store = {fmt: [size(ds, fmt) / ds["store_bytes_per_image"] for ds in datasets] for fmt in FORMATS}
    of_files = {fmt: [size(ds, fmt) / ds["original_bytes_per_image"] for ds in datasets] for fmt in FORMATS}
    webp_bytes = [size(ds, "webp") / size(ds, "jpeg") for ds in datasets]
    png_bytes = [size(ds, "png") / size(ds, "jpeg") for ds in datasets]
    webp_speed = {aug: rel(aug, "webp", "jpeg") for aug in AUGMENT_ON}
    png_speed = {aug: rel(aug, "png", "jpeg") for aug in AUGMENT_ON}
    webp_write = [ds["chunks"]["webp"]["seconds"] / ds["chunks"]["jpeg"]["seconds"] for ds in datasets]
    auto = [f"{fmt}-auto" for fmt in FORMATS]

    def cpu(r: dict[str, Any], aug: str, src: str) -> float:
        return float(r["cases"][f"{aug}|{src}"]["items_per_cpu_s"]["median"])

    auto_slowest = all(
        max(cpu(r, aug, src) for src in auto) < min(cpu(r, aug, src) for src in SOURCES if src not in auto)
        for r in configs
        for aug in AUGMENT_ON
    )
    item_gain = {aug: [v for fmt in FORMATS for v in rel(aug, fmt, f"{fmt}-auto")] for aug in AUGMENT_ON}
    window_cost = statistics.median(rel("device", "raw", "raw-auto"))
    below_refs = max(chunk_rows("loader", "files", "-auto") + chunk_rows("device", "files", "-auto")) < 1
    if auto_slowest:
        verdict = "are the slowest source in every config: "
    elif below_refs:
        verdict = "are slower than the disk store and the loader path in every config: "
    elif min(item_gain["loader"] + item_gain["device"]) > 1:
        verdict = "are slower than read item by item in every config and format: "
    else:
        verdict = "give "
    if window_cost > 1.5:  # LitData's default decode window is what reading item by item saves
        read = (
            "**`data.stream_from` reads chunks item by item** (`ChunkSplit` opens LitData's reader with `batch_decode=0`), "
            f"and these numbers are why: read with LitData's default `batch_decode='auto'`, the same chunks {verdict}"
            f"{_span(chunk_rows('loader', 'disk', '-auto'))} of the disk store's items per CPU second and "
            f"{_span(chunk_rows('loader', 'files', '-auto'))} of the loader path with the views on the loader, "
            f"{_span(chunk_rows('device', 'disk', '-auto'))} of the store and {_span(chunk_rows('device', 'files', '-auto'))} of "
            f"the loader path with the views on the device; read item by item they give {_span(item_gain['loader'])}x the "
            f"default's items/s with the views on the loader and {_span(item_gain['device'])}x with the views on the device. The "
            f"read is the cause, not the decoding: raw chunks (nothing to decode) reach {_span(vs('device', 'raw', 'disk'))} of "
            f"the store read item by item, {_span(vs('device', 'raw-auto', 'disk'))} with the default. `ChunkShuffleSampler` "
            "visits a chunk's items in random order (shuffled within windows of 4 chunks), and LitData's default unpacks a "
            "block of up to 256 items (about 16 MB of large ones: `_auto_batch_rows` in `litdata/streaming/item_loader.py`) "
            "around every item it does not hold, keeping only that block, so nearly every shuffled read unpacks a fresh block "
            "for one item. The rest of this section is about the chunks as shipped."
        )
    else:
        read = (
            "Chunks read item by item (as `data.stream_from` reads them: `batch_decode=0`) and with LitData's default "
            f"`batch_decode='auto'` are close (raw, views on the device: {window_cost:.2f}x the default's items/s, median over "
            "the configs): these numbers do not show the cost of LitData's decode window for which the library reads item by item."
        )
    others = [v for aug in AUGMENT_ON for src in SOURCES if src != "disk" for v in vs(aug, src, "disk")]
    fastest = "the fastest source in every config" if max(others) < 1 else f"within {1 - max(others):.0%} of the fastest source"
    smaller = [
        f"{fmt} on {ds['name'].split(' (')[1].split(')')[0]}"
        for ds in datasets
        for fmt in FORMATS
        if size(ds, fmt) < ds["original_bytes_per_image"]
    ]
    files_bytes = "fewer bytes than any chunk format" if not smaller else f"fewer bytes than every chunk format but {', '.join(smaller)}"
    raw_speed = {aug: rel(aug, "raw", "jpeg") for aug in AUGMENT_ON}
    lines = [
        read,
        "",
        f"- **`data.cache: disk`** (or `memory`) is {fastest}: {_span(vs('loader', 'disk', 'files'))}x "
        f"the loader path's items/s with the views on the loader, {_span(vs('device', 'disk', 'files'))}x with the views on the "
        f"device, where the loader only copies stored pixels. It costs {_span([ds['store_bytes_per_image'] / ds['original_bytes_per_image'] for ds in datasets])}x "
        "the original files' bytes (uint8 pixels at the stored size). Use it whenever the store fits the node's disk or memory.",
        f"- **Chunks** (`data.stream_from`, per-item reads) are for data that does not fit a node's disk or lives in object "
        f"storage: jpeg q{QUALITY} stores {_span(of_store['jpeg'])} of the store's bytes ({_span(of_files['jpeg'])}x the original "
        f"files), and its loader runs at {_span(vs('loader', 'jpeg', 'disk'))} of the store's speed and "
        f"{_span(vs('loader', 'jpeg', 'files'))}x the loader path's with the views on the loader (the views dominate there), "
        f"{_span(vs('device', 'jpeg', 'disk'))} of the store and {_span(vs('device', 'jpeg', 'files'))}x the loader "
        "path with the views on the device (every item is decoded, as from the original files). Chunks replace the store on "
        "bytes, not on speed.",
        f"- **The loader path** (`data.cache: none`) needs no preparation and reads {files_bytes} (the originals are "
        f"JPEGs already), at {_span(vs('loader', 'files', 'disk'))} of the store's speed with the views on the loader and "
        f"{_span(vs('device', 'files', 'disk'))} with the views on the device.",
        f"- **Format.** jpeg q{QUALITY}: {psnr('jpeg')} dB against the store. webp q{QUALITY}: {_span([1 - b for b in webp_bytes], '.0%')} "
        f"fewer bytes than jpeg at {psnr('webp')} dB, its loader {_span(webp_speed['loader'])}x jpeg's items/s with the views on "
        f"the loader and {_span(webp_speed['device'])}x with the views on the device, `data optimize` {_span(webp_write, '.1f')}x "
        f"jpeg's time. png: lossless, {_span(png_bytes, '.1f')}x jpeg's bytes, its loader {_span(png_speed['loader'])}x / "
        f"{_span(png_speed['device'])}x jpeg's. raw: exact, its loader {_span(raw_speed['loader'])}x / "
        f"{_span(raw_speed['device'])}x jpeg's, at the store's size ({_span(of_store['raw'], '.3f')}x with LitData's item "
        "headers), where `data.cache: disk` is as large and faster.",
    ]
    webp_cost = statistics.median(webp_speed["loader"] + webp_speed["device"])
    if webp_cost < 0.97 and all(b > 1 for b in png_bytes):
        lines.append(
            f"- **Default.** The numbers support jpeg q{QUALITY} as the default: webp q{QUALITY} saves "
            f"{_span([1 - b for b in webp_bytes], '.0%')} of the bytes, but its loader gives {_span(webp_speed['loader'])}x / "
            f"{_span(webp_speed['device'])}x jpeg's items/s (views on the loader / on the device), its writing takes "
            f"{_span(webp_write, '.1f')}x as long and it is further from the store ({psnr('webp')} vs {psnr('jpeg')} dB); png is "
            "larger than jpeg everywhere. Choose webp when the bytes kept or moved are the limit (object storage over a slow "
            "link, a disk budget) and the loader has CPU to spare; png or raw only where the views must be bit-identical to "
            "`data.cache`'s."
        )
    else:
        lines.append(
            f"- **Default.** The numbers do not single out jpeg q{QUALITY}: webp's loader gives {webp_cost:.2f}x jpeg's items/s "
            f"(median over the configs and both view placements) at {_span([1 - b for b in webp_bytes], '.0%')} fewer bytes; "
            f"weigh the fidelity ({psnr('webp')} vs {psnr('jpeg')} dB) before keeping jpeg as the default."
        )
    aside = data.get("optimize_workers")
    if aside:
        lines.append(
            f"- **Writing.** One writer (`--workers 1`, in the calling process) wrote the {aside['images']:,}-image split in "
            f"{aside['1']:.1f} s, two spawned writers in {aside['2']:.1f} s (one measurement on this machine); `--workers` defaults "
            "to the CPUs, so small machines and small splits are better served by `--workers 1`."
        )
    return lines


def _median_ratio(res: dict[str, Any], aug: str, num: str, den: str) -> float:
    a, b = res["cases"][f"{aug}|{num}"]["rounds"]["cpu"], res["cases"][f"{aug}|{den}"]["rounds"]["cpu"]
    return float(statistics.median(x / y for x, y in zip(a, b, strict=True)))


def render_only() -> str:
    """Rewrite ``results/streaming.md`` from ``results/streaming.json`` (the run's own header: date, machine, load); the markdown."""
    from benchmarks.harness import RESULTS_DIR

    payload = json.loads((RESULTS_DIR / "streaming.json").read_text())
    env, command = payload["environment"], payload["command"]
    load = f"; 1-min load average {env['load_average_1m']} on {env['cpu_count']} cores" if env.get("load_average_1m") is not None else ""
    header = (  # as benchmarks.harness.write_results writes it, from the measuring run's environment
        f"<!-- produced by: {command} -->\n\nMeasured {env['date']} on {env['cuda'] or 'CPU'} "
        f"(torch {env['torch']}, {env['torch_threads']} threads{load}).\n\n"
    )
    md = render(payload["results"])
    (RESULTS_DIR / "streaming.md").write_text(header + md + "\n")
    return md


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred symlinked images, two rounds (smoke run, writes nothing)")
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite results/streaming.md from results/streaming.json (measures nothing)"
    )
    args = parser.parse_args()
    print(render_only() if args.render_only else run(quick=args.quick)[0])
