"""Training-step throughput of every method: ours (real ``Trainer.fit``) vs a plain PyTorch loop, SimCLR vs lightly;
the data pipeline per loader core; colour jitter on the loader vs on a batch on the device.

Run with ``python -m benchmarks --only throughput`` (or ``python -m benchmarks.bench_throughput``;
``--quick`` for a smoke run that writes nothing).  Goals (issue 28, on a GPU): our training
step within 5 % of a plain PyTorch loop of the same model, loss and optimiser
(images/s ratio ours/plain >= 0.95), and our SimCLR at least as fast as a lightly-based one.

**Sizes.**  With CUDA available (or ``--device cuda``) the full sizes: ResNet-18 at 32 px
(CIFAR stem, as ``configs/*/cifar10.yaml``) and at 64 px (as ``configs/*/utkface.yaml``),
ResNet-50 at 224 px, batch 256, two views per image for SupCon, SimCLR and ReLIC.  On CPU
(2 shared cores here) a small size: ResNet-18 at 32 px without the CIFAR stem, batch 32, one
torch thread; ``--quick``: timm's ``test_resnet`` (0.4 M parameters), batch 8.

**Ours** is the method's LightningModule (``cloc_lightning.methods``) trained by a real
``lightning.Trainer``: ``Trainer.fit`` with a TensorBoard logger (``log_every_n_steps`` 10),
the module's own callbacks (``configure_callbacks``: LR monitor, resume state, CLOC's margin
plot), automatic optimisation, the per-step LR schedule, the finite-loss checks, the online
probe / kNN bank of the pre-training methods and ReLIC's EMA update (``optimizer_step``).
No checkpointing, progress bar or validation (they do not run per step).

**Plain** is a loop written here on the same networks (deep copies of the module's backbone,
head, projector, probe and, for ReLIC, target networks, with the same weights), the same
loss objects (``cloc_lightning.losses``, the settings the module uses) and the same optimiser
class and hyper-parameters with a ``LambdaLR`` schedule: forward, loss (+ the probe's
cross-entropy on detached features where the module has a probe), ``zero_grad`` (before the forward, as
Lightning) / ``backward`` / ``step``, schedule step, and for ReLIC the EMA update of the target
(``torch._foreach_lerp_``, BYOL's cosine schedule, Grill et al. 2020, sec. 3.2) and a kNN
feature bank.  It logs nothing and keeps the losses as device tensors (read after the round).

**lightly** (SimCLR only): a LightningModule written here on lightly's parts
(``SimCLRProjectionHead`` without BatchNorm, i.e. the same ``d -> d -> 128`` MLP as ours,
``NTXentLoss`` at T = 0.5, ``OnlineLinearClassifier`` on the detached features), the same
backbone and SGD settings, trained by the same ``Trainer`` configuration.  When lightly is
not importable its row says so.

**Timing.**  A round is one ``Trainer.fit`` (or plain epoch) of ``steps`` batches, already on
the device, per implementation; the order rotates between rounds (interleaved), a warm-up
round is not counted.  The clock (with ``torch.cuda.synchronize`` on CUDA) is read after
the first and after the last optimiser step of a round, so the first step (optimiser state,
cuDNN autotuning) is left out and the device runs asynchronously in between, as in
training.  Images/s = ``batch * (steps - 1) / time`` (images = dataset items; a two-view
method processes twice as many views); medians over rounds, with the inter-quartile range.
On CUDA ``torch.cuda.max_memory_allocated`` during a round (minus what was allocated
before it) is recorded.  In the warm-up round ours and plain start from identical weights:
their first losses must agree (checked, reported).

**Data pipeline.**  Each method's training transform of the shipped configs (one item:
PIL decode with ``ImageFileDataset.load``, then the views), timed in this process with one
torch thread, as one loader worker runs it: CIFAR-10 JPEGs (32 px) and UTKFace JPEGs
(200 px, for 64 px) from ``../shared/data`` (or ``$CLOC_BENCH_DATA``), generated 500x375
JPEGs for 224 px (and wherever the shared data is absent).  Items/s per core tells how
many loader workers a step rate needs.  **Colour jitter**: SupCon's colour augmentation
(``ColorJitter(0.4, 0.4, 0.4, 0.1)`` with p 0.8, grayscale p 0.2) per image on the loader
(torchvision v2 on a uint8 image) vs the data path's ``DeviceAugment`` on a uint8 batch on
the device (per-sample factors and order, as torchvision draws them).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import logging
import math
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from benchmarks.harness import markdown_table, time_interleaved, write_results
from experiments.provenance import provenance

GOAL_RATIO_PLAIN = 0.95  # ours/plain images/s: within 5 %
GOAL_RATIO_LIGHTLY = 1.0  # ours/lightly images/s
LOG_EVERY_N_STEPS = 10
METHODS = ("ce", "cloc", "supcon", "simclr", "relic", "linear_probe", "ordinal_clip")
#: views per image in the training batch
VIEWS = {"supcon": 2, "simclr": 2, "relic": 2}
#: classes of the labels (CIFAR-10-like for the nominal methods, 8 age bins for CLOC, 80 ages for OrdinalCLIP)
N_CLASSES = {"ce": 10, "cloc": 8, "supcon": 10, "simclr": 10, "relic": 10, "linear_probe": 10, "ordinal_clip": 80}
ORDINAL = {"cloc", "ordinal_clip"}
LABELS = {
    "ce": "CE",
    "cloc": "CLOC (mm, on logits)",
    "supcon": "SupCon",
    "simclr": "SimCLR",
    "relic": "ReLIC (2 global views)",
    "linear_probe": "LinearProbe (frozen encoder)",
    "ordinal_clip": "OrdinalCLIP (timm encoder, 80 rank prompts)",
}
DATA_ENV = "CLOC_BENCH_DATA"


@dataclass(frozen=True)
class StepSize:
    """One benchmarked size: backbone, image side, CIFAR stem, batch (images), steps per round, timed rounds."""

    backbone: str
    image: int
    cifar_stem: bool
    batch: int
    steps: int
    rounds: int

    @property
    def label(self) -> str:
        return f"{self.backbone}{' (CIFAR stem)' if self.cifar_stem else ''} @ {self.image} px, batch {self.batch}"


#: the sizes of a plan: ``cuda`` (the issue's), ``cpu`` (small, 2 shared cores), ``quick`` (smoke)
PLANS: dict[str, tuple[StepSize, ...]] = {
    "cuda": (
        StepSize("resnet18", 32, True, 256, 10, 3),
        StepSize("resnet18", 64, False, 256, 10, 3),
        StepSize("resnet50", 224, False, 256, 5, 2),
    ),
    "cpu": (StepSize("resnet18", 32, False, 32, 5, 6),),
    "quick": (StepSize("test_resnet", 32, False, 8, 3, 1),),
}
#: data pipeline of each plan: {image size: items per timed chunk} (224 px ReLIC items take ~0.5 s each), repeats
PIPELINE_PLAN: dict[str, tuple[dict[int, int], int]] = {
    "cuda": ({32: 24, 64: 12, 224: 3}, 5),
    "cpu": ({32: 24, 64: 12, 224: 3}, 5),
    "quick": ({32: 4}, 2),
}
#: seconds the whole run may take when nothing else is said (``budget_s`` / ``$CLOC_BENCH_BUDGET_S``); None = the full plan
DEFAULT_BUDGET_S: dict[str, float | None] = {"cuda": 180.0, "cpu": None, "quick": None}
#: environment variables read for the budget, in order (the second is the GPU script's, .ci/gpu/run.sh)
BUDGET_ENV = ("CLOC_BENCH_BUDGET_S", "CLOC_GPU_BENCH_BUDGET")
#: seconds of a budget kept for what the plan cannot steer: imports before ``run``, writing the results
BUDGET_SAFETY_S = 15.0
#: seconds of a budget kept for the data-pipeline and augmentation tables
PIPELINE_RESERVE_S = {"cuda": 30.0, "cpu": 60.0, "quick": 5.0}
#: a case is skipped when its share of the remaining budget is below this (a warm-up and one timed round need more)
MIN_CASE_S = {"cuda": 3.0, "cpu": 10.0, "quick": 1.0}


# --------------------------------------------------------------------------------------------
# the modules (ours), as the shipped configs build them
# --------------------------------------------------------------------------------------------


def make_module(method: str, size: StepSize, n_classes: int | None = None) -> L.LightningModule:
    """Our LightningModule of ``method`` at ``size`` with the settings of its shipped configs (seeded)."""
    from cloc_lightning import methods as M

    c = n_classes or N_CLASSES[method]
    task = "ordinal" if method in ORDINAL else "nominal"
    common: dict[str, Any] = {"backbone": size.backbone, "cifar_stem": size.cifar_stem}
    torch.manual_seed(0)
    if method == "ce":  # configs/ce/cifar10.yaml (SGD, cosine); lr for a short random-data run
        return M.CEModule(num_classes=c, task=task, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, scheduler="cosine", **common)
    if method == "cloc":  # configs/cloc/utkface.yaml
        return M.CLOCModule(
            num_classes=c,
            task=task,
            margin_mode="mm",
            loss_weight=1.0,
            cloc_on="logits",
            optimizer="adam",
            lr=1e-3,
            weight_decay=1e-4,
            scheduler="cosine",
            **common,
        )
    if method in ("supcon", "simclr"):  # configs/{supcon,simclr}/cifar10.yaml: SGD, cosine, online probe
        return M.SupConModule(method=method, num_classes=c, task=task, n_views=2, projector_dim=128, lr=0.05, **common)
    if method == "relic":  # configs/relic/cifar10.yaml with 2 global views, no local ones
        return M.ReLICModule(num_classes=c, task=task, num_global_views=2, num_local_views=0, **common)
    if method == "linear_probe":  # configs/linear_probe/cifar10.yaml; a random encoder stands for stage one's
        return M.LinearProbeModule(
            num_classes=c, task=task, encoder_info={"backbone": size.backbone, "cifar_stem": size.cifar_stem}, lr=0.1
        )
    if method == "ordinal_clip":  # configs/ordinal_clip/utkface.yaml (timm encoder, rank prompts on a random CLIP text tower)
        return M.OrdinalCLIPModule(
            num_classes=c,
            task=task,
            clip_model="ViT-S-32-alt",
            pretrained=None,
            image_encoder="timm",
            head="prompts",
            logit_scale=4.6052,
            optimizer="radam",
            lr=1e-3,
            scheduler="cosine",
            **common,
        )
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


# --------------------------------------------------------------------------------------------
# the plain PyTorch loops (independent of the modules' training code)
# --------------------------------------------------------------------------------------------


def _cosine(total: int) -> Callable[[int], float]:
    """Per-step cosine multiplier of the base learning rate over ``total`` steps (Loshchilov & Hutter 2017)."""
    return lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, total) / max(1, total)))


def _optimizer(name: str, groups: list[dict[str, Any]], lr: float, weight_decay: float, momentum: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "radam":  # decoupled weight decay, as OrdinalCLIP's reference RAdam
        return torch.optim.RAdam(groups, lr=lr, weight_decay=weight_decay, decoupled_weight_decay=True)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    return cls(groups, lr=lr, weight_decay=weight_decay)


class _PlainProbe(nn.Module):
    """A linear probe on detached features: ``BatchNorm1d`` without affine parameters, then ``Linear``."""

    def __init__(self, dim: int, n_classes: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(dim, affine=False)
        self.fc = nn.Linear(dim, n_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(features.detach().float()))


def _probe_from(module: Any) -> _PlainProbe | None:
    """A :class:`_PlainProbe` with the weights of the module's online probe (``None`` without one)."""
    probe = getattr(module, "probe", None)
    if probe is None:
        return None
    plain = _PlainProbe(probe.classifier.in_features, probe.classifier.out_features)
    plain.fc.load_state_dict(probe.classifier.state_dict())
    if probe.norm is not None:
        plain.norm.load_state_dict(probe.norm.state_dict())
    else:
        plain.norm = nn.Identity()  # type: ignore[assignment]
    return plain


