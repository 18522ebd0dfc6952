"""One LightningModule per method, on a thin shared base."""

from cloc_lightning.methods.base import BaseModule
from cloc_lightning.methods.ce import CEModule
from cloc_lightning.methods.classifier import ClassifierModule
from cloc_lightning.methods.cloc import CLOCModule
from cloc_lightning.methods.defaults import method_defaults
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
__all__ += ["MultiViewModule", "MomentumModule", "method_defaults"]
