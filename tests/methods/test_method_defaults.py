"""A method's arguments in plain sight: its own signature states the defaults it changes, its bases' arrive in ``**kwargs``.

``BaseModule`` declares the backbone / optimiser / schedule / speed options once, ``PretrainModule`` the
online evaluator's, ``MomentumModule`` the EMA target's; a method re-declares only an argument whose default
it changes (with the base's type) and passes it on by name.  Python calls, ``--model.help``, ``--print_config``
and the saved hyper-parameters (Lightning's own ``save_hyperparameters``) show the method's defaults.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

import cloc_lightning.methods as methods
from cloc_lightning.methods import (
    BaseModule,
    LinearProbeModule,
    LinearRegressorModule,
    MomentumModule,
    OrdinalCLIPModule,
    PretrainModule,
    ReLICModule,
    RnCModule,
    SupConModule,
)
from cloc_lightning.nn.ema import EMATarget
from cloc_lightning.nn.online_probe import OnlineEvaluator
from cloc_lightning.nn.prompt_learner import RankPromptLearner
from tests.conftest import TINY_BACKBONE

#: each method's defaults that differ from BaseModule's (adam, lr 1e-3, weight decay 0, cosine, no warm-up,
#: min_lr_ratio 0) or PretrainModule's (online_probe_lr None, knn_k 0), as the references (and the docs) give them
METHOD_DEFAULTS: dict[type, dict[str, Any]] = {
    SupConModule: {
        "optimizer": "sgd",
        "lr": 0.05,
        "weight_decay": 1e-4,
        "momentum": 0.9,
        "scheduler": "cosine",
        "warmup_epochs": 1.0,
        "min_lr_ratio": 1e-3,
    },
    RnCModule: {
        "optimizer": "sgd",
        "lr": 0.5,
        "weight_decay": 1e-4,
        "momentum": 0.9,
        "scheduler": "cosine",
        "warmup_epochs": 0.0,
        "min_lr_ratio": 1e-3,
    },
    ReLICModule: {"optimizer": "adam", "lr": 3e-4, "weight_decay": 1e-5, "scheduler": "none", "online_probe_lr": 0.01, "knn_k": 20},
    LinearProbeModule: {
        "optimizer": "sgd",
        "lr": 0.1,
        "weight_decay": 0.0,
        "momentum": 0.9,
        "scheduler": "cosine",
        "warmup_epochs": 0.0,
        "min_lr_ratio": 0.0,
    },
    LinearRegressorModule: {
        "optimizer": "sgd",
        "lr": 0.05,
        "weight_decay": 0.0,
        "momentum": 0.9,
        "scheduler": "cosine",
        "min_lr_ratio": 0.008,
    },
    OrdinalCLIPModule: {"optimizer": "radam", "lr": 1e-4, "weight_decay": 0.0, "scheduler": "cosine"},
}
BASE_ARGUMENTS = set(inspect.signature(BaseModule).parameters)
EVALUATOR_ARGUMENTS = set(inspect.signature(OnlineEvaluator).parameters)


def constructor_chain(cls: type) -> dict[str, inspect.Parameter]:
    """``{argument: parameter}`` of ``cls``'s constructor chain, as ``--model.help`` shows it.

    Each ``__init__`` up the MRO until one without ``**kwargs`` (the first that declares a name wins:
    a method's re-declared default), with evaluated annotations.
    """
    found: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        hints = typing.get_type_hints(init)
        params = list(inspect.signature(init).parameters.values())[1:]
        for p in params:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                found.setdefault(p.name, p.replace(annotation=hints.get(p.name, p.annotation)))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return found
    raise AssertionError(f"{cls.__name__}: no constructor without **kwargs up the MRO")


@pytest.mark.parametrize("cls", list(METHOD_DEFAULTS), ids=lambda c: c.__name__)
def test_signature_shows_the_methods_defaults_and_the_chain_every_argument(cls: type) -> None:
    """The method's own signature states the defaults it changes; its bases' arguments arrive in ``**kwargs``.

    (Before the explicit signatures, ``inspect.signature(cls)`` listed every argument, no ``**kwargs``.)
    """
    params = inspect.signature(cls).parameters
    assert any(p.kind is p.VAR_KEYWORD for p in params.values()), "the bases' arguments pass on in **kwargs"
    chain = constructor_chain(cls)
    assert set(chain) >= BASE_ARGUMENTS
    if issubclass(cls, PretrainModule):
        assert set(chain) >= EVALUATOR_ARGUMENTS
    for name, value in METHOD_DEFAULTS[cls].items():
        assert chain[name].default == value, (cls.__name__, name)
        if name in params:
            assert params[name].default == value, (cls.__name__, name)
    for name in ("lr", "optimizer", "backbone_init", "init_from"):
        assert not isinstance(chain[name].annotation, str), "annotations evaluated (jsonargparse types the options)"


@pytest.mark.parametrize("cls", [SupConModule, RnCModule, ReLICModule], ids=lambda c: c.__name__)
def test_python_construction_uses_and_records_the_methods_defaults(cls: type) -> None:
    model = cls(backbone=TINY_BACKBONE, online_probe=False)
    for name, value in METHOD_DEFAULTS[cls].items():
        assert model.hparams[name] == value, (cls.__name__, name)
    assert set(model.hparams) == set(constructor_chain(cls))  # every argument, as LightningCLI's record
    optimizer = model.build_optimizer(model.param_groups())
    assert type(optimizer).__name__.lower() == METHOD_DEFAULTS[cls]["optimizer"]
    assert optimizer.defaults["lr"] == METHOD_DEFAULTS[cls]["lr"]
    # an explicit value wins, and is what the hparams (and so checkpoints) record
    other = cls(backbone=TINY_BACKBONE, online_probe=False, lr=0.123, weight_decay=0.0)
    assert other.hparams.lr == 0.123 and other.hparams.weight_decay == 0.0


def test_linear_stages_record_their_defaults_and_checkpoint_encoder() -> None:
    info = {"backbone": TINY_BACKBONE, "cifar_stem": False, "backbone_kwargs": None}
    probe = LinearProbeModule(num_classes=4, encoder_info=info)
    regressor = LinearRegressorModule(num_classes=4, encoder_info=info)
    assert (probe.hparams.optimizer, probe.hparams.lr) == ("sgd", 0.1)
    assert (regressor.hparams.lr, regressor.hparams.min_lr_ratio) == (0.05, 0.008)
    assert probe.hparams.pretrained is False and regressor.hparams.encoder_info == info
    with pytest.raises(ValueError, match="remove 'pretrained'"):
        LinearProbeModule(num_classes=4, encoder_info=info, pretrained=True)
    with pytest.raises(TypeError, match=r"ClassifierModule.__init__\(\) missing 1 required positional argument: 'num_classes'"):
        LinearRegressorModule(encoder_info=info)


def test_pretrain_module_takes_the_online_evaluators_arguments() -> None:
    model = PretrainModule(
        backbone=TINY_BACKBONE, num_classes=3, task="nominal", knn_k=5, knn_temperature=0.2, online_probe_lr=0.3, online_probe_norm=False
    )
    ev = model.online_eval
    assert (ev.num_classes, ev.task, ev.knn_k, ev.knn_temperature, ev.lr, ev.norm) == (3, "nominal", 5, 0.2, 0.3, False)
    assert model.probe is not None and model.hparams.knn_k == 5 and "knn_k" not in inspect.signature(BaseModule).parameters
    with pytest.raises(ValueError, match="knn_k"):
        PretrainModule(backbone=TINY_BACKBONE, knn_k=-1)


def test_a_wrong_argument_names_the_class() -> None:
    with pytest.raises(TypeError, match="SupConModule: got an unexpected keyword argument 'lr_rate'"):
        SupConModule(backbone=TINY_BACKBONE, lr_rate=0.1)
    with pytest.raises(TypeError, match="CEModule: got an unexpected keyword argument 'weight_decy'"):  # ClassifierModule's path
        methods.CEModule(num_classes=3, backbone=TINY_BACKBONE, weight_decy=0.1)
    with pytest.raises(TypeError, match="_MySupCon: got an unexpected keyword argument 'lr_rate'"):  # a user's subclass
        _MySupCon(backbone=TINY_BACKBONE, lr_rate=0.1)


class _MySupCon(SupConModule):
    """A subclass in a user's project, not decorated: its own argument and the method's defaults."""

    def __init__(self, width: int = 7, **kwargs: Any) -> None:
        self.width = width
        super().__init__(**kwargs)


def test_user_subclass_keeps_its_own_arguments_and_the_methods_defaults(tmp_path: Path) -> None:
    model = _MySupCon(width=3, backbone=TINY_BACKBONE, online_probe=False, projector_dim=16)
    assert model.hparams.width == 3 and model.hparams.projector_dim == 16
    assert model.hparams.lr == 0.05 and model.hparams.optimizer == "sgd"
    path = tmp_path / "m.ckpt"  # what a checkpoint keeps of the module: its weights and hyper-parameters
    torch.save(
        {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams), "pytorch-lightning_version": L.__version__}, path
    )
    loaded = _MySupCon.load_from_checkpoint(path, weights_only=False)
    assert loaded.width == 3 and loaded.hparams.projector_dim == 16 and loaded.hparams.lr == 0.05
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)


# ---------------------------------------------------------------------- re-declared arguments
#: every module class of the package that takes arguments (the constructor chains walked here)
MODULES = [c for c in vars(methods).values() if isinstance(c, type) and issubclass(c, BaseModule)]
#: ``(class, argument)`` re-declared with the base's default, and why
SAME_DEFAULT = {
    **{
        (cls, "num_classes"): "required and the first positional argument (Module(10)); the constructor's checks use it"
        for cls in (methods.CEModule, methods.CLOCModule, methods.OrdinalRegressionModule, OrdinalCLIPModule)
    },
    (LinearProbeModule, "backbone_kwargs"): "an override of the checkpoint's (None: the checkpoint's), not the base's option",
    (LinearProbeModule, "pretrained"): "not used (the weights come from encoder_ckpt): refused unless false, documented so",
    **{
        (OrdinalCLIPModule, name): "the timm encoder's / every group but the logit scale's: the method's own --model.help text"
        for name in ("backbone", "cifar_stem", "backbone_kwargs", "weight_decay")
    },
    **{
        (ReLICModule, name): "the seed's beta and its schedules documented in --model.help"
        for name in ("beta", "beta_schedule", "update_beta_every_n_steps")
    },
}
#: ``(class, argument)`` re-declared with another type: another meaning than the base's, and which
OTHER_MEANING = {
    (LinearProbeModule, "backbone"): "None: the encoder checkpoint's architecture",
    (LinearProbeModule, "cifar_stem"): "None: the encoder checkpoint's",
    (OrdinalCLIPModule, "pretrained"): "CLIP's weights (an open_clip tag or path), not the timm backbone's",
}


def _base_parameter(cls: type, name: str) -> tuple[type, inspect.Parameter] | None:
    """The nearest base of ``cls`` whose constructor declares ``name`` (up its constructor chain), and that parameter."""
    for klass in cls.__mro__[1:]:
        if not issubclass(klass, BaseModule):
            continue  # a mixin (BestFinalTracking): its constructor, if any, takes no method option
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        if name in params:
            return klass, params[name].replace(annotation=typing.get_type_hints(init).get(name))
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return None


@pytest.mark.parametrize("cls", MODULES, ids=lambda c: c.__name__)
def test_a_redeclared_argument_keeps_the_bases_type_and_changes_its_default(cls: type) -> None:
    """What mypy and IDEs see of a method is its own signature: a re-declared argument must be the base's (type) with
    the method's default, or be listed above with the reason it differs."""
    init = cls.__dict__.get("__init__")
    if init is None:
        return
    hints = typing.get_type_hints(init)
    for name, p in list(inspect.signature(init).parameters.items())[1:]:
        found = _base_parameter(cls, name)
        if found is None or p.kind is p.VAR_KEYWORD:
            continue
        base, q = found
        if (cls, name) in OTHER_MEANING:
            assert hints.get(name) != q.annotation, f"{cls.__name__}.{name}: the same type as {base.__name__}'s now"
            continue
        assert hints.get(name) == q.annotation, f"{cls.__name__}.{name}: {hints.get(name)} but {base.__name__} has {q.annotation}"
        if (cls, name) in SAME_DEFAULT:
            assert p.default == q.default, f"{cls.__name__}.{name}: another default than {base.__name__}'s now"
        else:
            assert p.default != q.default, (
                f"{cls.__name__}.{name} re-declares {base.__name__}'s default {q.default!r}: remove it (it arrives in **kwargs)"
            )


@pytest.mark.parametrize(
    ("owner", "component", "exclude"),
    [
        (PretrainModule, OnlineEvaluator, set()),
        (MomentumModule, EMATarget, set()),
        (OrdinalCLIPModule, RankPromptLearner, {"clip_model", "num_ranks", "tokenizer", "truncate_padding"}),
    ],
    ids=lambda c: getattr(c, "__name__", ""),
)
def test_the_module_that_builds_a_component_declares_its_arguments_as_the_component_does(
    owner: type, component: type, exclude: set[str]
) -> None:
    """A component's arguments are the module's options (``--model.knn_k``): declared by the module that builds it."""
    mine = inspect.signature(owner.__dict__["__init__"]).parameters
    mine_hints = typing.get_type_hints(owner.__dict__["__init__"])
    theirs = list(inspect.signature(component.__init__).parameters.values())[1:]  # type: ignore[misc]
    their_hints = typing.get_type_hints(component.__init__)  # type: ignore[misc]
    for p in theirs:
        if p.name in exclude:
            continue
        assert p.name in mine, f"{owner.__name__} does not declare {component.__name__}'s {p.name}"
        assert mine[p.name].default == p.default, (owner.__name__, p.name)
        if (owner, p.name) == (OrdinalCLIPModule, "init_rank_names"):
            continue  # list[str] | None (what a config gives) for the learner's Sequence[str] | None
        assert mine_hints[p.name] == their_hints[p.name], (owner.__name__, p.name)


def test_method_defaults_is_gone_and_says_what_replaced_it() -> None:
    with pytest.raises(ImportError, match=r"method_defaults was removed.*re-declaring.*docs/extending.md"):
        from cloc_lightning.methods import method_defaults  # noqa: F401
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("cloc_lightning.methods.defaults")


@pytest.mark.parametrize("cls", MODULES, ids=lambda c: c.__name__)
def test_class_docstring_documents_every_argument(cls: type) -> None:
    """What ``--help`` reads: each argument from the docstring of the class whose constructor declares it."""
    import docstring_parser

    described = {p.arg_name for p in docstring_parser.parse(cls.__doc__ or "").params if p.description}
    init = cls.__dict__.get("__init__")
    if init is None:
        return
    own = {n for n, p in list(inspect.signature(init).parameters.items())[1:] if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    missing = own - described
    assert not missing, f"{cls.__name__}'s docstring does not describe {sorted(missing)}"