@torch.no_grad()
def ema_update(online: Sequence[torch.Tensor], target: Sequence[torch.Tensor], beta: float) -> None:
    """``target = beta * target + (1 - beta) * online`` (floats: one ``_foreach_lerp_``); integer buffers copied."""
    floats = [(t, o) for t, o in zip(target, online, strict=True) if t.is_floating_point()]
    for t, o in zip(target, online, strict=True):
        if not t.is_floating_point():
            t.copy_(o)
    torch._foreach_lerp_([t for t, _ in floats], [o.detach() for _, o in floats], 1.0 - beta)


class PlainLoop:
    """A hand-written training loop of ``method`` on copies of ``module``'s networks (see the module docstring)."""

    def __init__(self, method: str, module: Any, device: torch.device, precision: str) -> None:
        self.method = method
        self.device = device
        self.autocast = precision == "bf16-mixed"
        h = module.hparams
        self.hp = h
        self.nets = nn.ModuleDict()
        self.nets["backbone"] = copy.deepcopy(module.backbone)
        for name in ("head", "projector", "image_proj", "target_encoder", "target_projector"):
            part = getattr(module, name, None)
            if isinstance(part, nn.Module):
                self.nets[name] = copy.deepcopy(part)
        probe = _probe_from(module)
        if probe is not None:
            self.nets["probe"] = probe
        if method == "cloc":
            self.nets["loss"] = copy.deepcopy(module.cloc_loss)  # the margins are parameters
        elif method in ("supcon", "simclr", "relic", "ordinal_clip"):
            self.nets["loss"] = copy.deepcopy(module.criterion)  # our loss objects, as the module configures them
        self.nets.to(device)
        if method == "linear_probe":
            self.nets["backbone"].requires_grad_(False)
        if method == "relic":
            self.nets["target_encoder"].requires_grad_(False)
            self.nets["target_projector"].requires_grad_(False)
            self.online_state = [t for n in ("backbone", "projector") for t in [*self.nets[n].parameters(), *self.nets[n].buffers()]]
            self.target_state = [
                t for n in ("target_encoder", "target_projector") for t in [*self.nets[n].parameters(), *self.nets[n].buffers()]
            ]
            self.bank: torch.Tensor | None = None
        self.views = VIEWS.get(method, 1)

    def optimizer(self) -> torch.optim.Optimizer:
        h = self.hp
        probe_ids = {id(p) for p in self.nets["probe"].parameters()} if "probe" in self.nets else set()
        margin_ids = {id(p) for p in self.nets["loss"].parameters()} if self.method == "cloc" else set()
        model = [p for p in self.nets.parameters() if p.requires_grad and id(p) not in probe_ids | margin_ids]
        groups: list[dict[str, Any]] = [{"params": model}]
        if probe_ids:
            lr = h.get("online_probe_lr") or h.lr
            groups.append({"params": list(self.nets["probe"].parameters()), "lr": lr, "weight_decay": 0.0})
        if margin_ids:
            groups.append({"params": list(self.nets["loss"].parameters()), "lr": h.lr, "weight_decay": 0.0})
        return _optimizer(h.optimizer, groups, h.lr, h.weight_decay, h.get("momentum", 0.9))

    def train(self) -> None:
        self.nets.train()  # (OrdinalCLIP's prompt learner keeps its frozen text encoder in eval mode itself)
        if self.method == "linear_probe":
            self.nets["backbone"].eval()

    def loss(self, batch: Any, step: int, total: int) -> torch.Tensor:
        """The training loss of one batch (the same total as the module's ``training_step`` returns)."""
        n = self.nets
        x, y = batch
        m = self.method
        if m in ("ce", "cloc"):
            features = n["backbone"](x)
            logits = n["head"](features)
            loss = F.cross_entropy(logits.float(), y)
            return loss + self.hp.loss_weight * n["loss"](logits, y) if m == "cloc" else loss
        if m == "linear_probe":
            with torch.no_grad():
                features = n["backbone"](x)
            return F.cross_entropy(n["head"](features.float()).float(), y)
        if m == "ordinal_clip":
            logits = n["head"](n["image_proj"](n["backbone"](x)))
            return n["loss"](logits, y)
        if m in ("supcon", "simclr"):
            bsz = y.shape[0]
            features = n["backbone"](torch.cat(list(x)))
            z = n["projector"](features).view(self.views, bsz, -1).transpose(0, 1)
            loss = n["loss"](z, y if m == "supcon" else None)
            return loss + F.cross_entropy(n["probe"](features), y.repeat(self.views))
        if m == "relic":
            with torch.no_grad():
                t_feats = [n["target_encoder"](v) for v in x]
                targets = [n["target_projector"](f) for f in t_feats]
                first = F.normalize(t_feats[0].float(), dim=1)
            online = [n["projector"](n["backbone"](v)) for v in x]
            pairs = [(i, j) for i in range(len(targets)) for j in range(len(online)) if i != j]
            with torch.autocast(x[0].device.type, enabled=False):  # the loss in float32, as the module computes it
                loss = sum(
                    n["loss"](online[j].float(), targets[i].float(), gamma=float(self.hp.gamma), global_step=step) for i, j in pairs
                ) / len(pairs)
            self._remember(first)
            return loss + F.cross_entropy(n["probe"](first), y)
        raise ValueError(m)

    @torch.no_grad()
    def _remember(self, features: torch.Tensor) -> None:
        """The kNN monitor's bank: the newest ``knn_bank_size`` training features."""
        if not self.hp.get("knn_k"):
            return
        bank = features if self.bank is None else torch.cat([self.bank, features])
        self.bank = bank[-int(self.hp.knn_bank_size) :]

    def after_step(self, step: int, total: int) -> None:
        """ReLIC: the target is a copy for the first steps, then follows the online network (cosine beta, BYOL)."""
        if self.method != "relic":
            return
        if step <= int(self.hp.update_beta_after_step):
            torch._foreach_copy_(self.target_state, [t.detach() for t in self.online_state])
            return
        beta = 1.0 - (1.0 - float(self.hp.beta)) * (math.cos(math.pi * min(step, total) / total) + 1.0) / 2.0
        ema_update(self.online_state, self.target_state, beta)


