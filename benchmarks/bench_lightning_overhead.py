"""Lightning training step vs a plain PyTorch loop on the same model and batches; EMA update with ``_foreach`` ops.

Run with ``python -m benchmarks.bench_lightning_overhead`` (``--quick`` for a small smoke run that
writes nothing).  Goal (issue 7): a Lightning training step no more than 5 % slower than a plain
PyTorch loop on the same model and batch; the EMA update uses ``torch._foreach`` ops.

**Step overhead.**  The model is a :class:`~cloc_lightning.methods.CLOCModule` (CE + CLOC on the
logits, Adam, per-step cosine schedule, learnable margins in their own optimiser group) on
``32 x 32`` images, batch 64, for two backbones: ``resnet18`` (11 M parameters; the goal's case)
and timm's ``test_resnet`` (0.4 M; a short step, where a fixed per-step cost weighs most).

* ``lightning``: ``Trainer.fit`` on CPU (no logger, checkpointing, progress bar or sanity
  validation; everything else as users get it: the module's ``self.log`` calls, its
  :class:`~cloc_lightning.callbacks.CLOCMarginPlot` callback, automatic optimisation with a
  closure, the scheduler stepped by Lightning).
* ``plain``: a hand-written loop over the *same* ``DataLoader``: backbone, head, the same loss
  expression, ``zero_grad`` / ``backward`` / ``step`` and the same ``LambdaLR`` schedule, with the
  optimiser built from the module's own ``param_groups()`` / ``build_optimizer()``.

* ``lightning_unlogged``: the same Lightning loop on a subclass whose ``self.log`` /
  ``self.log_dict`` do nothing, which separates the cost of Lightning's logging from its loop.

All start every round from the same weights with a fresh optimiser, so they perform the same
arithmetic (checked: their per-step losses agree in every round).  A round is one epoch of
``steps`` batches per implementation, the order rotating between rounds (interleaved repeats).
The time of a step is the time between the ends of consecutive optimiser steps (the loop's
fetch, hooks, logging and bookkeeping included), on two clocks: wall time and the CPU time of
this process (with 1 torch thread the whole step runs in this process, so CPU time measures
the work itself even when other processes compete for the cores).  A round's first step
(which also creates Adam's state) is left out, the median over all other steps of all rounds
is reported.  Trainer construction and ``setup`` happen before the timed epoch.

**EMA update.**  ``target = m * target + (1 - m) * online`` over every parameter and floating-point
buffer (integer buffers copied), as ReLIC's target network: one ``torch._foreach_lerp_`` over all
tensors vs a Python loop of per-tensor ``lerp_``, and ReLICModule's own update
(:func:`cloc_lightning.nn.ema.ema_update_`, ``_foreach`` per dtype group, with its shape
checks) when it is importable.  All variants must produce the same target (checked).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from benchmarks.harness import Stats, markdown_table, time_interleaved, write_results
from cloc_lightning.methods import CLOCModule
from cloc_lightning.methods.optim import lr_factor

GOAL_OVERHEAD = 0.05
BATCH = 64
IMAGE = 32
N_CLASSES = 8
BACKBONES = ("resnet18", "test_resnet")
EMA_MOMENTUM = 0.99
#: the step loops compared: plain PyTorch, Lightning, Lightning with the module's self.log calls disabled
STEP_IMPLS = ("plain", "lightning", "lightning_unlogged")
#: self.log calls in CLOCModule.training_step (loss, ce, cloc, acc; + the margins every 10 steps)
LOG_CALLS_PER_STEP = 4


# --------------------------------------------------------------------------------------------
# Lightning vs plain PyTorch
# --------------------------------------------------------------------------------------------


def make_model(backbone: str, seed: int = 0, log: bool = True) -> CLOCModule:
    """The benchmarked module (same weights for a given seed); ``log=False``: its ``self.log`` calls do nothing."""
    torch.manual_seed(seed)
    cls = CLOCModule if log else _UnloggedCLOCModule
    return cls(num_classes=N_CLASSES, backbone=backbone, optimizer="adam", lr=1e-3, scheduler="cosine")


class _UnloggedCLOCModule(CLOCModule):
    """The same module with ``self.log`` / ``self.log_dict`` as no-ops (to attribute the overhead)."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        return None

    def log_dict(self, *args: Any, **kwargs: Any) -> None:
        return None


