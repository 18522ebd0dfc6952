"""One LightningModule per method, on a thin shared base."""

from cloc_lightning.methods.base import BaseModule, ClassifierModule
from cloc_lightning.methods.ce import CEModule
from cloc_lightning.methods.cloc import CLOCModule

__all__ = ["BaseModule", "ClassifierModule", "CEModule", "CLOCModule"]
