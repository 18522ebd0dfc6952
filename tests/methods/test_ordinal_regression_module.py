"""CORN / CORAL as a module (``OrdinalRegressionModule``): scores, the rank metric, steps, checkpoints, CLI.

The references are written here: the exceedance probabilities, class probabilities and the papers'
rank rule from the head's logits by plain NumPy loops (Cao et al. 2020; Shi et al. 2023), the rank
MAE by a loop over the validation loader.  The losses themselves are checked against loops of the
papers' formulas in ``tests/losses/test_ordinal_regression.py``.
"""

from __future__ import annotations

import csv
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.cli import main
from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.losses import CORALLoss, coral_loss, corn_loss
from cloc_lightning.methods import CEModule, OrdinalRegressionModule
from cloc_lightning.methods.ordinal_regression import RankMAE
from cloc_lightning.nn.ordinal_heads import CORALHead, CORNHead
from tests._reliability import SMALL
from tests.conftest import REPO, cpu_trainer

K = 4


def _dm(**kw: Any) -> OrdinalShapesDataModule:
    args: dict[str, Any] = dict(
        num_classes=K, train_size=32, val_size=16, test_size=16, batch_size=8, num_workers=0, image_size=16, augment="none"
    )
    args.update(kw)
    return OrdinalShapesDataModule(**args)


_trainer = partial(cpu_trainer, max_epochs=1, num_sanity_val_steps=0)


def _model(head: str = "corn", **kw: Any) -> OrdinalRegressionModule:
    torch.manual_seed(0)
    return OrdinalRegressionModule(num_classes=K, head=head, **{**SMALL, **kw})


