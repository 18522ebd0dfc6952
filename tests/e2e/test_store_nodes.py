"""One store per node through the real command line: 2-process DDP on one node, and 2 nodes simulated with ``torchrun``.

* One node, two processes (Lightning's own launcher), ``data.cache: memory``: every image is decoded once
  (the user project ``tests/fixtures/store_project`` counts decodes in a file) and the run trains.
* Two nodes on localhost (``torchrun --nnodes 2``, one process each, ``$CLOC_SHM_DIR`` and, for a
  node-local ``cache_dir``, ``$CLOC_CACHE_DIR`` per node): a shared ``cache_dir`` is built once, a
  node-local one once per node, ``memory`` once per node; each trains to the same weights as the
  one-node run (the same world size, seed and data).

Marked ``slow`` and ``ddp``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, TINY_BACKBONE, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.ddp]

PROJECT = REPO / "tests" / "fixtures" / "store_project"
SIZES = {"train_size": 32, "val_size": 8, "test_size": 8}
N = SIZES["train_size"] + SIZES["val_size"]  # a fit decodes the splits it reads (the test split when a test stage reads it)


def _args(cache: str, run: Path) -> list[str]:
    return [
        "fit", "--seed_everything", "0", "--model", "CEModule", "--model.num_classes", "3", "--model.backbone", TINY_BACKBONE,
        "--data", "store_project.CountedShapes", "--data.num_classes", "3", "--data.batch_size", "8", "--data.num_workers", "0",
        "--data.augment", "rrc_flip", "--data.cache", cache,
        *(x for k, v in SIZES.items() for x in (f"--data.{k}", str(v))),
        "--trainer.max_epochs", "2", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(run), "--trainer.logger.name", "r", "--test_after_fit", "false",
    ]  # fmt: skip


def _env(marker: Path, **extra: str) -> dict[str, str]:
    env = cli_env()
    env["PYTHONPATH"] = str(PROJECT) + os.pathsep + env["PYTHONPATH"]
    env["STORE_PROJECT_DECODES"] = str(marker)
    env.update(extra)
    return env


def _weights(run: Path) -> dict[str, torch.Tensor]:
    last = sorted(run.rglob("last*.ckpt"))
    assert last, sorted(str(p) for p in run.rglob("*"))
    state: dict[str, torch.Tensor] = torch.load(last[0], map_location="cpu", weights_only=False)["state_dict"]
    return state


def _decodes(marker: Path) -> int:
    return marker.stat().st_size if marker.exists() else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_nodes(tmp: Path, cache: str, node_env: list[dict[str, str]], marker: Path) -> Path:
    run = tmp / "run"
    port = str(_free_port())
    procs = []
    for node in range(2):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
            "--master_addr", "127.0.0.1", "--master_port", port, "-m", "cloc_lightning",
            *_args(cache, run), "--trainer.num_nodes", "2", "--trainer.devices", "1", "--trainer.strategy", "ddp",
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(cmd, cwd=tmp, env=_env(marker, **node_env[node]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-4000:]
    return run


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], int]:
    tmp = tmp_path_factory.mktemp("one_node")
    marker = tmp / "decodes"
    cmd = [sys.executable, "-m", "cloc_lightning", *_args("memory", tmp / "run"), "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    proc = subprocess.run(cmd, cwd=tmp, env=_env(marker, CLOC_SHM_DIR=str(tmp / "shm")), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert not list((tmp / "shm").iterdir())  # the last process out removed the node's memory stores
    return _weights(tmp / "run"), _decodes(marker)


def test_one_node_two_processes_decode_once(one_node: tuple[dict[str, torch.Tensor], int]) -> None:
    assert one_node[1] == N  # was once per process: 2N


@pytest.mark.parametrize(
    "case, cache, per_node_decodes",
    [("shared cache_dir", "disk", False), ("node-local cache_dir", "disk", True), ("memory", "memory", True)],
)
def test_two_nodes_build_per_their_folders_and_train_as_one_node(
    case: str, cache: str, per_node_decodes: bool, tmp_path: Path, one_node: tuple[dict[str, torch.Tensor], int]
) -> None:
    marker = tmp_path / "decodes"
    shared = str(tmp_path / "shared_cache")
    envs = [
        {"CLOC_SHM_DIR": str(tmp_path / f"shm{k}"), "CLOC_CACHE_DIR": shared if case == "shared cache_dir" else str(tmp_path / f"cache{k}")}
        for k in range(2)
    ]
    run = _two_nodes(tmp_path, cache, envs, marker)
    assert _decodes(marker) == (2 * N if per_node_decodes else N), case
    weights, reference = _weights(run), one_node[0]
    assert weights.keys() == reference.keys()
    for k in reference:
        torch.testing.assert_close(weights[k], reference[k], rtol=0, atol=1e-6, msg=f"{case}: {k}")
