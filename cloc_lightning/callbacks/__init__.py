"""Callbacks: CLOC margin freezing and plots, embedding / confusion plots, prediction writer."""

from cloc_lightning.callbacks.cloc import CLOCMarginFreeze, CLOCMarginPlot
from cloc_lightning.callbacks.plots import ConfusionMatrixPlot, EmbeddingPlot
from cloc_lightning.callbacks.predictions import PredictionWriter

__all__ = ["CLOCMarginFreeze", "CLOCMarginPlot", "ConfusionMatrixPlot", "EmbeddingPlot", "PredictionWriter"]