# --------------------------------------------------------------------------------------------
# lightly's SimCLR
# --------------------------------------------------------------------------------------------


def lightly_simclr(backbone: nn.Module, feature_dim: int, n_classes: int, lr: float = 0.05) -> L.LightningModule | str:
    """A SimCLR LightningModule on lightly's projection head, NT-Xent loss and online classifier; or why not."""
    try:
        from lightly.loss import NTXentLoss
        from lightly.models.modules import SimCLRProjectionHead
        from lightly.utils.benchmarking import OnlineLinearClassifier
    except ImportError as e:  # the `bench` extra is not installed
        return f"lightly not importable ({e}); pip install -e '.[bench]'"

    class LightlySimCLR(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = backbone
            self.projection_head = SimCLRProjectionHead(feature_dim, feature_dim, 128, batch_norm=False)
            self.criterion = NTXentLoss(temperature=0.5, gather_distributed=True)
            self.online_classifier = OnlineLinearClassifier(feature_dim, n_classes)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (v0, v1), y = batch
            features = self.backbone(torch.cat([v0, v1]))
            z0, z1 = self.projection_head(features).chunk(2)
            loss = self.criterion(z0, z1)
            self.log("train_loss", loss, prog_bar=True, batch_size=len(y))
            cls_loss, cls_log = self.online_classifier.training_step((features.detach(), y.repeat(2)), batch_idx)
            self.log_dict(cls_log, sync_dist=True, batch_size=len(y))
            return loss + cls_loss

        def configure_optimizers(self) -> Any:
            cls_params = list(self.online_classifier.parameters())
            ids = {id(p) for p in cls_params}
            opt = torch.optim.SGD(
                [
                    {"params": [p for p in self.parameters() if id(p) not in ids], "weight_decay": 1e-4},
                    {"params": cls_params, "weight_decay": 0.0},
                ],
                lr=lr,
                momentum=0.9,
            )
            total = max(1, int(self.trainer.estimated_stepping_batches))
            sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(total))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return LightlySimCLR()


