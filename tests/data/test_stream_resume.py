"""Exact resume of a fit that trains from LitData chunks (``data.stream_from``): killed mid-epoch, resumed, equal.

The order of a stream is ours (:class:`~cloc_lightning.data.streaming.ChunkShuffleSampler`,
:class:`~cloc_lightning.data.streaming.DistributedChunkShuffleSampler`: a function of seed, epoch and
number of processes) and the position is saved by :class:`~cloc_lightning.resume.ResumableDataLoader`,
not by LitData's ``StreamingDataLoader``, whose resume has open reports: across nodes
(Lightning-AI/litData#248) and after a second epoch broken off early (#760).  Each case below trains
from one chunk set (``cloc-lightning data optimize`` of the config, written once for the module) and
compares every tensor of the final ``last.ckpt``'s ``state_dict`` with an uninterrupted run's:

* one process, SIGKILL mid-epoch 0, ``--ckpt_path last``;
* one process, 2 loader workers, SIGTERM mid-epoch 1 (``PreemptionCheckpoint`` saves, exit 143), resumed --
  compared with the run without workers (the views do not depend on the workers);
* 2-process DDP (Lightning's launcher, gloo), SIGKILL of every process mid-epoch 1;
* 2 nodes on localhost (two ``torchrun --nnodes 2`` launches, the litData#248 path), SIGKILL mid-epoch 1,
  compared with an uninterrupted 2-node run (and that with the 1-node 2-process run: the same world size);
* the litData#760 path, ``augment_on: device``: every epoch broken off early (``limit_train_batches``), a
  kill right after the second epoch's early end, a resume killed in the middle of the third epoch, a
  resume that finishes two more epochs.

The fast tests check the samplers themselves (the shares of the processes are contiguous parts of one
order, cover every position once per epoch with ``drop_last``, a sample's views do not depend on the
number of processes) and the loader's position after an epoch broken off early.  The rest is marked ``slow`` (CLI subprocesses; the DDP ones also ``ddp``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cloc_lightning.callbacks.preemption import SIGTERM_EXIT_CODE
from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.data.datasets import TransformedSubset
from cloc_lightning.data.streaming import ChunkShuffleSampler, ChunkSplit, DistributedChunkShuffleSampler, chunk_order
from cloc_lightning.resume import ResumableDataLoader
from tests._reliability import RESUME_SETUPS, SMALL, _cli_config, _fit_killed_at, _last_ckpt
from tests.conftest import cli_env, run_cli

#: the model and data of every streamed fit: CLOC with learnable margins, 64 training images, random crops + flips
STREAM_SETUP: dict[str, Any] = {
    "max_epochs": 2,
    "callbacks": [],
    "model": {"class_path": "cloc_lightning.methods.CLOCModule", "init_args": {"num_classes": 4, **SMALL, "margin_lr": 0.05, "lr": 0.003}},
    "data": {"augment": "crop_flip"},
}
#: 2 processes: 32 images each, batches of 8, so 4 steps per epoch as with one process and batches of 16
DDP = ["--data.batch_size", "8", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu"]
TIMEOUT = 600
#: ``data optimize`` options: JPEG chunks of 8 KB (about 6 images each), written by 2 LitData workers
OPTIMIZE = ["--format", "jpeg", "--chunk_bytes", "8KB", "--workers", "2"]


# ---------------------------------------------------------------------------------------------------
# the samplers (fast)
# ---------------------------------------------------------------------------------------------------
def _fake_split(chunk_sizes: list[int], size: int = 16) -> ChunkSplit:
    """A :class:`ChunkSplit` read from memory (no LitData): sample ``i`` is a random ``raw`` image of its own."""
    n = sum(chunk_sizes)
    meta = {"targets": [i % 4 for i in range(n)], "layout": {"mode": "resize", "size": size}, "chunk_sizes": chunk_sizes}
    split = ChunkSplit("memory://fake", meta)
    rng = np.random.default_rng(0)
    split._ds = [
        {"index": i, "label": i % 4, "h": size, "w": size, "nh": size, "nw": size, "codec": "raw", "image": rng.bytes(3 * size * size)}
        for i in range(n)
    ]
    return split


def test_chunk_samplers_share_one_order_and_views_do_not_depend_on_the_processes() -> None:
    split = _fake_split([7, 5, 6, 6, 3, 7, 2, 6])  # 42 images in 8 chunks of uneven sizes
    kept = [i for i in range(len(split)) if i % 10 != 3]  # a subsample (train_fraction, few_shot): positions != base indices
    ds = TransformedSubset(split, kept, OrdinalShapesDataModule(image_size=16).train_image_transform(), seed=3)
    n = len(ds)
    views: dict[tuple[int, int], torch.Tensor] = {}
    for epoch in range(2):
        order = ChunkShuffleSampler(ds, seed=3)
        order.set_epoch(epoch)
        whole = list(order)
        assert sorted(whole) == list(range(n)), "one process reads every position once per epoch"
        assert whole == chunk_order(order._chunk_of, 3, epoch, 4)
        for world in (1, 2, 3, 4):
            shares = []
            for rank in range(world):
                sampler = DistributedChunkShuffleSampler(ds, world, rank, seed=3, drop_last=True)
                sampler.set_epoch(epoch)
                shares.append(list(sampler))
            assert {len(s) for s in shares} == {n // world}
            assert [p for s in shares for p in s] == whole[: n // world * world], f"{world} processes: not contiguous parts of one order"
            padded = []
            for rank in range(world):
                sampler = DistributedChunkShuffleSampler(ds, world, rank, seed=3)
                sampler.set_epoch(epoch)
                padded.append(list(sampler))
            total = -(-n // world) * world
            assert [p for s in padded for p in s] == (whole + whole)[:total]  # padded with the order's own first positions
            # the views of a position are the same whichever process (and how many) draws them
            ds.set_epoch(epoch)
            for share in shares:
                for p in share[:3] + share[-2:]:
                    x = ds[p][0]
                    seen = views.setdefault((epoch, p), x)
                    assert torch.equal(seen, x), f"epoch {epoch}, position {p}: the views differ with {world} processes"
        # a mid-epoch skip continues the share (what ResumableDataLoader asks on resume)
        sampler = DistributedChunkShuffleSampler(ds, 2, 1, seed=3, drop_last=True)
        sampler.set_epoch(epoch)
        share = list(sampler)
        sampler.skip(5)
        assert list(sampler) == share[5:] and list(sampler) == share
    both = sorted({p for e, p in views if e == 0} & {p for e, p in views if e == 1})
    assert both and all(not torch.equal(views[(0, p)], views[(1, p)]) for p in both), "a position's views change with the epoch"


def test_loader_position_after_resuming_an_epoch_broken_off_early() -> None:
    """litData#760's loader state: ``limit_train_batches`` ends epoch 1 after 3 of its 7 batches, so the checkpoint at
    its end holds ``{epoch: 1, batches: 3}``; the resumed fit starts epoch 2 (Lightning's ``set_epoch``), whose order
    and count start at 0 (the count went on from 3: a checkpoint one batch into epoch 2 said 4 batches were done, or,
    past the epoch's length, that epoch 3 was next)."""
    ds = TransformedSubset(_fake_split([7, 5, 6, 6, 3, 7, 2, 6]), None, None)
    loader = ResumableDataLoader(ds, batch_size=6, sampler=ChunkShuffleSampler(ds, seed=3), drop_last=True)
    fresh = ResumableDataLoader(ds, batch_size=6, sampler=ChunkShuffleSampler(ds, seed=3), drop_last=True)
    fresh.sampler.set_epoch(2)
    epoch2 = [int(i) for x in fresh for i in x[1]]
    loader.load_state_dict({"epoch": 1, "batches": 3, "batch_size": 6})
    loader.sampler.set_epoch(2)  # what Lightning does when the next epoch starts
    batches = iter(loader)
    assert [int(i) for i in next(batches)[1]] == epoch2[:6]
    assert loader.state_dict() == {"epoch": 2, "batches": 1, "batch_size": 6}
    # a mid-epoch resume of the same epoch still continues where it was
    loader = ResumableDataLoader(ds, batch_size=6, sampler=ChunkShuffleSampler(ds, seed=3), drop_last=True)
    loader.load_state_dict({"epoch": 2, "batches": 2, "batch_size": 6})
    loader.sampler.set_epoch(2)
    assert [int(i) for x in loader for i in x[1]] == epoch2[12:] and loader.state_dict()["epoch"] == 3


# ---------------------------------------------------------------------------------------------------
# the CLI runs (slow)
# ---------------------------------------------------------------------------------------------------
def _config(work: Path, name: str, stream: Path | None, setup: dict[str, Any], extra_callbacks: list[dict] | None = None) -> Path:
    """``tests._reliability._cli_config`` of ``setup`` (checkpoints after every step), training from ``stream``."""
    data = {**setup["data"], **({"stream_from": str(stream)} if stream is not None else {})}
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(RESUME_SETUPS, "stream", {**setup, "data": data})
        return _cli_config(work, name, extra_callbacks, setup="stream")


def _weights(work: Path, name: str) -> dict[str, Any]:
    return torch.load(_last_ckpt(work / "runs" / name), map_location="cpu", weights_only=False)


def assert_weights_equal(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    """Every tensor of the two checkpoints' ``state_dict`` within 1e-6 (in practice bit for bit), at the same step."""
    assert (got["global_step"], got["epoch"]) == (want["global_step"], want["epoch"]), what
    a, b = got["state_dict"], want["state_dict"]
    assert a.keys() == b.keys(), f"{what}: keys {sorted(set(a) ^ set(b))}"
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=lambda m, k=k: f"{what}: {k}: {m}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _commands(cfg: Path, extra: list[str], nodes: int, resume: bool) -> list[list[str]]:
    """The command line of a fit of ``cfg``: one process (Lightning launches the DDP ones), or one ``torchrun`` per node."""
    args = ["fit", "--config", str(cfg), *extra, *(["--ckpt_path", "last"] if resume else [])]
    if nodes == 1:
        return [[sys.executable, "-m", "cloc_lightning", *args]]
    port = str(_free_port())
    node_args = ["--trainer.num_nodes", str(nodes), "--trainer.devices", "1"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc_per_node", "1"]
    launch += ["--master_addr", "127.0.0.1", "--master_port", port]
    return [[*launch, "--node_rank", str(node), "-m", "cloc_lightning", *args, *node_args] for node in range(nodes)]


def _run(work: Path, cfg: Path, extra: list[str], nodes: int = 1, resume: bool = False, pause: Path | None = None) -> str:
    """Run a fit to its end (``pause=None``), or until a process has written ``pause`` and then SIGKILL all of them.

    The kill reaches every process the launches started (Lightning's DDP ranks, the ``torchrun`` agents and their
    workers, which ``torchrun`` starts in sessions of their own, loader workers) at once, as a loss of power would.
    """
    logs, procs = [], []
    for i, cmd in enumerate(_commands(cfg, extra, nodes, resume)):
        log = open(work / f"{cfg.stem}.{int(time.time() * 1000)}.{i}.log", "w+")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(subprocess.Popen(cmd, cwd=work, env=cli_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        deadline = time.monotonic() + TIMEOUT
        while any(p.poll() is None for p in procs) if pause is None else not pause.exists():
            failed = [p.returncode for p in procs if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline or (pause is not None and all(p.poll() is not None for p in procs)):
                raise AssertionError(f"{cfg.name} {extra}: rc {[p.poll() for p in procs]}:\n" + _text(logs)[-6000:])
            time.sleep(0.2)
        if pause is None and any(p.returncode != 0 for p in procs):
            raise AssertionError(f"{cfg.name} {extra}: rc {[p.returncode for p in procs]}:\n" + _text(logs)[-6000:])
        if pause is not None:
            time.sleep(0.5)  # the other ranks (past the checkpoint's barrier) reach the pause too
            _kill_all(procs)
            assert all(p.wait(timeout=60) == -signal.SIGKILL for p in procs), [p.returncode for p in procs]
    finally:
        if any(p.poll() is None for p in procs):
            _kill_all(procs)
    out = _text(logs)
    for log in logs:
        log.close()
    return out


def _kill_all(procs: list[subprocess.Popen]) -> None:
    """SIGKILL ``procs`` and every process below them (read from ``/proc`` before the first kill), then reap ``procs``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid ..."
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [p.pid for p in procs]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for p in procs:
        p.wait(timeout=60)


def _text(logs: list[Any]) -> str:
    parts = []
    for log in logs:
        log.flush()
        log.seek(0)
        parts.append(log.read())
    return "\n".join(parts)


def _pause_at(work: Path, name: str, step: int) -> tuple[list[dict], Path]:
    marker = work / f"{name}.paused_at_{step}"
    return [{"class_path": "tests._faults.PauseAtStep", "init_args": {"step": step, "marker": str(marker)}}], marker


def _killed_and_resumed(
    work: Path, stream: Path, name: str, setup: dict[str, Any], extra: list[str], kill_at: list[int], nodes: int = 1
) -> tuple[dict[str, Any], list[str]]:
    """A fit SIGKILLed once ``last.ckpt`` holds global step ``kill_at[0]``, started again with ``--ckpt_path last`` and killed at
    ``kill_at[1]``, ..., then run to its end: ``(final last.ckpt, outputs of the resumed runs)``."""
    outs = []
    for k, step in enumerate(kill_at):
        callbacks, marker = _pause_at(work, name, step)
        out = _run(work, _config(work, name, stream, setup, callbacks), extra, nodes, resume=k > 0, pause=marker)
        assert "data.stream_from" in out, out[-3000:]
        if k > 0:
            outs.append(out)
    outs.append(_run(work, _config(work, name, stream, setup), extra, nodes, resume=True))
    for out, step in zip(outs, kill_at, strict=True):
        assert f"global step {step}" in out and "resuming from" in out, out[-3000:]
    return _weights(work, name), outs


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(work folder, chunk set)``: the config's splits written once with ``cloc-lightning data optimize`` (several small chunks)."""
    work = tmp_path_factory.mktemp("stream_resume")
    out = work / "chunks"
    run_cli(
        ["data", "optimize", "--config", str(_config(work, "optimize", None, STREAM_SETUP)), "--out", str(out), *OPTIMIZE],
        work,
        timeout=TIMEOUT,
    )
    chunks = sorted((out / "train").glob("chunk-*.bin"))
    assert len(chunks) >= 4 and (out / "cloc_stream.json").is_file(), sorted(p.name for p in (out / "train").iterdir())
    return work, out


@pytest.fixture(scope="module")
def one_process(stream: tuple[Path, Path]) -> dict[str, Any]:
    """The uninterrupted fit of one process: 2 epochs of 4 steps, no loader workers."""
    work, chunks = stream
    out = _run(work, _config(work, "one", chunks, STREAM_SETUP), [])
    assert "data.stream_from" in out, out[-3000:]
    reference = _weights(work, "one")
    assert reference["global_step"] == 8
    return reference


@pytest.fixture(scope="module")
def two_processes(stream: tuple[Path, Path]) -> dict[str, Any]:
    """The uninterrupted 2-process DDP fit (Lightning's launcher): 2 epochs of 4 steps."""
    work, chunks = stream
    _run(work, _config(work, "ddp", chunks, STREAM_SETUP), [*DDP, "--trainer.devices", "2"])
    reference = _weights(work, "ddp")
    assert reference["global_step"] == 8
    return reference


@pytest.mark.slow
def test_one_process_sigkill_mid_epoch_resumes_exactly(stream: tuple[Path, Path], one_process: dict[str, Any]) -> None:
    """SIGKILL after step 3 of 4 (the resumed run finishes epoch 0, then reads epoch 1's chunk order)."""
    work, chunks = stream
    with pytest.MonkeyPatch.context() as mp:  # the kill of tests/test_resume.py, on a config that streams
        mp.setitem(RESUME_SETUPS, "stream", {**STREAM_SETUP, "data": {**STREAM_SETUP["data"], "stream_from": str(chunks)}})
        out = _fit_killed_at(work, "sigkill", 3, resume=True, setup="stream")
        assert "data.stream_from" in out and "training starts from scratch" in out, out[-3000:]
    final = run_cli(["fit", "--config", str(_config(work, "sigkill", chunks, STREAM_SETUP)), "--ckpt_path", "last"], work, timeout=TIMEOUT)
    assert "resuming from" in final.stdout and "epoch 0 after batch 3, global step 3" in final.stdout, final.stdout[-3000:]
    assert_weights_equal(_weights(work, "sigkill"), one_process, "SIGKILL at step 3")


@pytest.mark.slow
def test_one_process_sigterm_mid_epoch_with_workers_resumes_exactly(stream: tuple[Path, Path], one_process: dict[str, Any]) -> None:
    """2 loader workers (each opens its own LitData reader); SIGTERM after step 6: ``PreemptionCheckpoint`` saves
    ``last.ckpt`` mid-epoch 1 and exits 143 (as ``tests/callbacks/test_preemption.py``); the resumed fit equals the
    uninterrupted one without workers."""
    work, chunks = stream
    setup = {**STREAM_SETUP, "data": {**STREAM_SETUP["data"], "num_workers": 2}}
    sigterm = [{"class_path": "tests._faults.SignalAtStep", "init_args": {"step": 6}}]
    part = run_cli(["fit", "--config", str(_config(work, "sigterm", chunks, setup, sigterm))], work, timeout=TIMEOUT, check=False)
    assert part.returncode == SIGTERM_EXIT_CODE, (part.returncode, part.stderr[-3000:])
    assert "SIGTERM received: saved a checkpoint at epoch 1, 2 of its batches done (global step 6)" in part.stderr, part.stderr[-3000:]
    done = run_cli(["fit", "--config", str(_config(work, "sigterm", chunks, setup)), "--ckpt_path", "last"], work, timeout=TIMEOUT)
    assert "resuming from" in done.stdout and "global step 6" in done.stdout, done.stdout[-3000:]
    assert_weights_equal(_weights(work, "sigterm"), one_process, "SIGTERM at step 6, 2 workers")


@pytest.mark.slow
@pytest.mark.ddp
def test_ddp_two_processes_killed_mid_epoch_resume_exactly(stream: tuple[Path, Path], two_processes: dict[str, Any]) -> None:
    """2 processes on one node (gloo), SIGKILL of both after step 5 (mid-epoch 1), ``--ckpt_path last``."""
    work, chunks = stream
    resumed, outs = _killed_and_resumed(work, chunks, "ddp-chain", STREAM_SETUP, [*DDP, "--trainer.devices", "2"], [5])
    assert "epoch 1 after batch 1" in outs[-1], outs[-1][-3000:]
    assert_weights_equal(resumed, two_processes, "2-process DDP killed at step 5")


@pytest.mark.slow
@pytest.mark.ddp
def test_two_nodes_killed_mid_epoch_resume_exactly(stream: tuple[Path, Path], two_processes: dict[str, Any]) -> None:
    """litData#248's path: 2 nodes (``torchrun --nnodes 2 --node_rank 0/1`` on localhost, one process each), both
    SIGKILLed after step 6 and started again with ``--ckpt_path last``; equal to an uninterrupted 2-node run, which
    equals the 1-node 2-process run (the same world size: the order and views do not depend on the layout)."""
    work, chunks = stream
    out = _run(work, _config(work, "nodes", chunks, STREAM_SETUP), DDP, nodes=2)
    assert "data.stream_from" in out, out[-3000:]
    reference = _weights(work, "nodes")
    assert_weights_equal(reference, two_processes, "2 nodes vs 1 node of 2 processes")
    resumed, outs = _killed_and_resumed(work, chunks, "nodes-chain", STREAM_SETUP, DDP, [6], nodes=2)
    assert "epoch 1 after batch 2" in outs[-1], outs[-1][-3000:]
    assert_weights_equal(resumed, reference, "2 nodes killed at step 6")


@pytest.mark.slow
def test_epochs_broken_off_early_resume_exactly_with_device_augment(stream: tuple[Path, Path]) -> None:
    """litData#760's path, ``augment_on: device``: every epoch ends early (``limit_train_batches 3`` of 4 batches).
    Killed right after the second epoch's early end (step 6), resumed and killed in the middle of the third epoch
    (after step 8), resumed again to the end of epoch 3: equal to the uninterrupted run."""
    work, chunks = stream
    setup = {**STREAM_SETUP, "data": {**STREAM_SETUP["data"], "augment_on": "device"}}
    extra = ["--trainer.limit_train_batches", "3", "--trainer.max_epochs", "4"]
    _run(work, _config(work, "early", chunks, setup), extra)
    reference = _weights(work, "early")
    assert reference["global_step"] == 12
    resumed, outs = _killed_and_resumed(work, chunks, "early-chain", setup, extra, [6, 8])
    assert "training continues with epoch 2" in outs[0], outs[0][-3000:]
    assert "epoch 2 after batch 2" in outs[1], outs[1][-3000:]
    assert_weights_equal(resumed, reference, "broken-off epochs, killed at steps 6 and 8")