def _quiet(fn: Any, *args: Any, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


# ----------------------------------------------------------------------------- references (NumPy loops)
def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def ref_exceedance(logits: np.ndarray, head: str) -> np.ndarray:
    """``P(y > k)``: CORAL ``s(z_k)``; CORN ``prod_{j <= k} s(z_j)`` (a loop)."""
    s = _sigmoid(logits.astype(np.float64))
    if head == "coral":
        return s
    out = np.empty_like(s)
    for i in range(s.shape[0]):
        p = 1.0
        for k in range(s.shape[1]):
            p *= s[i, k]
            out[i, k] = p
    return out


def ref_class_probs(exceed: np.ndarray) -> np.ndarray:
    """``P(y = k) = P(y > k-1) - P(y > k)`` (``P(y > -1) = 1``, ``P(y > K-1) = 0``), negatives clamped, rows renormalised."""
    n, t = exceed.shape
    probs = np.zeros((n, t + 1))
    for i in range(n):
        for k in range(t + 1):
            upper = 1.0 if k == 0 else exceed[i, k - 1]
            lower = 0.0 if k == t else exceed[i, k]
            probs[i, k] = max(upper - lower, 0.0)
        probs[i] /= probs[i].sum()
    return probs


def ref_rank(exceed: np.ndarray) -> np.ndarray:
    """Both papers' rule: the number of ``P(y > k) > 0.5``."""
    return np.array([sum(1 for p in row if p > 0.5) for row in exceed])


def _head_logits(model: OrdinalRegressionModule, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model.head(model.backbone(x)).double().numpy()


def _disorder_coral_biases(model: OrdinalRegressionModule) -> None:
    """Biases that make CORAL's P(y > k) increase somewhere: the clamp-and-renormalise path of the scores."""
    with torch.no_grad():
        model.head.biases.copy_(torch.tensor([0.5, -1.0, 1.5])[: K - 1])


# ----------------------------------------------------------------------------- scores and metrics
@pytest.mark.parametrize("head", ["corn", "coral"])
def test_scores_are_the_log_class_probabilities_of_the_exceedance(head: str) -> None:
    model = _model(head).eval()
    if head == "coral":
        _disorder_coral_biases(model)
    assert isinstance(model.head, CORNHead if head == "corn" else CORALHead)
    x = torch.randn(6, 3, 16, 16)
    scores = model(x)
    assert scores.shape == (6, K) and scores.dtype == torch.float32
    exceed = ref_exceedance(_head_logits(model, x), head)
    probs = ref_class_probs(exceed)
    np.testing.assert_allclose(scores.softmax(dim=1).detach().double().numpy(), probs, atol=1e-6)
    if head == "coral":
        assert (probs == 0).any()  # the disordered biases did reach the clamp


def test_scores_under_bf16_autocast_are_float32_and_match() -> None:
    model = _model("corn").eval()
    x = torch.randn(4, 3, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = model(x)
        logits = model.head(model.backbone(x))
    assert scores.dtype == torch.float32 and logits.dtype == torch.bfloat16
    exceed = ref_exceedance(logits.float().detach().double().numpy(), "corn")
    np.testing.assert_allclose(scores.softmax(dim=1).detach().double().numpy(), ref_class_probs(exceed), atol=1e-6)


@pytest.mark.parametrize("head", ["corn", "coral"])
def test_mae_rank_and_eval_loss_through_validate(head: str, tmp_path: Path) -> None:
    """val/mae_rank is the papers' rule's MAE over the whole set; val/loss the method's loss, not a cross-entropy."""
    model = _model(head)
    if head == "coral":
        with torch.no_grad():
            model.head.biases.copy_(torch.tensor([1.0, 0.0, -1.0]))  # ranks spread over the classes
    dm = _dm()
    metrics = _quiet(_trainer(tmp_path).validate, model, datamodule=dm, verbose=False)[0]
    model.eval()
    errors, losses, ces, sizes = [], [], [], []
    for x, y in dm.val_dataloader():
        logits = _head_logits(model, x)
        errors += list(np.abs(ref_rank(ref_exceedance(logits, head)) - y.numpy()))
        z = torch.from_numpy(logits)
        losses.append(float(corn_loss(z, y) if head == "corn" else coral_loss(z, y)))
        with torch.no_grad():
            ces.append(float(F.cross_entropy(model(x), y)))
        sizes.append(len(y))
    assert len(errors) == 16
    assert metrics["val/mae_rank"] == pytest.approx(float(np.mean(errors)), abs=1e-6)
    assert metrics["val/loss"] == pytest.approx(float(np.average(losses, weights=sizes)), rel=1e-5)
    assert metrics["val/loss"] != pytest.approx(float(np.average(ces, weights=sizes)), rel=1e-3)
    assert {"val/mae", "val/mae_expected", "val/acc", "val/qwk", "val/acc_pm1"} <= set(metrics)


def test_rank_mae_metric_against_a_loop() -> None:
    rng = np.random.default_rng(0)
    metric = RankMAE()
    total, n = 0.0, 0
    for b in (5, 3):
        rank = rng.integers(0, K, b)
        target = rng.integers(0, K, b)
        metric.update(torch.zeros(b, K), torch.from_numpy(target), rank=torch.from_numpy(rank))
        for r, t in zip(rank, target, strict=True):
            total, n = total + abs(int(r) - int(t)), n + 1
    assert float(metric.compute()) == pytest.approx(total / n)
    metric.update(torch.full((2, K), float("nan")), torch.zeros(2, dtype=torch.long), rank=torch.zeros(2, dtype=torch.long))
    assert torch.isnan(metric.compute())  # NaN outputs are no result
    with pytest.raises(ValueError, match=r"needs the predicted ranks: update\(scores \[B, C\], target \[B\], rank=\[B\]\)"):
        RankMAE().update(torch.zeros(2, K), torch.zeros(2, dtype=torch.long))


# ----------------------------------------------------------------------------- fit, predict, checkpoints
@pytest.fixture(scope="module")
def corn_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[OrdinalRegressionModule, L.Trainer, OrdinalShapesDataModule]:
    tmp = tmp_path_factory.mktemp("corn")
    model, dm = _model("corn", lr=1e-2), _dm()
    trainer = _trainer(tmp, max_epochs=2)
    _quiet(trainer.fit, model, datamodule=dm)
    return model, trainer, dm


def test_fit_logs_the_rank_metric_and_keeps_the_best_checkpoint(corn_run: Any) -> None:
    model, trainer, _ = corn_run
    assert trainer.global_step == 8
    assert {"train/loss", "train/mae_rank", "val/mae_rank", "val/mae", "val/loss", "val/mae_rank_best"} <= set(trainer.callback_metrics)
    assert trainer.checkpoint_callback.monitor == "val/mae" and Path(trainer.checkpoint_callback.best_model_path).is_file()
    assert "val/mae_rank final" in model.summary_line()


def test_predict_step_keys(corn_run: Any) -> None:
    model, trainer, dm = corn_run
    out = _quiet(trainer.predict, model, datamodule=dm)[0]
    assert set(out) == {"pred", "expected", "probs", "rank", "exceedance", "target"}
    assert out["probs"].shape == (8, K) and torch.allclose(out["probs"].sum(1), torch.ones(8))
    assert torch.equal(out["pred"], out["probs"].argmax(1))
    assert torch.allclose(out["expected"], out["probs"] @ torch.arange(float(K)))
    assert torch.equal(out["rank"], torch.from_numpy(ref_rank(out["exceedance"].double().numpy())))
    assert out["rank"].dtype == torch.long and out["exceedance"].shape == (8, K - 1)


def test_checkpoint_reload_gives_identical_outputs(corn_run: Any) -> None:
    model, trainer, _ = corn_run
    reloaded = OrdinalRegressionModule.load_from_checkpoint(trainer.checkpoint_callback.last_model_path)
    assert reloaded.hparams.head == "corn" and isinstance(reloaded.head, CORNHead)
    x = torch.randn(3, 3, 16, 16)
    model.eval(), reloaded.eval()
    assert torch.equal(model(x), reloaded(x))
    assert torch.equal(
        model.predict_step((x, torch.zeros(3, dtype=torch.long)), 0)["rank"],
        reloaded.predict_step((x, torch.zeros(3, dtype=torch.long)), 0)["rank"],
    )


def test_a_checkpoint_of_the_other_head_is_refused_naming_the_fix(corn_run: Any, tmp_path: Path) -> None:
    _, trainer, dm = corn_run
    with pytest.raises(
        ValueError, match=r"trained with head: corn, but the configured OrdinalRegressionModule has head: coral \(set --model.head corn"
    ):
        _quiet(_trainer(tmp_path).validate, _model("coral"), datamodule=dm, ckpt_path=trainer.checkpoint_callback.last_model_path)


def test_init_from_a_ce_checkpoint_loads_the_backbone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(1)
    ce = CEModule(num_classes=K, **SMALL)
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    _quiet(trainer.fit, ce, datamodule=_dm())
    path = trainer.checkpoint_callback.last_model_path
    model = _model("corn", init_from=path)
    head_before = {k: v.clone() for k, v in model.head.state_dict().items()}
    model.load_weights(path)  # what setup does with init_from
    out = capsys.readouterr().out
    for k, v in ce.backbone.state_dict().items():
        assert torch.equal(model.backbone.state_dict()[k], v), k
    assert all(torch.equal(model.head.state_dict()[k], v) for k, v in head_before.items())  # a CE head is no CORN head
    assert "head.* not loaded (a CEModule checkpoint, not a CORN head); the CORN head starts from its initialisation" in out
    # from a CORN checkpoint the head comes too
    corn = _model("corn")
    trainer = _trainer(tmp_path / "corn", max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    _quiet(trainer.fit, corn, datamodule=_dm())
    again = _model("corn")
    again.load_weights(trainer.checkpoint_callback.last_model_path)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in corn.state_dict().items() if k.startswith(("head.", "backbone.")))


def test_probe_reads_the_backbone(corn_run: Any) -> None:
    from cloc_lightning.probe import probe_checkpoint

    model, trainer, _ = corn_run
    res = probe_checkpoint(trainer.checkpoint_callback.last_model_path, _dm(), max_iter=50)
    assert "backbone." in res["encoder"] and res["n_features"] == model.feature_dim and 0 <= res["top1"] <= 1


# ----------------------------------------------------------------------------- bad input
def test_nominal_task_is_refused_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"classes must be ranks \(task ordinal\), but task is 'nominal'; .*CEModule"):
        _model("corn", task="nominal")

    class NominalShapes(OrdinalShapesDataModule):
        task = "nominal"

    dm = NominalShapes(num_classes=K, train_size=16, val_size=8, test_size=8, batch_size=8, num_workers=0, image_size=16)
    with pytest.raises(ValueError, match=r"but NominalShapes's task is 'nominal'; for unordered classes use .*CEModule"):
        _quiet(_trainer(tmp_path).fit, _model("coral"), datamodule=dm)


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"importance_weights must be 3 finite numbers >= 0, one per threshold"):
        _model("coral", importance_weights=[1.0, 1.0])
    with pytest.raises(ValueError, match=r"importance_weights must be 3 finite numbers >= 0"):
        _model("coral", importance_weights=[1.0, -0.5, 1.0])
    with pytest.raises(ValueError, match=r"importance_weights must be 3 finite numbers >= 0"):
        _model("coral", importance_weights=[1.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match=r"importance_weights are CORAL's task weights, but head is 'corn'; set head: coral"):
        _model("corn", importance_weights=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"head must be 'corn' or 'coral', got 'cornn'"):
        _model("cornn")
    weighted = _model("coral", importance_weights=[1.0, 0.0, 2.0])
    assert isinstance(weighted.criterion, CORALLoss)
    assert torch.equal(weighted.criterion.importance_weights, torch.tensor([1.0, 0.0, 2.0]))


# ----------------------------------------------------------------------------- a user's subclass
class MyCORN(OrdinalRegressionModule):
    """What a user writes: an MLP head with K - 1 outputs and CORAL's loss with task weights."""

    def __init__(self, num_classes: int, hidden: int = 16, **kwargs: Any) -> None:
        self.hidden = hidden
        super().__init__(num_classes=num_classes, **kwargs)

    def build_head(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.feature_dim, self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.num_classes - 1))

    def build_loss(self) -> nn.Module:
        return CORALLoss(self.num_classes, importance_weights=[1.0] * (self.num_classes - 2) + [2.0])


def test_user_subclass_trains_and_reloads(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MyCORN(num_classes=K, hidden=12, head="coral", **SMALL)
    assert isinstance(model.criterion, CORALLoss) and model.head[0].out_features == 12
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _trainer(tmp_path, limit_train_batches=2, limit_val_batches=1)
    _quiet(trainer.fit, model, datamodule=_dm())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    reloaded = MyCORN.load_from_checkpoint(trainer.checkpoint_callback.last_model_path)
    x = torch.randn(2, 3, 16, 16)
    model.eval(), reloaded.eval()
    assert torch.equal(model(x), reloaded(x))
    exceed = ref_exceedance(_head_logits(model, x), "coral")
    np.testing.assert_allclose(model(x).softmax(1).detach().double().numpy(), ref_class_probs(exceed), atol=1e-6)

    class WrongHead(OrdinalRegressionModule):
        def build_head(self) -> nn.Module:
            return nn.Linear(self.feature_dim, self.num_classes)  # K outputs: a classifier's head

    with pytest.raises(ValueError, match=r"head must give \[B, K-1\] = \[B, 3\] logits .* got \(2, 4\); check build_head"):
        WrongHead(num_classes=K, **SMALL)(x)


# ----------------------------------------------------------------------------- the command line, in process
@pytest.fixture
def _console_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["cloc-lightning"])


def _cli(args: list[str]) -> int | str | None:
    try:
        main(args)
    except SystemExit as e:
        return e.code
    return 0


TINY_CLI = [
    "--model.backbone",
    SMALL["backbone"],
    "--model.backbone_kwargs",
    '{"channels": [8, 8, 16, 16], "stem_width": 4}',
    "--model.num_classes",
    str(K),
    "--data.num_classes",
    str(K),
    "--data.train_size",
    "32",
    "--data.val_size",
    "16",
    "--data.test_size",
    "16",
    "--data.batch_size",
    "16",
    "--data.image_size",
    "16",
    "--data.num_workers",
    "0",
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
]


@pytest.mark.usefixtures("_console_argv")
def test_cli_fit_then_test_predict_and_the_other_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    corn, coral = str(REPO / "configs" / "corn" / "demo.yaml"), str(REPO / "configs" / "coral" / "demo.yaml")
    assert _cli(["fit", "--config", corn, *TINY_CLI, "--trainer.max_epochs", "2", "--test_after_fit", "false"]) == 0
    folder = tmp_path / "runs" / "corn_demo" / "version_0"
    (best,) = sorted((folder / "checkpoints").glob("best-*.ckpt"))
    assert (folder / "checkpoints" / "last.ckpt").is_file()
    capsys.readouterr()
    assert _cli(["test", "--config", corn, *TINY_CLI, "--ckpt_path", str(best)]) == 0
    out = capsys.readouterr().out
    assert "test/mae_rank" in out and "test/loss" in out
    assert _cli(["predict", "--config", corn, *TINY_CLI, "--ckpt_path", str(best)]) == 0
    (written,) = list((tmp_path / "runs").rglob("predictions.csv"))
    rows = list(csv.DictReader(written.open()))
    assert len(rows) == 16 and {"pred", "expected", "rank", "p0"} <= set(rows[0])
    capsys.readouterr()
    assert _cli(["validate", "--config", coral, *TINY_CLI, "--ckpt_path", str(best)]) == 1
    err = capsys.readouterr().err
    assert "trained with head: corn, but the configured OrdinalRegressionModule has head: coral (set --model.head corn" in err