def make_batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` fixed batches of ``[BATCH, 3, IMAGE, IMAGE]`` images and labels in ``[0, N_CLASSES)``."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g), torch.randint(0, N_CLASSES, (BATCH,), generator=g)) for _ in range(steps)]


def make_loader(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> DataLoader:
    """A ``DataLoader`` yielding the pre-made batches in order (shared by both loops)."""
    return DataLoader(batches, batch_size=None, shuffle=False, num_workers=0)


def _now() -> tuple[float, float]:
    """(wall clock, CPU time of this process) in seconds."""
    return time.perf_counter(), time.process_time()


def _intervals(marks: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(wall, CPU) seconds between consecutive marks."""
    return [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(marks)]


class _StepClock(L.Callback):
    """Records the clocks (:func:`_now`) at the start of the epoch and after every optimiser step, and the losses."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []
        self.losses: list[float] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.marks = [_now()]

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.marks.append(_now())
        self.losses.append(float(outputs["loss"].detach()))


def lightning_epoch(model: CLOCModule, loader: DataLoader, steps: int, root: str) -> tuple[list[tuple[float, float]], list[float]]:
    """One timed epoch of ``Trainer.fit``; returns (per-step (wall, CPU) seconds, per-step losses)."""
    clock = _StepClock()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        max_steps=steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[clock],
    )
    trainer.fit(model, train_dataloaders=loader)
    return _intervals(clock.marks), clock.losses


def plain_epoch(model: CLOCModule, loader: DataLoader, steps: int) -> tuple[list[tuple[float, float]], list[float]]:
    """The same epoch as a hand-written PyTorch loop; returns (per-step (wall, CPU) seconds, per-step losses)."""
    h = model.hparams
    optimizer = model.build_optimizer([g for g in model.param_groups() if g["params"]])
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, steps, float(steps), h.scheduler, h.warmup_epochs, h.min_lr_ratio)
    )
    model.train()
    marks, losses = [_now()], []
    for x, y in loader:
        features = model.backbone(x)
        logits = model.head(features)
        loss = F.cross_entropy(logits.float(), y) + h.loss_weight * model.cloc_loss(model.cloc_embedding(features, logits), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        marks.append(_now())
        losses.append(float(loss.detach()))
    return _intervals(marks), losses


def _stats(seconds: list[float]) -> Stats:
    ms = [s * 1e3 for s in seconds]
    q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0]] * 3
    return Stats(statistics.median(ms), q[0], q[2], len(ms))


def step_overhead(backbone: str, steps: int, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of Lightning vs plain epochs on ``backbone``; per-step statistics."""
    init = make_model(backbone).state_dict()
    batches = make_batches(steps)
    impls = list(STEP_IMPLS)
    times: dict[str, list[float]] = {k: [] for k in impls}
    cpu_times: dict[str, list[float]] = {k: [] for k in impls}
    max_loss_diff = 0.0
    with tempfile.TemporaryDirectory() as root:
        for r in range(rounds + 1):  # round 0 warms everything up and is not counted
            losses: dict[str, list[float]] = {}
            order = impls[r % len(impls) :] + impls[: r % len(impls)]
            for impl in order:
                model = make_model(backbone, log=impl != "lightning_unlogged")
                model.load_state_dict(init)
                loader = make_loader(batches)
                if impl == "plain":
                    dt, losses[impl] = plain_epoch(model, loader, steps)
                else:
                    dt, losses[impl] = lightning_epoch(model, loader, steps, root)
                if len(dt) != steps:
                    raise RuntimeError(f"{impl} ran {len(dt)} steps instead of {steps}")
                if r > 0:
                    times[impl].extend(w for w, _ in dt[1:])  # the first step also builds the optimiser state
                    cpu_times[impl].extend(c for _, c in dt[1:])
            diff = max(abs(a - b) for impl in impls for a, b in zip(losses[impl], losses["plain"], strict=True))
            max_loss_diff = max(max_loss_diff, diff)
    stats = {k: _stats(v) for k, v in times.items()}
    cpu = {k: _stats(v) for k, v in cpu_times.items()}
    n_params = sum(p.numel() for p in make_model(backbone).parameters())
    return {
        "backbone": backbone,
        "parameters": n_params,
        "steps_per_round": steps,
        "rounds": rounds,
        "time_ms": {k: vars(v) for k, v in stats.items()},
        "overhead": stats["lightning"].median_ms / stats["plain"].median_ms - 1.0,
        "overhead_ms": stats["lightning"].median_ms - stats["plain"].median_ms,
        "overhead_unlogged": stats["lightning_unlogged"].median_ms / stats["plain"].median_ms - 1.0,
        "overhead_unlogged_ms": stats["lightning_unlogged"].median_ms - stats["plain"].median_ms,
        "log_calls_per_step": LOG_CALLS_PER_STEP,
        "cpu_ms": {k: vars(v) for k, v in cpu.items()},
        "cpu_overhead": cpu["lightning"].median_ms / cpu["plain"].median_ms - 1.0,
        "cpu_overhead_ms": cpu["lightning"].median_ms - cpu["plain"].median_ms,
        "cpu_overhead_unlogged": cpu["lightning_unlogged"].median_ms / cpu["plain"].median_ms - 1.0,
        "cpu_overhead_unlogged_ms": cpu["lightning_unlogged"].median_ms - cpu["plain"].median_ms,
        "max_abs_loss_diff": max_loss_diff,
    }


# --------------------------------------------------------------------------------------------
# EMA update
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def ema_update_foreach(target: nn.Module, online: nn.Module, momentum: float) -> None:
    """``target = momentum * target + (1 - momentum) * online`` with ``_foreach`` ops.

    Parameters and floating-point buffers are lerped by one ``torch._foreach_lerp_``; integer
    buffers (BatchNorm's ``num_batches_tracked``) are copied.  The semantics of
    :func:`cloc_lightning.nn.ema.ema_update_`.
    """
    t_all = list(target.parameters()) + list(target.buffers())
    o_all = list(online.parameters()) + list(online.buffers())
    floats = [(t, o.detach()) for t, o in zip(t_all, o_all, strict=True) if t.is_floating_point()]
    for t, o in zip(t_all, o_all, strict=True):
        if not t.is_floating_point():
            t.copy_(o)
    torch._foreach_lerp_([t for t, _ in floats], [o for _, o in floats], 1.0 - momentum)


@torch.no_grad()
def ema_update_loop(target: nn.Module, online: nn.Module, momentum: float) -> None:
    """The same update as :func:`ema_update_foreach`, one Python-level op per tensor."""
    for t, o in zip(list(target.parameters()) + list(target.buffers()), list(online.parameters()) + list(online.buffers()), strict=True):
        if t.is_floating_point():
            t.lerp_(o.detach(), 1.0 - momentum)
        else:
            t.copy_(o)


def _relic_update() -> Callable[[nn.Module, nn.Module, float], None] | None:
    """ReLICModule's own EMA update (:func:`cloc_lightning.nn.ema.ema_update_`) as ``fn(target, online, momentum)``."""
    try:
        from cloc_lightning.nn.ema import ema_update_
    except ImportError:
        return None
    return lambda target, online, momentum: ema_update_([online], [target], momentum)


def ema_timing(backbone: str, repeats: int) -> dict[str, Any]:
    """Interleaved timing of the EMA variants on a ``backbone`` online/target pair; agreement checked."""
    online = make_model(backbone).backbone
    target = copy.deepcopy(online)
    with torch.no_grad():
        for t in list(online.parameters()) + list(online.buffers()):
            t.add_(1 if not t.is_floating_point() else 0.01)
    cases: dict[str, Callable[[], Any]] = {
        "foreach": lambda: ema_update_foreach(target, online, EMA_MOMENTUM),
        "loop": lambda: ema_update_loop(target, online, EMA_MOMENTUM),
    }
    relic_fn = _relic_update()
    if relic_fn is not None:
        cases["relic"] = lambda: relic_fn(target, online, EMA_MOMENTUM)
    # every variant computes the same thing from the same start
    start = copy.deepcopy(target.state_dict())
    results = {}
    for name, fn in cases.items():
        target.load_state_dict(start)
        fn()
        results[name] = [t.clone() for t in target.state_dict().values()]
    max_diff = max(
        float((a.double() - b.double()).abs().max()) if a.is_floating_point() else 0.0
        for name in results
        for a, b in zip(results[name], results["loop"], strict=True)
    )
    target.load_state_dict(start)
    stats = time_interleaved(cases, repeats=repeats, warmup=3)
    return {
        "backbone": backbone,
        "parameters": sum(p.numel() for p in online.parameters()),
        "tensors": sum(1 for _ in online.parameters()) + sum(1 for _ in online.buffers()),
        "time_ms": {k: vars(v) for k, v in stats.items()},
        "speedup_foreach_vs_loop": stats["loop"].median_ms / stats["foreach"].median_ms,
        "max_abs_diff_vs_loop": max_diff,
    }


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------


def run(quick: bool = False, threads: int | None = 1) -> tuple[str, dict[str, Any]]:
    """Run the benchmark; return (markdown, data).

    The full run writes ``benchmarks/results/lightning_overhead.{md,json}``; ``quick=True`` uses
    few steps and rounds and writes nothing.  ``threads`` sets ``torch.set_num_threads`` (``None``:
    torch's default); 1 by default, as the other CPU benchmarks, because 2 OpenMP threads on the
    project's 2 shared cores make step times erratic.
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    level = logging.getLogger("lightning.pytorch").level
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            warnings.filterwarnings("ignore", ".*number of training batches.*")
            return _run(quick)
    finally:
        logging.getLogger("lightning.pytorch").setLevel(level)
        torch.set_num_threads(previous)


def _run(quick: bool) -> tuple[str, dict[str, Any]]:
    plan = {"resnet18": (4, 2), "test_resnet": (6, 2)} if quick else {"resnet18": (12, 6), "test_resnet": (30, 6)}
    overhead = {bb: step_overhead(bb, *plan[bb]) for bb in BACKBONES}
    ema = {bb: ema_timing(bb, repeats=10 if quick else 50) for bb in ("resnet18", "resnet50", "test_resnet")}
    data: dict[str, Any] = {
        "case": {
            "model": "CLOCModule (CE + CLOC on logits, Adam, cosine)",
            "batch": BATCH,
            "image": IMAGE,
            "classes": N_CLASSES,
            "threads": torch.get_num_threads(),
            "ema_momentum": EMA_MOMENTUM,
        },
        "step": overhead,
        "ema": ema,
        "goal_overhead": GOAL_OVERHEAD,
    }

    def cell(t: dict[str, float]) -> str:
        return f"{t['median_ms']:.1f} ({t['q25_ms']:.1f}-{t['q75_ms']:.1f})"

    rows = []
    for bb, res in overhead.items():
        for clock, key, pre in (("wall", "time_ms", ""), ("CPU", "cpu_ms", "cpu_")):
            t = res[key]
            ratio, diff = res[f"{pre}overhead"], res[f"{pre}overhead_ms"]
            met = "met" if ratio <= GOAL_OVERHEAD else "NOT met"
            rows.append(
                [
                    f"{bb} ({res['parameters'] / 1e6:.1f} M)",
                    clock,
                    cell(t["plain"]),
                    cell(t["lightning"]),
                    f"{diff:+.2f} ms = {100 * ratio:+.1f} %",
                    f"<= +{100 * GOAL_OVERHEAD:.0f} %: {met}" + ("" if not quick else " (smoke run)"),
                    cell(t["lightning_unlogged"]),
                    f"{res[f'{pre}overhead_unlogged_ms']:+.2f} ms = {100 * res[f'{pre}overhead_unlogged']:+.1f} %",
                    f"{res['max_abs_loss_diff']:.1e}",
                ]
            )
    step_table = markdown_table(
        [
            "backbone",
            "clock",
            "plain PyTorch ms/step (IQR)",
            "Lightning ms/step (IQR)",
            "Lightning - plain",
            "goal",
            "Lightning, self.log off, ms/step",
            "(self.log off) - plain",
            "max |loss diff|",
        ],
        rows,
    )
    ema_rows = []
    for bb, res in ema.items():
        t = res["time_ms"]
        ema_rows.append(
            [
                f"{bb} ({res['parameters'] / 1e6:.1f} M, {res['tensors']} tensors)",
                f"{t['loop']['median_ms']:.3f}",
                f"{t['foreach']['median_ms']:.3f}",
                f"{res['speedup_foreach_vs_loop']:.2f}x",
                f"{t['relic']['median_ms']:.3f}" if "relic" in t else "n/a",
                f"{res['max_abs_diff_vs_loop']:.1e}",
            ]
        )
    ema_table = markdown_table(
        ["model", "per-tensor loop ms", "`_foreach` ms", "loop / foreach", "ReLICModule's update ms", "max |diff|"],
        ema_rows,
    )
    steps_note = ", ".join(f"{bb}: {overhead[bb]['rounds']} rounds x {overhead[bb]['steps_per_round']} steps" for bb in BACKBONES)
    md = (
        f"### Lightning training step vs plain PyTorch (CLOCModule, batch {BATCH}, {IMAGE} px, CPU, "
        f"{torch.get_num_threads()} torch thread(s))\n\n"
        f"Median time per optimiser step over interleaved rounds ({steps_note}; the first step of each round "
        f"and a warm-up round left out; Adam, cosine schedule, loss = CE + CLOC on the logits). Every loop starts "
        f"each round from the same weights and performs the same arithmetic: the last column is the largest "
        f"difference of their per-step losses. *self.log off*: the same Lightning loop with the module's "
        f"`self.log`/`self.log_dict` calls made no-ops ({LOG_CALLS_PER_STEP} per step, + the {N_CLASSES - 1} "
        f"margins every 10th step), which separates the cost of Lightning's logging from that of its loop. "
        f"*wall*: elapsed time; *CPU*: CPU time of this process over the same intervals (with 1 torch thread all "
        f"the work of a step runs in this process, so CPU time measures the work itself and stays meaningful "
        f"when other processes compete for the cores, which inflates and scatters wall times; see the load "
        f"average in the JSON's environment).\n\n"
        f"{step_table}\n\n"
        f"### EMA target update (momentum {EMA_MOMENTUM}; parameters and float buffers lerped, integer buffers copied)\n\n"
        f"Median of interleaved repeats, {torch.get_num_threads()} torch thread(s).\n\n{ema_table}\n"
    )
    if not quick:
        write_results("lightning_overhead", md, data, "python -m benchmarks.bench_lightning_overhead")
    return md, data


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps and rounds (smoke run, writes nothing)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the run (default 1; 0 = torch default)")
    args = parser.parse_args()
    print(run(quick=args.quick, threads=args.threads or None)[0])
