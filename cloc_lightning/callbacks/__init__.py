"""Callbacks: CLOC margin freezing and plots, embedding / confusion plots, prediction writer, latest checkpoint, deferred value checks, NaN/inf guards, preemption checkpoint."""

from cloc_lightning.callbacks.checkpoint import BestCheckpoint, LatestCheckpoint
from cloc_lightning.callbacks.checks import DeviceChecks
from cloc_lightning.callbacks.cloc import CLOCMarginFreeze, CLOCMarginPlot
from cloc_lightning.callbacks.finite import FiniteChecks
from cloc_lightning.callbacks.plots import ConfusionMatrixPlot, EmbeddingPlot
from cloc_lightning.callbacks.predictions import PredictionWriter
from cloc_lightning.callbacks.preemption import PreemptionCheckpoint

__all__ = [
    "BestCheckpoint",
    "LatestCheckpoint",
    "CLOCMarginFreeze",
    "CLOCMarginPlot",
    "ConfusionMatrixPlot",
    "EmbeddingPlot",
    "PredictionWriter",
    "DeviceChecks",
    "FiniteChecks",
    "PreemptionCheckpoint",
]
