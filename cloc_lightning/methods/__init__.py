"""One LightningModule per method, on a thin shared base."""

from cloc_lightning.methods.base import BaseModule
from cloc_lightning.methods.ce import CEModule
from cloc_lightning.methods.classifier import ClassifierModule
from cloc_lightning.methods.cloc import CLOCModule
from cloc_lightning.methods.linear_probe import LinearProbeModule
from cloc_lightning.methods.linear_regressor import LinearRegressorModule
from cloc_lightning.methods.momentum import MomentumModule
from cloc_lightning.methods.ordinal_clip import OrdinalCLIPModule
from cloc_lightning.methods.ordinal_regression import OrdinalRegressionModule
from cloc_lightning.methods.pretrain import MultiViewModule, PretrainModule
from cloc_lightning.methods.relic import ReLICModule
from cloc_lightning.methods.rnc import RnCModule
from cloc_lightning.methods.supcon import SupConModule
from cloc_lightning.methods.tracking import BestFinalTracking

__all__ = ["BaseModule", "ClassifierModule", "PretrainModule", "CEModule", "CLOCModule"]
__all__ += ["LinearProbeModule", "SupConModule"]
__all__ += ["OrdinalCLIPModule"]
__all__ += ["ReLICModule"]
__all__ += ["RnCModule", "LinearRegressorModule"]
__all__ += ["OrdinalRegressionModule"]
__all__ += ["BestFinalTracking"]
__all__ += ["MultiViewModule", "MomentumModule"]


def __getattr__(name: str) -> object:
    """``method_defaults`` (removed): say what replaced it."""
    if name == "method_defaults":
        raise ImportError(
            "cloc_lightning.methods.method_defaults was removed: a method now states a default it changes by "
            "re-declaring that argument in its __init__ (the base's type, its own default) and passing it on to "
            "super().__init__ by name, e.g. def __init__(self, *, lr: float = 0.05, **kwargs): super().__init__(lr=lr, "
            "**kwargs); see docs/extending.md"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
