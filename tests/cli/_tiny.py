"""The tiny CE fit the CLI tests run: one epoch on 16 px shapes (2 training steps), run folders under ``runs/``;
and the pieces of the tests that fit and evaluate on tiny image folders of their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from tests.conftest import TINY_BACKBONE

MODEL = ["--model", "CEModule", "--model.num_classes", "4", "--model.backbone", TINY_BACKBONE]
DATA = [
    "--data",
    "OrdinalShapesDataModule",
    "--data.num_classes",
    "4",
    "--data.train_size",
    "16",
    "--data.val_size",
    "8",
    "--data.test_size",
    "8",
    "--data.batch_size",
    "8",
    "--data.num_workers",
    "0",
    "--data.image_size",
    "16",
    "--trainer.max_epochs",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--trainer.logger.init_args.save_dir",
    "runs",
]

#: a CE model whose num_classes comes from the data module
CE_MODEL = ["--model", "CEModule", "--model.backbone", TINY_BACKBONE]
#: CPU, quiet, no loader workers, 16 px
QUIET = [
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--trainer.accelerator",
    "cpu",
    "--data.num_workers",
    "0",
    "--data.image_size",
    "16",
]
CSV_LOGGER = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.init_args.save_dir", "runs"]


def png(path: Path, seed: int) -> Path:
    """A 12x12 RGB PNG of seeded noise at ``path`` (parents made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(path)
    return path
