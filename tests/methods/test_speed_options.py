"""The speed options of every module: ``compile_backbone``, ``channels_last``, ``optimizer_fused`` / ``optimizer_foreach``.

Every check trains for real on the CPU (a few steps of the tiny ``test_resnet``).  torch.compile
with its default backend (inductor) takes tens of seconds on 2 cores, so one test compiles a
two-layer encoder with torch's defaults and compares it with the uncompiled run; the checkpoint
matrix compiles with ``backend: eager`` -- Dynamo traces and wraps the encoder exactly as with
inductor (what changes the module tree and the ``state_dict`` keys), only no kernels are generated.
References are the same module trained without the option (numbers equal to a tolerance).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn

from cloc_lightning.cli import main
from cloc_lightning.data import MultiCropViews, OrdinalShapesDataModule
from cloc_lightning.methods import CEModule, CLOCModule, LinearProbeModule, ReLICModule, SupConModule
from cloc_lightning.methods import optim as optim_module
from cloc_lightning.nn.backbones import create_backbone
from tests.conftest import TINY_BACKBONE, cpu_trainer, torch_threads

pytestmark = pytest.mark.filterwarnings("ignore:.*self.trainer.*reference is not registered:UserWarning")

EAGER = {"backend": "eager"}  # Dynamo without code generation: the same wrapping, a fraction of the compile time
SPEED_OPTIONS = ("compile_backbone", "channels_last", "optimizer_fused", "optimizer_foreach")


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread for these tiny models (on a busy 2-core machine a second one mostly waits)."""
    with torch_threads(1):
        yield


def _dm(views: Any = None, **kw: Any) -> OrdinalShapesDataModule:
    args: dict[str, Any] = dict(num_classes=4, train_size=32, val_size=16, test_size=16, batch_size=8, num_workers=0, drop_last=True)
    args.update(kw)
    return OrdinalShapesDataModule(train_views=views, **args)


_trainer = partial(cpu_trainer, max_epochs=1, num_sanity_val_steps=0, limit_train_batches=2, limit_val_batches=1, deterministic=True)


def _fit(
    model: L.LightningModule, root: Path, dm: OrdinalShapesDataModule | None = None, ckpt_path: str | None = None, **kw: Any
) -> L.Trainer:
    trainer = _trainer(root, **kw)
    trainer.fit(model, datamodule=dm or _dm(), ckpt_path=ckpt_path)
    return trainer


def _ce(seed: int = 0, **kw: Any) -> CEModule:
    torch.manual_seed(seed)
    return CEModule(num_classes=4, backbone=TINY_BACKBONE, **kw)


