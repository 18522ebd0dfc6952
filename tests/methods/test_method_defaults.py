"""``method_defaults``: each constructor argument declared once, a method's own defaults kept (Python, hparams, docs)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from cloc_lightning.methods import (
    BaseModule,
    LinearProbeModule,
    LinearRegressorModule,
    OrdinalCLIPModule,
    PretrainModule,
    ReLICModule,
    RnCModule,
    SupConModule,
)
from cloc_lightning.methods.defaults import method_defaults, take_arguments
from cloc_lightning.nn.online_probe import OnlineEvaluator
from tests.conftest import TINY_BACKBONE

#: each method's defaults that differ from BaseModule's (adam, lr 1e-3, weight decay 0, cosine, no warm-up,
#: min_lr_ratio 0) or PretrainModule's (online_probe_lr None, knn_k 0), as the references (and the docs) give them
METHOD_DEFAULTS: dict[type, dict[str, Any]] = {
    SupConModule: {"optimizer": "sgd", "lr": 0.05, "weight_decay": 1e-4, "momentum": 0.9, "scheduler": "cosine",
                   "warmup_epochs": 1.0, "min_lr_ratio": 1e-3},
    RnCModule: {"optimizer": "sgd", "lr": 0.5, "weight_decay": 1e-4, "momentum": 0.9, "scheduler": "cosine",
                "warmup_epochs": 0.0, "min_lr_ratio": 1e-3},
    ReLICModule: {"optimizer": "adam", "lr": 3e-4, "weight_decay": 1e-5, "scheduler": "none", "online_probe_lr": 0.01,
                  "knn_k": 20},
    LinearProbeModule: {"optimizer": "sgd", "lr": 0.1, "weight_decay": 0.0, "momentum": 0.9, "scheduler": "cosine",
                        "warmup_epochs": 0.0, "min_lr_ratio": 0.0},
    LinearRegressorModule: {"optimizer": "sgd", "lr": 0.05, "weight_decay": 0.0, "momentum": 0.9, "scheduler": "cosine",
                            "min_lr_ratio": 0.008},
    OrdinalCLIPModule: {"optimizer": "radam", "lr": 1e-4, "weight_decay": 0.0, "scheduler": "cosine"},
}
BASE_ARGUMENTS = set(inspect.signature(BaseModule).parameters)
EVALUATOR_ARGUMENTS = set(inspect.signature(OnlineEvaluator).parameters)


@pytest.mark.parametrize("cls", list(METHOD_DEFAULTS), ids=lambda c: c.__name__)
def test_signature_has_every_argument_with_the_methods_defaults(cls: type) -> None:
    params = inspect.signature(cls).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), "the complete signature, no **kwargs"
    assert set(params) >= BASE_ARGUMENTS
    if issubclass(cls, PretrainModule):
        assert set(params) >= EVALUATOR_ARGUMENTS
    for name, value in METHOD_DEFAULTS[cls].items():
        assert params[name].default == value, (cls.__name__, name)
    for name in ("lr", "optimizer", "backbone_init", "init_from"):
        assert not isinstance(params[name].annotation, str), "annotations evaluated (jsonargparse types the options)"


@pytest.mark.parametrize("cls", [SupConModule, RnCModule, ReLICModule], ids=lambda c: c.__name__)
def test_python_construction_uses_and_records_the_methods_defaults(cls: type) -> None:
    model = cls(backbone=TINY_BACKBONE, online_probe=False)
    for name, value in METHOD_DEFAULTS[cls].items():
        assert model.hparams[name] == value, (cls.__name__, name)
    assert set(model.hparams) == set(inspect.signature(cls).parameters)  # every argument, as LightningCLI's record
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
    with pytest.raises(TypeError, match="LinearRegressorModule: missing a required argument: 'num_classes'"):
        LinearRegressorModule(encoder_info=info)


def test_pretrain_module_takes_the_online_evaluators_arguments_once() -> None:
    model = PretrainModule(backbone=TINY_BACKBONE, num_classes=3, task="nominal", knn_k=5, knn_temperature=0.2,
                           online_probe_lr=0.3, online_probe_norm=False)
    ev = model.online_eval
    assert (ev.num_classes, ev.task, ev.knn_k, ev.knn_temperature, ev.lr, ev.norm) == (3, "nominal", 5, 0.2, 0.3, False)
    assert model.probe is not None and model.hparams.knn_k == 5 and "knn_k" not in inspect.signature(BaseModule).parameters
    with pytest.raises(ValueError, match="knn_k"):
        PretrainModule(backbone=TINY_BACKBONE, knn_k=-1)


def test_a_wrong_argument_names_the_class() -> None:
    with pytest.raises(TypeError, match="SupConModule: got an unexpected keyword argument 'lr_rate'"):
        SupConModule(backbone=TINY_BACKBONE, lr_rate=0.1)


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
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                "pytorch-lightning_version": L.__version__}, path)
    loaded = _MySupCon.load_from_checkpoint(path, weights_only=False)
    assert loaded.width == 3 and loaded.hparams.projector_dim == 16 and loaded.hparams.lr == 0.05
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)


# ---------------------------------------------------------------------- the decorator itself
class _Component:
    """A component whose arguments a method takes.

    Args:
        k: neighbours (component).
    """

    def __init__(self, k: int = 1) -> None:
        self.k = k


class _Base(L.LightningModule):
    """A base.

    Args:
        lr: the learning rate (base).
        optimizer: the optimiser (base).
    """

    def __init__(self, lr: float = 1e-3, optimizer: str = "adam") -> None:
        super().__init__()
        self.save_hyperparameters()


@method_defaults(_Component, lr=0.5)
class _Method(_Base):
    """A method.

    Args:
        t: its own argument.
        **kwargs: the rest.

    Keyword Args:
        optimizer (str): the optimiser (as this method uses it).

    Example::

        _Method(t=2.0)
    """

    def __init__(self, t: float = 1.0, **kwargs: Any) -> None:
        self.component = _Component(**take_arguments(_Component, kwargs))
        super().__init__(**kwargs)


def test_decorator_signature_hparams_and_docstring() -> None:
    sig = inspect.signature(_Method)
    assert list(sig.parameters) == ["t", "k", "lr", "optimizer"]
    assert sig.parameters["lr"].default == 0.5 and sig.parameters["lr"].kind is inspect.Parameter.KEYWORD_ONLY
    m = _Method(2.0, k=3)
    assert m.component.k == 3 and dict(m.hparams) == {"t": 2.0, "k": 3, "lr": 0.5, "optimizer": "adam"}
    doc = inspect.getdoc(_Method) or ""
    args = doc[doc.index("Args:"):doc.index("Example::")]
    for line in ("t: its own argument.", "k: neighbours (component).", "lr: the learning rate (base).",
                 "optimizer (str): the optimiser (as this method uses it)."):
        assert "\n    " + line in args
    assert args.index("optimizer (str):") < args.index("**kwargs:"), "inherited entries go before **kwargs"
    assert "Keyword Args" not in doc and "the optimiser (base)" not in doc


@method_defaults(lr=0.25)
class _Outer(_Base):
    """Builds another decorated module inside its constructor.

    Args:
        inner_t: the inner module's ``t``.
    """

    def __init__(self, inner_t: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inner = _Method(t=inner_t)


def test_a_module_built_inside_another_keeps_its_own_hparams() -> None:
    outer = _Outer(optimizer="sgd")
    assert dict(outer.hparams) == {"inner_t": 5.0, "lr": 0.25, "optimizer": "sgd"}
    assert dict(outer.inner.hparams) == {"t": 5.0, "k": 1, "lr": 0.5, "optimizer": "adam"}


def test_decorator_refuses_what_it_cannot_honour() -> None:
    with pytest.raises(TypeError, match=r"\['lrr'\] are no arguments of its bases"):
        method_defaults(lrr=0.1)(type("_Typo", (_Base,), {"__init__": _Method.__dict__["__init__"].__wrapped__}))

    def own_init(self: Any, lr: float = 0.1, **kwargs: Any) -> None: ...

    with pytest.raises(TypeError, match=r"\['lr'\] are declared by _Own.__init__ itself"):
        method_defaults(lr=0.2)(type("_Own", (_Base,), {"__init__": own_init}))
    with pytest.raises(TypeError, match=r"must define __init__\(self, \.\.\., \*\*kwargs\)"):
        method_defaults(lr=0.2)(type("_NoInit", (_Base,), {}))


@pytest.mark.parametrize("cls", [*METHOD_DEFAULTS, PretrainModule], ids=lambda c: c.__name__)
def test_class_docstring_documents_every_argument(cls: type) -> None:
    """What ``--help`` reads (older jsonargparse reads the class's own docstring only, no base's)."""
    import docstring_parser

    described = {p.arg_name for p in docstring_parser.parse(cls.__doc__ or "").params if p.description}
    missing = set(inspect.signature(cls).parameters) - described
    assert not missing, f"{cls.__name__}'s docstring does not describe {sorted(missing)}"
