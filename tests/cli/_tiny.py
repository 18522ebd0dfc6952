"""The tiny CE fit the CLI tests run: one epoch on 16 px shapes (2 training steps), run folders under ``runs/``."""

from __future__ import annotations

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