def _state(path: str | Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return state


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert set(a) == set(b)
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
        else:
            assert torch.equal(a[k], b[k]), k


def _compiled(module: nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None


# ------------------------------------------------------------------ every module, the module tree
TINY_CLIP = {
    "embed_dim": 24,
    "vision_cfg": {"layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "image_size": 16},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def _module(name: str, tmp_path: Path, **kw: Any) -> L.LightningModule:
    torch.manual_seed(0)
    if name == "ce":
        return CEModule(num_classes=4, backbone=TINY_BACKBONE, **kw)
    if name == "cloc":
        return CLOCModule(num_classes=4, backbone=TINY_BACKBONE, **kw)
    if name == "supcon":
        return SupConModule(backbone=TINY_BACKBONE, **kw)
    if name == "relic":
        return ReLICModule(backbone=TINY_BACKBONE, online_probe=False, knn_k=0, **kw)
    if name == "linear_probe":
        encoder = tmp_path / "encoder.pt"
        torch.save(create_backbone(TINY_BACKBONE, False, False)[0].state_dict(), encoder)
        return LinearProbeModule(num_classes=4, encoder_ckpt=str(encoder), backbone=TINY_BACKBONE, **kw)
    pytest.importorskip("open_clip")
    from cloc_lightning.methods import OrdinalCLIPModule

    return OrdinalCLIPModule(num_classes=4, clip_model="ViT-S-32-alt", clip_config=TINY_CLIP, num_context_tokens=4, **kw)


@pytest.mark.parametrize("name", ["ce", "cloc", "supcon", "relic", "linear_probe", "ordinal_clip"])
def test_every_module_takes_the_options_and_keeps_its_module_tree(name: str, tmp_path: Path) -> None:
    """Compiled and channels_last in place: the same modules, the same state_dict keys and values; hparams record them."""
    plain = _module(name, tmp_path)
    fast = _module(name, tmp_path, compile_backbone=EAGER, channels_last=True, optimizer_foreach=True)
    before = {k: v.clone() for k, v in fast.state_dict().items()}
    fast.configure_model()  # what Lightning calls when a run starts
    fast.configure_model()  # (every stage calls it again: applied once)
    assert all(fast.hparams[k] == v for k, v in [("compile_backbone", EAGER), ("channels_last", True), ("optimizer_foreach", True)])
    assert list(fast.state_dict()) == list(before) == list(plain.state_dict())
    assert not any("_orig_mod" in k for k in before)
    _assert_close(dict(fast.state_dict()), before, atol=0.0)
    names = fast.backbone_modules  # type: ignore[attr-defined]
    assert names == (("backbone", "target_encoder") if name == "relic" else ("backbone",))
    for attr in names:
        encoder = getattr(fast, attr)
        assert _compiled(encoder) and not _compiled(getattr(plain, attr))
        assert len(encoder._forward_pre_hooks) == 1  # the channels_last input hook, registered once
        weights = [p for p in encoder.parameters() if p.dim() == 4]
        assert weights and all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)


# ------------------------------------------------------------------ torch.compile (inductor) for real
class _TinyCE(CEModule):
    """CE on a two-convolution encoder: small enough for inductor to compile in seconds on a CPU."""

    def build_backbone(self) -> tuple[nn.Module, int]:
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        return net, 8


@pytest.mark.slow  # long tier: torch.compile of a backbone (12 s of the fast tier, measured idle)
def test_compile_backbone_with_torch_defaults_trains_as_the_uncompiled_module(tmp_path: Path) -> None:
    """``compile_backbone: true`` (inductor, mode default): same weights as eager after 3 steps, plain keys in the checkpoint."""
    runs = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = _TinyCE(num_classes=4, optimizer="sgd", lr=0.1, scheduler="none", compile_backbone=compiled)
        trainer = _fit(model, tmp_path / str(compiled), dm=_dm(image_size=16), limit_train_batches=3, limit_val_batches=0)
        runs[compiled] = (model, _state(trainer.checkpoint_callback.last_model_path))  # type: ignore[union-attr]
    assert _compiled(runs[True][0].backbone) and not _compiled(runs[False][0].backbone)
    assert list(runs[True][1]) == list(runs[False][1]) and runs[True][1]["backbone.0.weight"].shape == (8, 3, 3, 3)
    _assert_close(runs[True][1], runs[False][1], atol=1e-5)


# ------------------------------------------------------------------ checkpoints, compiled or not, in any combination
@pytest.fixture(scope="module")
def compiled_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CE checkpoint of a compiled run (one epoch)."""
    root = tmp_path_factory.mktemp("compiled")
    trainer = _fit(_ce(compile_backbone=EAGER), root)
    return Path(trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def plain_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CE checkpoint of a plain run (one epoch)."""
    root = tmp_path_factory.mktemp("plain")
    trainer = _fit(_ce(), root)
    return Path(trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]


@pytest.mark.slow  # torch.compile: the long tier (pytest -m slow)
def test_a_compiled_run_saves_plain_keys_that_plain_modules_load_resume_probe_and_init_from(
    compiled_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = _state(compiled_ckpt)
    assert list(saved) == list(_ce().state_dict()) and not any("_orig_mod" in k for k in saved)
    # plain load
    loaded = CEModule.load_from_checkpoint(compiled_ckpt)
    _assert_close(dict(loaded.state_dict()), saved, atol=0.0)
    # plain resume (--ckpt_path)
    resumed = _ce()
    trainer = _fit(resumed, tmp_path / "resume", ckpt_path=str(compiled_ckpt), max_epochs=2)
    assert trainer.current_epoch == 2 and not _compiled(resumed.backbone)
    # init_from into a plain module: every tensor taken
    init = _ce(seed=1, init_from=str(compiled_ckpt))
    assert len(init.load_weights(str(compiled_ckpt))["loaded"]) == len(saved)
    _assert_close(dict(init.state_dict()), saved, atol=0.0)
    # LinearProbeModule(encoder_ckpt=...), plain and compiled: the frozen encoder is the stage-one encoder
    stage_one = {k[len("backbone.") :]: v for k, v in saved.items() if k.startswith("backbone.")}
    _assert_close(dict(LinearProbeModule(num_classes=4, encoder_ckpt=str(compiled_ckpt)).backbone.state_dict()), stage_one, atol=0.0)
    probe = LinearProbeModule(num_classes=4, encoder_ckpt=str(compiled_ckpt), compile_backbone=EAGER)
    _fit(probe, tmp_path / "probe", limit_train_batches=1, limit_val_batches=0)
    assert _compiled(probe.backbone)
    _assert_close(dict(probe.backbone.state_dict()), stage_one, atol=0.0)  # frozen, compiled, trained on
    # cloc-lightning probe
    shapes = [
        "--data",
        "OrdinalShapesDataModule",
        "--data.num_classes",
        "4",
        "--data.train_size",
        "32",
        "--data.val_size",
        "16",
        "--data.test_size",
        "16",
        "--data.batch_size",
        "8",
        "--data.num_workers",
        "0",
    ]
    main(["probe", "--ckpt", str(compiled_ckpt), *shapes, "--max_iter", "50"])
    assert "top1:" in capsys.readouterr().out


def test_a_plain_run_resumes_and_initialises_compiled(plain_ckpt: Path, tmp_path: Path) -> None:
    saved = _state(plain_ckpt)
    resumed = _ce(compile_backbone=EAGER)
    trainer = _fit(resumed, tmp_path / "resume", ckpt_path=str(plain_ckpt), max_epochs=2)
    assert trainer.current_epoch == 2 and _compiled(resumed.backbone)
    after = _state(trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]
    assert list(after) == list(saved)
    assert not torch.equal(after["head.weight"], saved["head.weight"])  # it trained on from the checkpoint
    init = _ce(seed=1, init_from=str(plain_ckpt), compile_backbone=EAGER)
    init.configure_model()
    assert len(init.load_weights(str(plain_ckpt))["loaded"]) == len(saved)
    _assert_close(dict(init.state_dict()), saved, atol=0.0)


def test_cli_resume_takes_the_speed_options_of_the_command_line_not_the_checkpoints(
    compiled_ckpt: Path, plain_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fit --ckpt_path``: LightningCLI adopts a checkpoint's hyper-parameters, but not how the run executes."""
    from cloc_lightning.cli import CLOCLightningCLI
    from cloc_lightning.data import BaseDataModule
    from cloc_lightning.methods.base import BaseModule

    monkeypatch.chdir(tmp_path)
    common = [
        "fit",
        "--model",
        "CEModule",
        "--model.num_classes",
        "4",
        "--model.backbone",
        TINY_BACKBONE,
        "--data",
        "OrdinalShapesDataModule",
        "--data.num_classes",
        "4",
        "--data.train_size",
        "32",
        "--data.val_size",
        "16",
        "--data.test_size",
        "16",
        "--data.batch_size",
        "8",
        "--data.num_workers",
        "0",
        "--data.drop_last",
        "true",
        "--trainer.max_epochs",
        "2",
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.logger",
        "false",
    ]
    for ckpt, options, compiled in (
        (plain_ckpt, ["--model.compile_backbone", "{backend: eager}", "--model.channels_last", "true"], True),
        (compiled_ckpt, [], False),
    ):
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)  # as the CLI writes it: with its class path
        saved["hyper_parameters"]["_class_path"] = "cloc_lightning.methods.CEModule"
        torch.save(saved, tmp_path / "cli.ckpt")
        cli = CLOCLightningCLI(
            BaseModule,
            BaseDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            args=[*common, *options, "--ckpt_path", str(tmp_path / "cli.ckpt")],
        )
        assert cli.trainer.current_epoch == 2 and cli.model.hparams.num_classes == 4
        assert _compiled(cli.model.backbone) == compiled and cli.model.hparams.channels_last == compiled


@pytest.mark.slow  # torch.compile: the long tier (pytest -m slow)
def test_relic_compiles_both_encoders_and_its_checkpoint_probes_plain(tmp_path: Path) -> None:
    torch.manual_seed(0)
    relic = ReLICModule(backbone=TINY_BACKBONE, online_probe=False, knn_k=0, compile_backbone=EAGER)
    trainer = _fit(relic, tmp_path / "relic", dm=_dm(MultiCropViews(2, 0)), limit_train_batches=1, limit_val_batches=0)
    assert _compiled(relic.backbone) and _compiled(relic.target_encoder)
    saved = _state(trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]
    assert not any("_orig_mod" in k for k in saved) and any(k.startswith("target_encoder.") for k in saved)
    probe = LinearProbeModule(num_classes=4, encoder_ckpt=trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]
    target = {k[len("target_encoder.") :]: v for k, v in saved.items() if k.startswith("target_encoder.")}
    _assert_close(dict(probe.backbone.state_dict()), target, atol=0.0)


# ------------------------------------------------------------------ channels_last
def _record_conv_inputs(models: list[nn.Module]) -> list[bool]:
    """Whether each Conv2d input of ``models`` is channels_last (appended during forward passes)."""
    seen: list[bool] = []
    for m in (m for model in models for m in model.modules()):
        if isinstance(m, nn.Conv2d):
            m.register_forward_pre_hook(lambda mod, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last)))
    return seen


def test_channels_last_reaches_every_convolution_of_both_encoders_and_matches_contiguous(tmp_path: Path) -> None:
    """Multi-view ReLIC (online + EMA target encoder): every conv input channels_last; weights as the contiguous run."""
    runs: dict[bool, dict[str, torch.Tensor]] = {}
    for channels_last in (False, True):
        torch.manual_seed(0)
        relic = ReLICModule(backbone=TINY_BACKBONE, online_probe=False, knn_k=0, optimizer="sgd", lr=0.05, channels_last=channels_last)
        seen = _record_conv_inputs([relic.backbone, relic.target_encoder])
        trainer = _fit(relic, tmp_path / str(channels_last), dm=_dm(MultiCropViews(2, 0)), limit_val_batches=0)
        assert (len(seen) > 0 and all(seen)) if channels_last else not all(seen)
        runs[channels_last] = _state(trainer.checkpoint_callback.last_model_path)  # type: ignore[union-attr]
        weights = [
            v
            for k, v in runs[channels_last].items()  # (1x1 kernels are both layouts at once)
            if v.dim() == 4 and v.shape[2] * v.shape[3] > 1 and k.startswith(("backbone.", "target_encoder."))
        ]
        assert all(w.is_contiguous(memory_format=torch.channels_last) == channels_last for w in weights)
    _assert_close(runs[True], runs[False], atol=1e-4)
    # a channels_last checkpoint loads into a contiguous module (values, not strides, are saved)
    plain = ReLICModule(backbone=TINY_BACKBONE, online_probe=False, knn_k=0)
    plain.load_state_dict(runs[True])
    _assert_close(dict(plain.state_dict()), runs[True], atol=0.0)


# ------------------------------------------------------------------ fused / foreach
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_fused_and_foreach_optimisers_equal_the_default(optimizer: str, tmp_path: Path) -> None:
    """Three steps with ``optimizer_fused: true`` / ``optimizer_foreach: true``: the weights of the default implementation."""
    runs = {}
    for option in ({}, {"optimizer_fused": True}, {"optimizer_foreach": True}):
        # (kaiming init: timm's zero-initialised BatchNorms leave near-zero gradients, whose rounding Adam magnifies)
        model = _ce(optimizer=optimizer, lr=0.01, weight_decay=1e-4, scheduler="none", backbone_init="kaiming", **option)
        trainer = _fit(model, tmp_path / str(option), limit_train_batches=3, limit_val_batches=0)
        opt = trainer.optimizers[0]
        assert all(opt.defaults.get(k.split("_")[1]) is True for k in option)
        runs[str(option)] = dict(model.state_dict())
    reference = runs.pop("{}")
    for state in runs.values():  # (fused AdamW rounds differently: ~5e-6 here, while a step moves weights by up to 1e-2)
        _assert_close(state, reference, atol=2e-5)


def test_radam_takes_foreach_and_refuses_fused(tmp_path: Path) -> None:
    model = _ce(optimizer="radam", optimizer_foreach=True, scheduler="none")
    trainer = _fit(model, tmp_path, limit_train_batches=1, limit_val_batches=0)
    assert trainer.optimizers[0].defaults["foreach"] is True
    with pytest.raises(ValueError, match=r"RAdam \(optimizer: radam\) has no fused.*optimizer_foreach: true.*adam, adamw, sgd"):
        _ce(optimizer="radam", optimizer_fused=True)


def test_a_fused_resume_across_memory_formats_continues_the_same_optimiser_state(tmp_path: Path) -> None:
    """SGD momentum saved contiguous, resumed channels_last (fused kernels read both as flat buffers): state re-laid, same run.

    (SGD, not Adam: Adam's first steps move each weight by about ``lr * sign(grad)``, so the rounding
    differences of near-zero gradients between the two memory formats would not stay small.)
    """

    class _Layouts(L.Callback):
        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            opt = trainer.optimizers[0]
            self.matched = all(v.stride() == p.stride() for p, s in opt.state.items() for v in s.values() if v.shape == p.shape)

    kw: dict[str, Any] = dict(optimizer="sgd", lr=0.05, scheduler="none", optimizer_fused=True)
    straight = _ce(channels_last=True, **kw)
    _fit(straight, tmp_path / "straight", max_epochs=2, limit_train_batches=1, limit_val_batches=0)
    first = _fit(_ce(**kw), tmp_path / "first", limit_train_batches=1, limit_val_batches=0)
    layouts = _Layouts()
    resumed = _ce(channels_last=True, **kw)
    _fit(
        resumed,
        tmp_path / "resumed",
        ckpt_path=first.checkpoint_callback.last_model_path,  # type: ignore[union-attr]
        max_epochs=2,
        limit_train_batches=1,
        limit_val_batches=0,
        callbacks=[layouts],
    )
    assert layouts.matched
    # channels_last and contiguous convolutions round differently (~5e-7 here); the momentum read in the
    # wrong order (no re-layout) moved weights by ~3e-2
    _assert_close(dict(resumed.state_dict()), dict(straight.state_dict()), atol=1e-5)


# ------------------------------------------------------------------ mistakes, with the fix in the message
def test_mistakes_name_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both true.*keep one of them"):
        _ce(optimizer_fused=True, optimizer_foreach=True)
    with pytest.raises(ValueError, match=r"\['modes'\] are no torch.compile arguments.*'mode'"):
        _ce(compile_backbone={"modes": "max-autotune"})
    with pytest.raises(ValueError, match="mode or options, not both"):
        _ce(compile_backbone={"mode": "max-autotune", "options": {"trace.enabled": True}})
    with pytest.raises(TypeError, match="compile_backbone must be true, false or a dict"):
        _ce(compile_backbone="max-autotune")

    # every value, not only the keys, is checked when the module is built (not at the first step of fit)
    with pytest.raises(ValueError, match=r"compile_backbone\.mode must be .*'max-autotune'.* got 'fastest'"):
        _ce(compile_backbone={"mode": "fastest"})
    with pytest.raises(TypeError, match=r"compile_backbone\.fullgraph must be True or False, got 'yes'"):
        _ce(compile_backbone={"fullgraph": "yes"})
    with pytest.raises(TypeError, match=r"compile_backbone\.dynamic must be True, False or None, got 1"):
        _ce(compile_backbone={"dynamic": 1})
    with pytest.raises(ValueError, match=r"compile_backbone\.backend must be .*'inductor'.* got 'inducter'"):
        _ce(compile_backbone={"backend": "inducter"})
    with pytest.raises(TypeError, match=r"compile_backbone\.backend must be a backend name .* got 3"):
        _ce(compile_backbone={"backend": 3})
    with pytest.raises(ValueError, match=r"compile_backbone\.options: \['max_autotun'\] are no inductor options"):
        _ce(compile_backbone={"options": {"max_autotun": True}})
    with pytest.raises(TypeError, match=r"compile_backbone\.options must be a dict"):
        _ce(compile_backbone={"options": ["max_autotune"]})
    with pytest.raises(TypeError, match=r"compile_backbone\.recompile_limit must be an int, got '8'"):
        _ce(compile_backbone={"recompile_limit": "8"})
    for good in (
        {"mode": "max-autotune"},
        {"mode": None, "fullgraph": True, "dynamic": None},
        {"backend": "eager"},
        {"backend": "inductor", "options": {"max_autotune": True}},
        {"disable": True},
        True,
        False,
    ):
        assert _ce(compile_backbone=good).hparams.compile_backbone == good

    class _OwnOptimiser(CEModule):
        def build_optimizer(self, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
            return torch.optim.AdamW(groups, lr=self.hparams.lr)

    own = _OwnOptimiser(num_classes=4, backbone=TINY_BACKBONE, optimizer_fused=True)
    with pytest.raises(ValueError, match=r"_OwnOptimiser.build_optimizer built AdamW with fused=None.*optimizer_options\(AdamW\)"):
        _fit(own, tmp_path / "own", limit_val_batches=0)
    assert _OwnOptimiser(num_classes=4, backbone=TINY_BACKBONE, scheduler="none").configure_optimizers() is not None  # as before

    class _Wrapped(CEModule):  # compiling by wrapping, in build_backbone: what compile_backbone replaces
        def build_backbone(self) -> tuple[nn.Module, int]:
            net, dim = super().build_backbone()
            return torch.compile(net, backend="eager"), dim  # type: ignore[return-value]

    with pytest.raises(TypeError, match=r"_Wrapped.backbone is a torch.compile\(...\) wrapper.*'_orig_mod\.'.*compile_backbone: true"):
        _fit(_Wrapped(num_classes=4, backbone=TINY_BACKBONE), tmp_path / "wrapped")

    monkeypatch.setattr(optim_module, "fused_devices", lambda: ["cuda"])  # a device without fused kernels
    with pytest.raises(ValueError, match=r"fused AdamW kernels for \['cuda'\] only.*on \['cpu'\]; set optimizer_fused: null"):
        _ce(optimizer="adamw", optimizer_fused=True, scheduler="none").configure_optimizers()


@pytest.mark.parametrize("model", ["CEModule", "CLOCModule", "SupConModule", "ReLICModule", "LinearProbeModule", "OrdinalCLIPModule"])
def test_cli_help_documents_the_options(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model.help", model])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in SPEED_OPTIONS:
        assert f"--model.{option} " in out
    assert "nn.Module.compile" in out and "torch.channels_last" in out