# --------------------------------------------------------------------------------------------
# timing one round
# --------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _now(device: torch.device) -> tuple[float, float]:
    """(wall, process CPU) seconds after the device has finished its queued work."""
    _sync(device)
    return time.perf_counter(), time.process_time()


@dataclass
class Round:
    """One timed round: wall and CPU seconds from the end of step 0 to the end of the last step; losses; memory."""

    wall_s: float
    cpu_s: float
    losses: list[float]
    peak_mib: float | None = None


class _RoundClock(L.Callback):
    """Reads the clocks after the first and after the last step of the epoch; keeps the losses (as device tensors)."""

    def __init__(self, steps: int, device: torch.device) -> None:
        self.steps, self.device = steps, device
        self.marks: list[tuple[float, float]] = []
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(loss.detach())
        if batch_idx in (0, self.steps - 1):
            self.marks.append(_now(self.device))


def _memory_start(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device) / 2**20


def _memory_peak(device: torch.device, base: float) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 - base if device.type == "cuda" else None


def lightning_round(module: L.LightningModule, loader: DataLoader, steps: int, device: torch.device, root: str, precision: str) -> Round:
    """One ``Trainer.fit`` of ``steps`` batches as users run it (TensorBoard logger, the module's callbacks)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    clock = _RoundClock(steps, device)
    trainer = L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision=precision,  # type: ignore[arg-type]
        max_epochs=1,
        max_steps=steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=TensorBoardLogger(root, name=type(module).__name__),
        log_every_n_steps=LOG_EVERY_N_STEPS,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        benchmark=True if device.type == "cuda" else None,
        default_root_dir=root,
        callbacks=[clock],
    )
    base = _memory_start(device)
    trainer.fit(module, train_dataloaders=loader)
    peak = _memory_peak(device, base)
    if len(clock.marks) != 2 or len(clock.losses) != steps:
        raise RuntimeError(f"{type(module).__name__} ran {len(clock.losses)} of {steps} steps")
    (w0, c0), (w1, c1) = clock.marks
    return Round(w1 - w0, c1 - c0, [float(v) for v in torch.stack(clock.losses).float().cpu()], peak)


def plain_round(loop: PlainLoop, batches: list[Any], steps: int, device: torch.device) -> Round:
    """One epoch of the plain loop over the same batches (its optimiser and schedule made fresh, as a new ``fit``)."""
    optimizer = loop.optimizer()
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _cosine(steps))
    loop.train()
    base = _memory_start(device)
    losses, marks = [], []
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if loop.autocast else contextlib.nullcontext()
    for step, batch in enumerate(batches[:steps]):
        optimizer.zero_grad(set_to_none=True)  # before the forward, as Lightning's automatic optimisation does
        with autocast:
            loss = loop.loss(batch, step, steps)
        loss.backward()
        optimizer.step()
        schedule.step()
        loop.after_step(step, steps)
        losses.append(loss.detach())
        if step in (0, steps - 1):
            marks.append(_now(device))
    peak = _memory_peak(device, base)
    (w0, c0), (w1, c1) = marks
    return Round(w1 - w0, c1 - c0, [float(v) for v in torch.stack(losses).float().cpu()], peak)


def make_batches(method: str, size: StepSize, device: torch.device, n_classes: int, distinct: int = 2) -> list[Any]:
    """``size.steps`` batches (``distinct`` different ones, repeated) on ``device``: images or a list of views, labels."""
    g = torch.Generator().manual_seed(1)
    views = VIEWS.get(method, 1)
    made = []
    for _ in range(distinct):
        xs = [torch.randn(size.batch, 3, size.image, size.image, generator=g).to(device) for _ in range(views)]
        y = torch.randint(0, n_classes, (size.batch,), generator=g).to(device)
        made.append((xs if views > 1 else xs[0], y))
    return [made[i % distinct] for i in range(size.steps)]


def _median_iqr(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": statistics.median(values), "q25": q[0], "q75": q[2], "n": len(values)}


def step_case(
    method: str,
    size: StepSize,
    device: torch.device,
    precision: str = "32-true",
    rounds: int | None = None,
    n_classes: int | None = None,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """Interleaved rounds of ours / plain (/ lightly for SimCLR) for ``method`` at ``size``; images/s and checks.

    ``max_seconds``: after the warm-up round, run only as many timed rounds (at least one) as
    fit in what is left of it at the warm-up round's pace.
    """
    t_start = time.perf_counter()
    c = n_classes or N_CLASSES[method]
    rounds = size.rounds if rounds is None else rounds
    planned = rounds
    module = make_module(method, size, c)
    impls: dict[str, Any] = {"ours": module, "plain": PlainLoop(method, module, device, precision)}
    lightly_note = None
    if method == "simclr":
        peer = lightly_simclr(copy.deepcopy(module.backbone), int(module.feature_dim), c)
        if isinstance(peer, str):
            lightly_note = peer
        else:
            impls["lightly"] = peer
    batches = make_batches(method, size, device, c)
    loader = DataLoader(batches, batch_size=None, shuffle=False, num_workers=0)
    names = list(impls)
    results: dict[str, list[Round]] = {k: [] for k in names}
    first_loss: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as root:
        r, t_warm = 0, time.perf_counter()
        while r <= rounds:  # round 0 warms up and is not counted
            if r == 1 and max_seconds is not None:  # as many timed rounds as fit at the warm-up round's pace
                warm = time.perf_counter() - t_warm
                left = max_seconds - (time.perf_counter() - t_start)
                rounds = max(1, min(rounds, int(left // warm)))
            order = names[r % len(names) :] + names[: r % len(names)] if r else names
            for name in order:
                impl = impls[name]
                if name == "plain":
                    res = plain_round(impl, batches, size.steps, device)
                else:
                    res = lightning_round(impl, loader, size.steps, device, root, precision)
                if r == 0:
                    first_loss[name] = res.losses[0]
                else:
                    results[name].append(res)
            r += 1
    views = VIEWS.get(method, 1)
    per_impl: dict[str, Any] = {}
    for name, rs in results.items():
        ips = [size.batch * (size.steps - 1) / x.wall_s for x in rs]
        cpu_ms = [1e3 * x.cpu_s / (size.steps - 1) for x in rs]
        losses = [v for x in rs for v in x.losses]
        peaks = [x.peak_mib for x in rs if x.peak_mib is not None]
        per_impl[name] = {
            "images_per_s": _median_iqr(ips),
            "cpu_ms_per_step": _median_iqr(cpu_ms),
            "peak_step_mib": max(peaks) if peaks else None,
            "losses_last_round": rs[-1].losses,
            "losses_finite": all(math.isfinite(v) for v in losses),
            "losses_change": len(set(rs[-1].losses)) > 1,
        }
    ours, plain = per_impl["ours"]["images_per_s"]["median"], per_impl["plain"]["images_per_s"]["median"]
    out: dict[str, Any] = {
        "method": method,
        "size": asdict(size),
        "rounds": rounds,
        "rounds_planned": planned,
        "views": views,
        "classes": c,
        "precision": precision,
        "parameters": sum(p.numel() for p in module.parameters()),
        "trainable_parameters": sum(p.numel() for p in module.parameters() if p.requires_grad),
        "impls": per_impl,
        "ratio_ours_plain": ours / plain,
        # per round, ours and plain ran next to each other: the median of their per-round ratios resists drift
        "paired_ratio_ours_plain": _median_iqr([p.wall_s / o.wall_s for o, p in zip(results["ours"], results["plain"], strict=True)]),
        "paired_ratio_ours_plain_cpu_time": _median_iqr(
            [p.cpu_s / o.cpu_s for o, p in zip(results["ours"], results["plain"], strict=True)]
        ),
        "first_loss": first_loss,
        "first_loss_diff_ours_plain": abs(first_loss["ours"] - first_loss["plain"]),
    }
    if "lightly" in per_impl:
        out["ratio_ours_lightly"] = ours / per_impl["lightly"]["images_per_s"]["median"]
        out["paired_ratio_ours_lightly"] = _median_iqr(
            [p.wall_s / o.wall_s for o, p in zip(results["ours"], results["lightly"], strict=True)]
        )
    if lightly_note:
        out["lightly"] = lightly_note
    return out


# --------------------------------------------------------------------------------------------
# data pipeline and colour jitter
# --------------------------------------------------------------------------------------------


def _data_root() -> Path | None:
    """``$CLOC_BENCH_DATA``, ``$CLOC_SHARED_DATA`` (the GPU script's unpacked data) or ``../shared/data``, if it exists."""
    env = os.environ.get(DATA_ENV) or os.environ.get("CLOC_SHARED_DATA")
    root = Path(env) if env else Path(__file__).resolve().parent.parent.parent / "shared" / "data"
    return root if root.is_dir() else None


def _generated_jpegs(folder: Path, n: int, width: int, height: int, seed: int = 0) -> list[str]:
    """``n`` JPEG files of smooth random colour fields with noise (quality 90) in ``folder``."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    files = []
    for i in range(n):
        coarse = torch.rand(1, 3, 6, 8, generator=g)
        img = F.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=False)[0]
        img = (img + 0.08 * torch.randn(img.shape, generator=g)).clamp(0, 1)
        arr = (img.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        path = folder / f"{i:04d}.jpg"
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
        path.write_bytes(buf.getvalue())
        files.append(str(path))
    return files


def image_sources(n: int, tmp: Path, sizes: Sequence[int]) -> dict[int, tuple[str, list[str]]]:
    """Per benchmarked size: (description, JPEG files) -- the shared CIFAR-10 / UTKFace copies, or generated."""
    root = _data_root()
    out: dict[int, tuple[str, list[str]]] = {}
    for size in sizes:
        files: list[str] = []
        if size == 32 and root is not None and (root / "cifar10" / "train").is_dir():
            files = sorted(str(p) for p in (root / "cifar10" / "train").glob("*/*.jpg"))[:: max(1, 10_000 // n)][:n]
            desc = "CIFAR-10 JPEG, 32x32 (shared data)"
        elif size == 64 and root is not None and (root / "utkface").is_dir():
            files = sorted(str(p) for p in (root / "utkface").glob("*.jpg"))[:n]
            desc = "UTKFace JPEG, 200x200 (shared data)"
        if len(files) < n:
            w, h = {32: (32, 32), 64: (200, 200)}.get(size, (500, 375))
            folder = tmp / f"gen{size}"
            folder.mkdir(parents=True, exist_ok=True)
            files = _generated_jpegs(folder, n, w, h, seed=size)
            desc = f"generated JPEG, {w}x{h}"
        out[size] = (desc, files)
    return out


def pipeline_specs() -> dict[str, tuple[str, Callable[[int], Callable[[Any], Any]]]]:
    """``{name: (methods using it, builder(size) -> transform)}``: the training transforms of the shipped configs."""
    from cloc_lightning.data import MultiCropViews, SupConViews
    from cloc_lightning.data.transforms import CIFAR_MEAN, CIFAR_STD, train_transform

    mean, std = CIFAR_MEAN, CIFAR_STD
    relic = {"blur_p": 1.0, "blur_kernel_from": "global", "local_size_rounding": "floor", "solarize_threshold": 127}
    return {
        "rrc_flip": (
            "CE, LinearProbe (configs/{ce,linear_probe}/cifar10.yaml)",
            lambda s: train_transform(s, mean, std, "rrc_flip", (0.2, 1.0)),
        ),
        "crop_flip": ("CLOC, OrdinalCLIP (configs/{cloc,ordinal_clip}/utkface.yaml)", lambda s: train_transform(s, mean, std, "crop_flip")),
        "supcon_views": ("SupCon, SimCLR: SupConViews, 2 views", lambda s: SupConViews(n_views=2).build(s, mean, std)),
        "relic_2": (
            "ReLIC: MultiCropViews, 2 global views (the step benchmarked here)",
            lambda s: MultiCropViews(2, 0, **relic).build(s, mean, std),
        ),  # type: ignore[arg-type]
        "relic_2_4": (
            "ReLIC: MultiCropViews 2 global + 4 local (configs/relic/cifar10.yaml)",
            lambda s: MultiCropViews(2, 4, **relic).build(s, mean, std),
        ),  # type: ignore[arg-type]
    }


def pipeline_bench(chunks: dict[int, int], repeats: int, max_seconds: float | None = None) -> dict[str, Any]:
    """Per size (``{size: items per timed chunk}``): ms per item of decoding and of each pipeline's augmentation
    in this process (1 thread); each size stops adding repeats after ``max_seconds`` (at least 3)."""
    from cloc_lightning.data.datasets import ImageFileDataset

    torch.manual_seed(0)
    specs = pipeline_specs()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {size: image_sources(n, Path(tmp), [size])[size] for size, n in chunks.items()}
        for size in chunks:
            desc, files = sources[size]
            ds = ImageFileDataset(files, [0] * len(files))
            images = [ds.load(i) for i in range(len(files))]
            transforms = {name: build(size) for name, (_, build) in specs.items()}
            cases: dict[str, Callable[[], Any]] = {"decode": lambda ds=ds: [ds.load(i) for i in range(len(ds))]}
            for name, t in transforms.items():
                cases[name] = lambda t=t, images=images: [t(img) for img in images]
            stats = time_interleaved(cases, repeats=repeats, warmup=1, max_seconds=max_seconds)
            decode = stats["decode"].median_ms / len(files)
            rows = {}
            for name, (methods, _) in specs.items():
                aug = stats[name].median_ms / len(files)
                rows[name] = {
                    "methods": methods,
                    "decode_ms": decode,
                    "augment_ms": aug,
                    "total_ms": decode + aug,
                    "items_per_s_per_core": 1e3 / (decode + aug),
                    "augment_only_items_per_s_per_core": 1e3 / aug,
                }
            out[str(size)] = {"source": desc, "items": len(files), "pipelines": rows}
    return out


def jitter_bench(
    chunks: dict[int, int], batch: int, device: torch.device, repeats: int, max_seconds: float | None = None
) -> dict[str, Any]:
    """Per size: µs per image of SupCon's colour augmentation and of ReLIC's Gaussian blur, on the loader vs batched on ``device``.

    Loader: torchvision v2 on one uint8 image (what a loader worker does per view).
    Device: the data path's :class:`~cloc_lightning.data.device_augment.DeviceAugment` (``--data.augment_on device``)
    making one view of a uint8 batch stored at the view's size (no crop, no flip) with only the colour steps, or
    only the blur; its parameters drawn on the host first, as the loader does.  ``device_plain`` is the same view
    without them (uint8 to float, normalise), which the two include.
    """
    import numpy as np
    from torchvision.transforms import v2

    from cloc_lightning.data import MultiCropViews
    from cloc_lightning.data.device_augment import DeviceAugment, ViewSpec

    def device_view(spec: ViewSpec, x: torch.Tensor) -> Callable[[], Any]:
        aug = DeviceAugment([spec], mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
        hw = np.full((x.shape[0], 2), x.shape[-1])
        params = {k: v.to(device) for k, v in aug.draw(np.arange(x.shape[0]), np.zeros(x.shape[0]), hw, hw).items()}
        return lambda: aug.apply(x, params)

    loader_t = v2.Compose([v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), v2.RandomGrayscale(p=0.2)])
    jitter_only = v2.ColorJitter(0.4, 0.4, 0.4, 0.1)
    out: dict[str, Any] = {}
    g = torch.Generator().manual_seed(0)
    for size, chunk in chunks.items():
        chunk = max(chunk, 8)
        kernel = MultiCropViews.blur_kernel_for(size)
        blur = v2.GaussianBlur(kernel, sigma=(0.1, 2.0))
        imgs = [v2.functional.to_image(torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g)) for _ in range(chunk)]
        b = batch if size <= 64 or device.type == "cuda" else max(8, batch // 4)
        x = torch.randint(0, 256, (b, 3, size, size), dtype=torch.uint8, generator=g).to(device)
        view = ViewSpec(size, crop="resize", flip_p=0.0)
        cases: dict[str, Callable[[], Any]] = {
            "loader": lambda imgs=imgs: [loader_t(i) for i in imgs],
            "loader_jitter_p1": lambda imgs=imgs: [jitter_only(i) for i in imgs],
            "loader_blur": lambda imgs=imgs, blur=blur: [blur(i) for i in imgs],
            "device_batch": device_view(replace(view, jitter=(0.4, 0.4, 0.4, 0.1), jitter_p=0.8, grayscale_p=0.2), x),
            "device_blur": device_view(replace(view, blur_kernel=kernel, blur_p=1.0), x),
            "device_plain": device_view(view, x),
        }
        stats = time_interleaved(cases, repeats=repeats, warmup=2, device=device, max_seconds=max_seconds)
        out[str(size)] = {
            "loader_us_per_image": 1e3 * stats["loader"].median_ms / chunk,
            "loader_jitter_always_us_per_image": 1e3 * stats["loader_jitter_p1"].median_ms / chunk,
            "device_us_per_image": 1e3 * stats["device_batch"].median_ms / b,
            "blur_kernel": kernel,
            "loader_blur_us_per_image": 1e3 * stats["loader_blur"].median_ms / chunk,
            "device_blur_us_per_image": 1e3 * stats["device_blur"].median_ms / b,
            "device_plain_us_per_image": 1e3 * stats["device_plain"].median_ms / b,
            "device_batch": b,
        }
    return out


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------


def _fmt_ips(s: dict[str, float]) -> str:
    return f"{s['median']:.0f} ({s['q25']:.0f}-{s['q75']:.0f})"


def _fmt_ratio(s: dict[str, float]) -> str:
    return f"{s['median']:.3f} ({s['q25']:.2f}-{s['q75']:.2f})"


def _loader_pipeline(method: str) -> str:
    return {
        "ce": "rrc_flip",
        "linear_probe": "rrc_flip",
        "cloc": "crop_flip",
        "ordinal_clip": "crop_flip",
        "supcon": "supcon_views",
        "simclr": "supcon_views",
        "relic": "relic_2",
    }[method]


def render(data: dict[str, Any]) -> str:
    """The markdown tables of a run's ``data``."""
    dev, quick = data["device"], data["quick"]
    smoke = " (smoke run)" if quick else ""
    rows = []
    for case in data["steps"]:
        size = StepSize(**case["size"])
        if "error" in case:
            rows.append([LABELS[case["method"]], size.label, case["error"], "", "", "", "", "", "", "", ""])
            continue
        im = case["impls"]
        paired = case["paired_ratio_ours_plain"]
        ratio = paired["median"]
        met = ("met" if ratio >= GOAL_RATIO_PLAIN else "NOT met") + smoke
        if "lightly" in im:
            pl = case["paired_ratio_ours_lightly"]
            light = (
                f"{_fmt_ips(im['lightly']['images_per_s'])}; ours/lightly **{_fmt_ratio(pl)}** "
                + ("(met)" if pl["median"] >= GOAL_RATIO_LIGHTLY else "(NOT met)")
                + smoke
            )
        else:
            light = case.get("lightly", "")
        peak = im["ours"]["peak_step_mib"]
        mem = "" if peak is None else f"{peak:.0f} / {im['plain']['peak_step_mib']:.0f}"
        pipe = data["pipeline"].get(str(size.image), {}).get("pipelines", {}).get(_loader_pipeline(case["method"]))
        cores = f"{im['ours']['images_per_s']['median'] / pipe['items_per_s_per_core']:.1f}" if pipe else "-"
        rows.append(
            [
                LABELS[case["method"]],
                f"{size.label}, {case['views']} view(s)",
                _fmt_ips(im["ours"]["images_per_s"]),
                _fmt_ips(im["plain"]["images_per_s"]),
                f"**{_fmt_ratio(paired)}**",
                f">= {GOAL_RATIO_PLAIN}: {met}",
                _fmt_ratio(case["paired_ratio_ours_plain_cpu_time"]),
                light,
                mem,
                f"{case['first_loss_diff_ours_plain']:.1e}",
                cores,
            ]
        )
    headers = [
        "method",
        "size",
        "ours images/s (IQR)",
        "plain images/s (IQR)",
        "ours/plain (IQR)",
        "goal",
        "ours/plain (CPU time)",
        "lightly images/s; ours/lightly",
        "peak step MiB ours / plain",
        "|first loss ours - plain|",
        "loader cores to feed ours",
    ]
    step_md = markdown_table(headers, rows)

    prow = []
    for size, res in data["pipeline"].items():
        for name, r in res["pipelines"].items():
            prow.append(
                [
                    name,
                    r["methods"],
                    f"{size} px",
                    res["source"],
                    f"{r['decode_ms']:.2f}",
                    f"{r['augment_ms']:.2f}",
                    f"{r['total_ms']:.2f}",
                    f"{r['items_per_s_per_core']:.0f}",
                    f"{r['augment_only_items_per_s_per_core']:.0f}",
                ]
            )
    pipe_md = markdown_table(
        [
            "pipeline",
            "used by",
            "size",
            "images",
            "decode ms",
            "augment ms",
            "total ms/item",
            "items/s per core",
            "items/s per core without decode",
        ],
        prow,
    )
    jrow = [
        [
            f"{s} px",
            f"{r['loader_us_per_image']:.0f}",
            f"{r['loader_jitter_always_us_per_image']:.0f}",
            f"{r['device_us_per_image']:.1f} (batch {r['device_batch']})",
            f"{r['loader_us_per_image'] / r['device_us_per_image']:.1f}x",
            str(r["blur_kernel"]),
            f"{r['loader_blur_us_per_image']:.0f}",
            f"{r['device_blur_us_per_image']:.1f}",
            f"{r['loader_blur_us_per_image'] / r['device_blur_us_per_image']:.1f}x",
        ]
        for s, r in data["jitter"].items()
    ]
    jit_md = markdown_table(
        [
            "size",
            "colour: loader µs/image (jitter p 0.8 + gray p 0.2)",
            "loader µs/image (jitter always)",
            f"batched on {dev} µs/image",
            "loader / batched",
            "blur kernel",
            "blur: loader µs/image",
            f"batched on {dev} µs/image",
            "loader / batched",
        ],
        jrow,
    )
    by_size: dict[str, list[int]] = {}
    for c in data["steps"]:
        if "rounds" in c:
            by_size.setdefault(f"{StepSize(**c['size']).label}: {{}} timed rounds x {c['size']['steps']} steps", []).append(c["rounds"])
    plan = "; ".join(k.format(min(v) if min(v) == max(v) else f"{min(v)}-{max(v)}") for k, v in by_size.items()) or "no case ran"
    notes = []
    if data.get("budget_s") is not None:
        notes.append(
            f"Time budget {data['budget_s']:.0f} s: cases ran as many timed rounds as fitted, those that did not fit are marked skipped."
        )
    if data.get("interrupted"):
        notes.append(f"The run was {data['interrupted']}: the rows marked so were not measured.")
    note = ("**" + " ".join(notes) + "**\n\n") if notes else ""
    return (
        f"### Training step: ours (Trainer.fit) vs plain PyTorch vs lightly ({dev}, {data['precision']}, "
        f"{data['threads']} torch thread(s)){smoke}\n\n"
        f"Images/s of the training step, median over interleaved rounds ({plan}; a warm-up round and each round's "
        f"first step left out); images are dataset items, a 2-view method forwards twice as many. *ours/plain*: the "
        f"median (and inter-quartile range) over rounds of the ratio of the two loops' images/s in the same round "
        f"(they run next to each other). *ours*: the "
        f"method's LightningModule under `Trainer.fit` with a TensorBoard logger (log_every_n_steps "
        f"{LOG_EVERY_N_STEPS}) and its own callbacks; *plain*: a hand-written loop on copies of the same networks, our "
        f"loss objects and the same optimiser; *lightly*: SimCLR on lightly's head, NT-Xent loss and online "
        f"classifier under the same Trainer. Random images and labels already on the device (no loader cost). "
        f"*ours/plain (CPU time)*: plain's over ours' CPU time per step, paired by round (meaningful on CPU with 1 thread, where the "
        f"wall clock suffers from other load). *loader cores to feed ours*: ours' images/s divided by the items/s "
        f"of one loader core for the method's pipeline at that size (table below; decode included).\n\n"
        f"{note}{step_md}\n\n"
        f"### Data pipeline per loader core (decode + training transforms of one item, 1 thread){smoke}\n\n"
        f"Median ms per item over interleaved repeats; a pipeline's views are all made from one decoded image. "
        f"CIFAR-10 data modules hold decoded tensors in memory (no decode): the last column applies there.\n\n"
        f"{pipe_md}\n\n"
        f"### Colour augmentation and blur on the loader vs batched on the device{smoke}\n\n"
        f"Colour: SupCon's `ColorJitter(0.4, 0.4, 0.4, 0.1)` (p 0.8) + `RandomGrayscale(0.2)`, torchvision v2 on one "
        f"uint8 image (one loader worker, 1 thread) vs the data path's `DeviceAugment` (`--data.augment_on device`) making "
        f"the view of a uint8 batch on the device (per-sample factors and order, as torchvision draws them). Blur: ReLIC's "
        f"`GaussianBlur` (MultiCropViews' kernel for the size, sigma in [0.1, 2]; torchvision convolves with the full k x k "
        f"kernel) vs the same `DeviceAugment` with the blur alone (per-sample sigma, two 1-D passes). The batched times "
        f"include the view's uint8-to-float and normalisation (no crop, no flip); both match torchvision's operations "
        f"(tests/data/test_device_augment.py). Per view; a 2-view item pays it twice.\n\n{jit_md}\n"
    )


def _budget(explicit: float | None, plan: str) -> float | None:
    if explicit is not None:
        return explicit
    for var in BUDGET_ENV:
        value = os.environ.get(var)
        if value:
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"${var} must be a number of seconds, got {value!r}") from None
    return DEFAULT_BUDGET_S[plan]


