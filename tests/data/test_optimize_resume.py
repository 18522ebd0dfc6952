"""``cloc-lightning data optimize`` killed while LitData's parallel writers run, then run again (long tier).

The rerun continues after the chunks finished before the kill (LitData's checkpoints, kept for the same plan:
:data:`cloc_lightning.data.optimize.PARTIAL_FILE`) and its chunk files equal those of an uninterrupted run, byte for
byte; a rerun with another plan (another ``--chunk_bytes``) starts anew.  A remote ``--out`` resumes the same way from
its stage folder (``tests/data/test_stream_s3.py`` checks the upload).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("litdata", reason="data optimize needs the [streaming] extra (litdata)")

from cloc_lightning.data.optimize import PARTIAL_FILE
from cloc_lightning.data.streaming import SPLIT_FILE, ChunkSplit
from tests.conftest import cli_env

pytestmark = pytest.mark.slow

TRAIN = 12_000
DATA = [
    "--data", "OrdinalShapesDataModule", "--data.num_classes", "4", "--data.train_size", str(TRAIN),
    "--data.val_size", "10", "--data.test_size", "10", "--data.image_size", "32",
]  # fmt: skip


def _command(out: Path, chunk_bytes: str) -> list[str]:
    args = ["data", "optimize", *DATA, "--out", str(out), "--format", "raw", "--workers", "2", "--chunk_bytes", chunk_bytes]
    return [sys.executable, "-m", "cloc_lightning", *args, "--splits", "[train]"]


def _optimize(out: Path, chunk_bytes: str) -> str:
    proc = subprocess.run(_command(out, chunk_bytes), cwd=out.parent, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


def _kill_after_some_chunks(out: Path, chunk_bytes: str, at_least: int = 4) -> dict[str, tuple[int, int]]:
    """Start the command, SIGKILL it (and its writers) once LitData has checkpointed ``at_least`` chunks; the chunk files
    the checkpoints list, with their inode and modification time."""
    log = open(out.parent / f"{out.name}.killed.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        _command(out, chunk_bytes), cwd=out.parent, env=cli_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 300
    listed: list[str] = []
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            listed = []
            for f in (out / "train" / ".checkpoints").glob("checkpoint-*.json"):
                try:
                    listed += [c["filename"] for c in json.loads(f.read_text())["chunks"]]
                except (OSError, ValueError, KeyError):  # being replaced
                    continue
            if len(listed) >= at_least:
                break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        log.close()
    assert len(listed) >= at_least and not (out / "train" / "index.json").exists(), (
        f"the write was not caught mid-way (checkpointed chunks: {len(listed)})\n"
        + (out.parent / f"{out.name}.killed.log").read_text()[-3000:]
    )
    return {name: ((s := (out / "train" / name).stat()).st_ino, s.st_mtime_ns) for name in listed}


def _chunk_bytes_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("chunk-*.bin"))}


def test_an_interrupted_parallel_write_continues_after_its_finished_chunks(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    _optimize(reference, "64KB")
    interrupted = tmp_path / "interrupted"
    before = _kill_after_some_chunks(interrupted, "64KB")
    assert (interrupted / "train" / PARTIAL_FILE).is_file()
    out = _optimize(interrupted, "64KB")
    assert "continuing the interrupted write" in out, out[-3000:]
    for name, (inode, mtime) in before.items():  # kept, not written again
        s = (interrupted / "train" / name).stat()
        assert (s.st_ino, s.st_mtime_ns) == (inode, mtime), name
    assert _chunk_bytes_of(interrupted / "train") == _chunk_bytes_of(reference / "train")
    left = {p.name for p in (interrupted / "train").iterdir()} - set(_chunk_bytes_of(reference / "train"))
    assert left == {"index.json", "cloc_split.json"}, left  # no checkpoints, no plan left behind
    # the resumed chunks read back: every image and label equals the uninterrupted set's
    a, b = (ChunkSplit(str(d / "train"), json.loads((d / "train" / SPLIT_FILE).read_text())) for d in (reference, interrupted))
    assert a.targets == b.targets and len(a) == TRAIN
    for i in range(0, TRAIN, 997):
        assert torch.equal(a.stored(i)[0], b.stored(i)[0]), i


def test_an_interrupted_write_rerun_with_another_plan_starts_anew(tmp_path: Path) -> None:
    out = tmp_path / "set"
    _kill_after_some_chunks(out, "64KB")
    text = _optimize(out, "128KB")
    assert "continuing the interrupted write" not in text
    reference = tmp_path / "reference"
    _optimize(reference, "128KB")
    assert _chunk_bytes_of(out / "train") == _chunk_bytes_of(reference / "train")
