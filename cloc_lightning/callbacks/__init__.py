"""Callbacks: prediction writer (more come with the methods)."""

from cloc_lightning.callbacks.predictions import PredictionWriter

__all__ = ["PredictionWriter"]