def run(
    quick: bool = False,
    device: str | None = None,
    precision: str = "32-true",
    threads: int | None = None,
    methods: Sequence[str] | None = None,
    budget_s: float | None = None,
) -> tuple[str, dict[str, Any]]:
    """Run the benchmark; return ``(markdown, data)``; full runs write ``results/throughput.{md,json}``.

    ``device``: ``cuda`` / ``cpu`` (default: CUDA when available).  The plan: ``quick`` (smoke
    sizes), else the full sizes on CUDA and the small CPU size on CPU.  ``threads``: torch
    threads (default 1 on CPU, as the other CPU benchmarks; unchanged on CUDA).

    ``budget_s``: seconds the run may take (default ``$CLOC_BENCH_BUDGET_S``, else
    ``$CLOC_GPU_BENCH_BUDGET``, else 180 on CUDA and no limit on CPU): cases run fewer timed
    rounds, and those that no longer fit are skipped (their rows say so).  An interrupt
    (``SIGINT``, e.g. ``timeout -s INT``) ends the measurements early; what was measured is
    still written, the remaining rows marked as interrupted.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    plan = "quick" if quick else ("cuda" if dev.type == "cuda" else "cpu")
    budget = _budget(budget_s, plan)
    previous = torch.get_num_threads()
    if threads is not None or dev.type == "cpu":
        torch.set_num_threads(threads or 1)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    # Lightning's per-fit messages (devices, "max_steps reached") and open_clip's "no pretrained weights" note;
    # lightly is imported first: it imports pytorch_lightning, which routes Lightning's rank-zero messages to its own logger
    with contextlib.suppress(ImportError):
        import lightly.utils.benchmarking  # noqa: F401
    loggers = [
        logging.getLogger(n)
        for n in (
            "lightning.pytorch",
            "lightning.fabric",
            "lightning.pytorch.utilities.rank_zero",
            "pytorch_lightning",
            "pytorch_lightning.utilities.rank_zero",
            "root",
        )
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for msg in (
                ".*does not have many workers.*",
                ".*number of training batches.*",
                ".*Tensor Cores.*",
                ".*eval mode.*",
                ".*no `val_dataloader`.*",
                ".*LeafSpec.*",
            ):
                warnings.filterwarnings("ignore", msg)
            data = _run(plan, dev, precision, list(methods or METHODS), budget)
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        torch.set_num_threads(previous)
    data["quick"] = quick
    md = render(data)
    if not quick:
        write_results(
            "throughput",
            md,
            data,
            "python -m benchmarks --only throughput"
            + ("" if dev.type == ("cuda" if torch.cuda.is_available() else "cpu") else f" (device {dev.type})"),
        )
    return md, data


def _run(plan: str, dev: torch.device, precision: str, methods: list[str], budget: float | None = None) -> dict[str, Any]:
    start = time.perf_counter()
    deadline = None if budget is None else start + max(10.0, budget - BUDGET_SAFETY_S)
    steps_deadline = None if deadline is None else deadline - PIPELINE_RESERVE_S[plan]
    cases = [(size, method) for size in PLANS[plan] for method in methods]
    steps: list[dict[str, Any]] = []
    interrupted = None
    for k, (size, method) in enumerate(cases):
        t0 = time.perf_counter()
        share = None if steps_deadline is None else (steps_deadline - t0) / (len(cases) - k)
        if interrupted:
            case = {"method": method, "size": asdict(size), "error": f"not run ({interrupted})"}
        elif share is not None and share < MIN_CASE_S[plan]:
            case = {"method": method, "size": asdict(size), "error": f"skipped: time budget ({budget:.0f} s) spent"}
        else:
            n_classes = 8 if plan == "quick" and method == "ordinal_clip" else None
            try:
                case = step_case(method, size, dev, precision, None, n_classes, max_seconds=share)
            except torch.cuda.OutOfMemoryError as e:
                case = {"method": method, "size": asdict(size), "error": f"out of memory ({str(e).splitlines()[0][:80]})"}
            except (KeyboardInterrupt, SystemExit):  # Lightning turns an interrupt during fit into sys.exit(1)
                interrupted = "interrupted"
                case = {"method": method, "size": asdict(size), "error": "interrupted"}
        case["seconds"] = time.perf_counter() - t0
        steps.append(case)
        gc.collect()  # modules, trainers and optimisers refer to each other: free the device memory now
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        ratio = case.get("paired_ratio_ours_plain", {}).get("median", math.nan)
        print(
            f"  throughput: {method} at {size.label}: {ratio:.3f} ours/plain ({case['seconds']:.0f} s) {case.get('error', '')}", flush=True
        )
    chunks, repeats = PIPELINE_PLAN[plan]
    threads = torch.get_num_threads()
    pipeline: dict[str, Any] = {}
    jitter: dict[str, Any] = {}
    if not interrupted:
        left = None if deadline is None else max(2.0, deadline - time.perf_counter())
        cap = None if left is None else left / (2 * len(chunks))  # per size, for each of the two tables
        torch.set_num_threads(1)  # one loader worker = one process with one torch thread
        try:
            pipeline = pipeline_bench(chunks, repeats, max_seconds=cap)
            jitter = jitter_bench(chunks, PLANS[plan][0].batch, dev, repeats=max(3, repeats), max_seconds=cap)
        except KeyboardInterrupt:
            interrupted = "interrupted during the data-pipeline tables"
        finally:
            torch.set_num_threads(threads)
    return {
        "plan": plan,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU",
        "precision": precision,
        "threads": threads,
        "lightning": L.__version__,
        "budget_s": budget,
        "interrupted": interrupted,
        "steps": steps,
        "pipeline": pipeline,
        "jitter": jitter,
        "goals": {"ours_over_plain": GOAL_RATIO_PLAIN, "ours_over_lightly": GOAL_RATIO_LIGHTLY},
        "data_root": str(_data_root()),
        "code": {k: v for k, v in provenance().items() if k.startswith("git_")},  # the commit measured, the files that differed
        "seconds": time.perf_counter() - start,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, writes nothing")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default 1 on CPU)")
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds the run may take (default $CLOC_BENCH_BUDGET_S or $CLOC_GPU_BENCH_BUDGET; 180 on CUDA)",
    )
    args = parser.parse_args()
    print(run(args.quick, args.device, args.precision, args.threads, args.methods.split(",") if args.methods else None, args.budget)[0])
