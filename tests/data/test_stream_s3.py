"""``data optimize --out s3://...`` and ``data.stream_from: s3://...`` against a real S3-compatible server on localhost.

A session-scoped fixture runs moto's server (``python -m moto.server``) on a free port in a subprocess and
makes it *check credentials*: before anything else it creates IAM users through the server's own IAM API,
then ``POST /moto-api/reset-auth`` with ``0`` (the run-time form of moto's ``INITIAL_NO_AUTH_ACTION_COUNT``)
so that every later request needs a signed access key of one of them and is checked against its policy:

* ``admin``: ``Allow *`` (every run that should work);
* ``noread``: ``Allow s3:*`` but ``Deny s3:GetObject`` (a denied read);
* ``nochunks``: ``Allow s3:*`` but ``Deny s3:GetObject`` on ``*.bin`` (the records read, the chunks denied);
* ``nowrite``: ``Allow s3:*`` but ``Deny s3:PutObject``.

(moto 5.2 checks GetObject and PutObject per user policy; it does not check LIST requests or the parts of a
multipart upload against the policy.)  The AWS variables are only ever set per test (``monkeypatch``) or
passed to a subprocess (``env=``), with the user's own AWS configuration files and profile masked.

Fast tier: the one-line errors -- a missing bucket (``fit`` and ``data optimize``), denied / unknown / wrong
credentials, truncated and deleted chunks in a bucket and in a local folder, a bad ``stream_cache_limit`` --
through :func:`cloc_lightning.cli.main` in this process, on a small chunk set written here by ``data optimize
--workers 1`` (LitData's writer in this process) and uploaded with boto3.  Slow tier: ``cloc-lightning data
optimize --out s3://`` and ``fit`` as subprocesses (the shipped ``configs/cloc/demo.yaml``, and
``configs/simclr/cifar10_cpu.yaml`` where the shared CIFAR-10 copy exists); the same run shows that the secret
key is nowhere in the output or the run folder and that the chunk cache stays within ``stream_cache_limit``.
The subprocesses run the installed ``cloc-lightning`` command; one runs ``python -m cloc_lightning`` (uploads to an
``http://`` endpoint from the command's own process).  Also pinned: the chunks are downloaded whole into the cache, two
loader workers opening a split at once, a chunk read denied in a loader worker and denied writes (one line each).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("litdata", reason="data.stream_from needs the [streaming] extra (litdata)")
pytest.importorskip("boto3", reason="the S3 tests need boto3 (pip install 'moto[server]')")
pytest.importorskip("moto.server", reason="the S3 tests need a local S3 server: pip install 'moto[server]'")

import boto3

from benchmarks.option_sweep import Result, error_lines, run_main
from tests.conftest import CIFAR10, REPO, TINY_BACKBONE, cli_env, needs

BUCKET = "cloc-test"
DEMO = str(REPO / "configs" / "cloc" / "demo.yaml")
#: the demo config small: 64 / 32 / 32 images of the built-in shapes
DEMO_SIZES = ["--data.train_size", "64", "--data.val_size", "32", "--data.test_size", "32"]
#: a fit that stops early and quietly, on the tiny backbone
QUICK_FIT = [
    "--model.backbone",
    TINY_BACKBONE,
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--trainer.logger.init_args.save_dir",
    "runs",
]
#: the AWS variables of a test (set) and of the user's own setup (masked)
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
AWS_MASKED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION")
POLICIES: dict[str, list[dict[str, Any]]] = {
    "admin": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
    "noread": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}, {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "*"}],
    "nochunks": [
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/*.bin"},
    ],
    "nowrite": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}, {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "*"}],
}


# =============================================================================================
# the server
# =============================================================================================
@dataclass
class S3Server:
    """A running moto server that checks credentials: its endpoint, the IAM users' keys, its log."""

    endpoint: str
    keys: dict[str, tuple[str, str]]
    root: Path
    log: Path

    def env(self, who: str = "admin") -> dict[str, str]:
        """The AWS variables of user ``who`` (``admin``, ``noread``, ``nochunks``, ``nowrite``)."""
        key, secret = self.keys[who]
        return {
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self, service: str = "s3", who: str = "admin") -> Any:
        """A boto3 client of user ``who`` on this server (nothing read from the environment)."""
        key, secret = self.keys[who]
        return boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret, region_name="us-east-1").client(
            service, endpoint_url=self.endpoint
        )

    def subprocess_env(self, who: str = "admin") -> dict[str, str]:
        """:func:`~tests.conftest.cli_env` with user ``who``'s variables, the user's own AWS setup masked, and LitData's
        optimizer folders private (its default, ``/tmp/chunks``, is emptied by every ``data optimize`` on the machine)."""
        env = {k: v for k, v in cli_env().items() if k not in AWS_MASKED}
        env.update(self.env(who))
        env.update(_aws_files(self.root))
        work = self.root / f"litdata-{uuid.uuid4().hex[:8]}"
        env["DATA_OPTIMIZER_CACHE_FOLDER"] = str(work / "chunks")
        env["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = str(work / "data")
        return env

    def upload(self, folder: Path, prefix: str) -> str:
        """Every file under ``folder`` to ``s3://BUCKET/prefix/...``; the URL."""
        s3 = self.client()
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")
        return f"s3://{BUCKET}/{prefix}"

    def copy(self, source: str, prefix: str) -> str:
        """The objects under ``s3://BUCKET/source/`` copied (server-side) to ``prefix``; the new URL."""
        s3 = self.client()
        for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix=source + "/")["Contents"]:
            s3.copy_object(Bucket=BUCKET, Key=prefix + obj["Key"][len(source) :], CopySource={"Bucket": BUCKET, "Key": obj["Key"]})
        return f"s3://{BUCKET}/{prefix}"


def _aws_files(root: Path) -> dict[str, str]:
    """The AWS configuration files pointed at nothing: only the test's variables count."""
    return {"AWS_CONFIG_FILE": str(root / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-credentials")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: bytes) -> bytes:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return bytes(response.read())


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server on a free localhost port, checking credentials (see the module's docstring), with one bucket."""
    root = tmp_path_factory.mktemp("s3")
    log = root / "moto.log"
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"moto's server exited ({proc.returncode}) before it answered:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"moto's server at {endpoint} did not answer within 60 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
        # IAM users while the server accepts anything, then every request must be signed by one of them
        setup = boto3.session.Session(aws_access_key_id="setup", aws_secret_access_key="setup", region_name="us-east-1")
        iam = setup.client("iam", endpoint_url=endpoint)
        keys = {}
        for user, statements in POLICIES.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(
                UserName=user, PolicyName="p", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements})
            )
            made = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (made["AccessKeyId"], made["SecretAccessKey"])
        setup.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        _post(f"{endpoint}/moto-api/reset-auth", b"0")
        server = S3Server(endpoint, keys, root, log)
        server.client().head_bucket(Bucket=BUCKET)  # the check is on: the admin's key works, a made-up one is refused
        try:
            setup.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=BUCKET)
        except Exception as e:  # noqa: BLE001 - botocore's ClientError is what a refusal raises
            assert "InvalidAccessKeyId" in str(e), e
        else:
            pytest.fail(f"moto's server does not check credentials after reset-auth 0:\n{log.read_text()[-3000:]}")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def aws(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], dict[str, str]]:
    """``aws(who)``: this process's AWS variables set to user ``who``'s (restored after the test), the user's own AWS
    setup masked, boto3's default session dropped (it keeps the credentials it first read)."""
    monkeypatch.setattr("sys.argv", ["cloc-lightning"])

    def use(who: str = "admin") -> dict[str, str]:
        for key in AWS_MASKED:
            monkeypatch.delenv(key, raising=False)
        for key, value in {**s3.env(who), **_aws_files(tmp_path)}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
        return s3.env(who)

    return use


def _prefix(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


# =============================================================================================
# a small chunk set (written here, uploaded) and the checks of a one-line error
# =============================================================================================
@pytest.fixture(scope="module")
def local_chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo config's data (OrdinalShapesDataModule, 6 classes, 32 px) small, as ``data optimize --workers 1`` writes
    it (LitData's writer in this process, a second or two): JPEG chunks of 16 KB, several per split."""
    from cloc_lightning.data import OrdinalShapesDataModule
    from cloc_lightning.data.optimize import optimize_data

    out = tmp_path_factory.mktemp("stream") / "shapes"
    data = OrdinalShapesDataModule(num_classes=6, image_size=32, batch_size=16, augment="flip", train_size=64, val_size=32, test_size=32)
    optimize_data(data, str(out), workers=1, chunk_bytes="16KB")
    assert len(list((out / "train").glob("chunk-*.bin"))) >= 3
    return out


@pytest.fixture(scope="module")
def s3_chunks(s3: S3Server, local_chunks: Path) -> str:
    """:func:`local_chunks` uploaded to the bucket: its ``s3://`` URL."""
    return s3.upload(local_chunks, "shapes")


def _one_line(result: Result, *said: str, secret: str | None = None) -> str:
    """The run failed with exit code 1 and one ``cloc-lightning: error:`` line (and the ``--debug`` hint) that says
    every string of ``said``; nothing trained.  Returns the line."""
    assert result.code == 1, (result.code, result.stderr[-3000:], result.stdout[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = error_lines(result.stderr)
    assert lines and lines[0].startswith("cloc-lightning: error: "), result.stderr[-3000:]
    assert lines[1:] in ([], ["(--debug shows the traceback)"]), lines
    print(lines[0])  # what the user sees (pytest -s shows it)
    for words in said:
        assert words in lines[0], (words, lines[0])
    assert "Epoch" not in result.stdout + result.stderr and "train/loss" not in result.stdout
    if secret is not None:
        assert secret not in result.stdout + result.stderr
    return lines[0]


def _fit(url: str, cwd: Path, *more: str) -> Result:
    """``cloc-lightning fit --config configs/cloc/demo.yaml --data.stream_from URL`` in this process, in ``cwd``."""
    return run_main(["fit", "--config", DEMO, *DEMO_SIZES, "--data.stream_from", url, *QUICK_FIT, *more], cwd)


def _no_checkpoints(cwd: Path) -> None:
    assert not list(cwd.rglob("*.ckpt")), "a checkpoint was written by a run that should have stopped at setup"


# =============================================================================================
# fast: the one-line errors
# =============================================================================================
def test_a_missing_bucket_is_one_line_for_fit_and_for_data_optimize(aws: Callable[[str], dict[str, str]], tmp_path: Path) -> None:
    secret = aws("admin")["AWS_SECRET_ACCESS_KEY"]
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:6]}"
    fix = f"create it (e.g. `aws s3 mb s3://{bucket}`) or correct the bucket in the URL"
    line = _one_line(
        _fit(f"s3://{bucket}/shapes", tmp_path), f"s3://{bucket}/shapes/cloc_stream.json", "does not exist", fix, secret=secret
    )
    assert "AWS_ENDPOINT_URL" in line
    _no_checkpoints(tmp_path)
    made = run_main(["data", "optimize", "--config", DEMO, *DEMO_SIZES, "--out", f"s3://{bucket}/shapes", "--workers", "1"], tmp_path)
    _one_line(made, f"s3://{bucket}/shapes", f"the bucket {bucket!r} does not exist", fix, secret=secret)


@pytest.mark.parametrize(
    ("who", "said"),
    [
        ("noread", ["access denied (AccessDenied)", "s3:GetObject"]),
        ("unknown key", ["(InvalidAccessKeyId)", "AWS_ACCESS_KEY_ID is not known"]),
        ("wrong secret", ["(SignatureDoesNotMatch)", "AWS_SECRET_ACCESS_KEY does not match AWS_ACCESS_KEY_ID"]),
    ],
)
def test_a_denied_read_is_one_line_naming_the_url_and_the_credentials(
    who: str, said: list[str], aws: Callable[[str], dict[str, str]], s3_chunks: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first read (``cloc_stream.json``) is refused: the line names the object, why, and that the credentials in the
    environment are the fix -- never the secret."""
    env = aws("noread" if who == "noread" else "admin")
    secret = env["AWS_SECRET_ACCESS_KEY"]
    if who == "unknown key":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNUNKNOWN00")
    elif who == "wrong secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret[::-1])
    line = _one_line(_fit(s3_chunks, tmp_path), f"{s3_chunks}/cloc_stream.json: cannot read the chunk set", *said, secret=secret)
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in line and "cloc-lightning data optimize" not in line  # not the rebuild advice
    assert secret[::-1] not in line
    _no_checkpoints(tmp_path)


def test_data_optimize_into_an_out_it_may_not_read_is_one_line(
    aws: Callable[[str], dict[str, str]], s3_chunks: str, tmp_path: Path
) -> None:
    """A rerun into an ``--out`` that holds chunks reads their records first: refused, one line, before anything is written."""
    aws("noread")
    made = run_main(["data", "optimize", "--config", DEMO, *DEMO_SIZES, "--out", s3_chunks, "--workers", "1"], tmp_path)
    _one_line(made, f"{s3_chunks}/cloc_stream.json", "access denied (AccessDenied)", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    assert "data optimize: train:" not in made.stdout  # nothing was written


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_damaged_chunk_in_the_bucket_stops_fit_at_setup(
    damage: str, s3: S3Server, aws: Callable[[str], dict[str, str]], s3_chunks: str, tmp_path: Path
) -> None:
    """One chunk object overwritten with half its bytes, or deleted: ``fit`` stops before any step, naming the split's
    URL, the chunk and the fix (nothing trains on part of the data)."""
    aws("admin")
    url = s3.copy("shapes", _prefix(damage))
    prefix = url.split(f"s3://{BUCKET}/", 1)[1]
    key = f"{prefix}/train/chunk-0-2.bin"
    client = s3.client()
    if damage == "truncated":
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        client.put_object(Bucket=BUCKET, Key=key, Body=body[: len(body) // 2])
        said = ["1 of", "truncated", f"chunk-0-2.bin: {len(body) // 2} of {len(body)} bytes"]
    else:
        client.delete_object(Bucket=BUCKET, Key=key)
        said = ["chunk files are missing (chunk-0-2.bin)"]
    _one_line(
        _fit(url, tmp_path), f"data.stream_from {url}/train: ", *said, f"cloc-lightning data optimize --config <this config> --out {url}"
    )
    _no_checkpoints(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_damaged_chunk_in_a_local_folder_stops_fit_at_setup(
    damage: str, local_chunks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["cloc-lightning"])
    folder = tmp_path / "chunks"
    shutil.copytree(local_chunks, folder)
    chunk = folder / "val" / "chunk-0-1.bin"
    size = chunk.stat().st_size
    if damage == "truncated":
        with open(chunk, "r+b") as f:
            f.truncate(size - 100)
        said = ["truncated", f"chunk-0-1.bin: {size - 100} of {size} bytes"]
    else:
        chunk.unlink()
        said = ["chunk files are missing (chunk-0-1.bin)"]
    _one_line(_fit(str(folder), tmp_path), f"data.stream_from {folder}/val: ", *said, f"--out {folder}")
    _no_checkpoints(tmp_path)


def test_a_bad_stream_cache_limit_is_one_line(aws: Callable[[str], dict[str, str]], s3_chunks: str, tmp_path: Path) -> None:
    aws("admin")
    line = _one_line(_fit(s3_chunks, tmp_path, "--data.stream_cache_limit", "lots"), "stream_cache_limit='lots' is not a size")
    assert "e.g. 50GB" in line
    _no_checkpoints(tmp_path)


@pytest.mark.slow
def test_two_loader_workers_open_a_split_while_its_index_downloads(
    aws: Callable[[str], dict[str, str]], s3_chunks: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of 2 loader workers reads a sample of the train split first thing; LitData's first request is slowed to 2 s
    (a busy machine or a distant bucket): both samples arrive."""
    import torch
    from litdata.streaming import client

    from cloc_lightning.data import OrdinalShapesDataModule
    from cloc_lightning.data.streaming import ChunkSplit

    aws("admin")
    data = OrdinalShapesDataModule(
        num_classes=6,
        image_size=32,
        train_size=64,
        val_size=32,
        test_size=32,
        stream_from=s3_chunks,
        stream_cache_dir=str(tmp_path / "cache"),
    )
    train = data._ensure_base()["train"]
    assert isinstance(train, ChunkSplit)
    plain = client.S3Client.client

    def slow(self: Any) -> Any:
        time.sleep(2)
        return plain.fget(self)

    monkeypatch.setattr(client.S3Client, "client", property(slow))
    loader = torch.utils.data.DataLoader(train, batch_size=1, sampler=[0, 1], num_workers=2, multiprocessing_context="fork")
    assert [int(t) for _, t in loader] == train.targets[:2]


# =============================================================================================
# slow: the real CLI in subprocesses
# =============================================================================================
#: the installed ``cloc-lightning`` command of this environment (``python -m cloc_lightning`` where there is none)
COMMAND = [str(Path(sys.executable).with_name("cloc-lightning"))] if Path(sys.executable).with_name("cloc-lightning").is_file() else None
PYTHON_M = [sys.executable, "-m", "cloc_lightning"]


def _cli(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600, command: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``cloc-lightning <args>`` as a subprocess (the console script: ``python -m cloc_lightning`` cannot upload to an
    ``http://`` endpoint, see :func:`test_python_m_cloc_lightning_uploads_to_an_http_endpoint`)."""
    return subprocess.run([*(command or COMMAND or PYTHON_M), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess[str], what: str) -> None:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def _folder_bytes(folder: Path) -> tuple[int, int, set[str]]:
    """Bytes of the files under ``folder`` now, bytes of its ``chunk-*.bin`` files, their names (files vanishing while
    it is listed are skipped)."""
    total, chunks, names = 0, 0, set()
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                size = os.path.getsize(os.path.join(root, name))
            except OSError:
                continue
            total += size
            if name.startswith("chunk-") and ".bin" in name:  # a chunk, or LitData's download of one (chunk-*.bin.tmp.<pid>)
                chunks += size
                names.add(name)
    return total, chunks, names


@dataclass
class StreamedFit:
    """A ``data optimize --out s3://`` then ``fit --data.stream_from`` of the demo config, as subprocesses."""

    url: str
    cwd: Path
    cache: Path
    secret: str
    optimize: subprocess.CompletedProcess[str]
    fit: subprocess.CompletedProcess[str]
    peak_cache: int
    peak_chunks: int
    chunk_files: set[str]
    seconds: float


#: the streamed fit's cache: at most 40 KB of 16 KB chunks; one loader worker per split (two race for the index:
#: test_two_loader_workers_open_a_split_while_its_index_downloads)
CACHE_LIMIT, CHUNK, LOADERS = 40_000, 16_000, 1


@pytest.fixture(scope="module")
def streamed_fit(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> StreamedFit:
    """The shipped ``configs/cloc/demo.yaml``, small: written to the bucket by ``data optimize`` (LitData's spawned
    writer and uploader), then 2 epochs of 4 steps from it with a loader worker and a 40 KB chunk cache, its size
    sampled every 20 ms while the fit runs."""
    cwd = tmp_path_factory.mktemp("streamed")
    env = s3.subprocess_env("admin")
    url = f"s3://{BUCKET}/{_prefix('demo')}"
    start = time.monotonic()
    made = _cli(
        ["data", "optimize", "--config", DEMO, *DEMO_SIZES, "--out", url, "--workers", "1", "--chunk_bytes", f"{CHUNK // 1000}KB"], cwd, env
    )
    _ok(made, "data optimize --out s3://")
    cache = cwd / "chunk-cache"
    args = [
        "fit",
        "--config",
        DEMO,
        *DEMO_SIZES,
        "--data.stream_from",
        url,
        "--data.stream_cache_dir",
        str(cache),
        "--data.stream_cache_limit",
        f"{CACHE_LIMIT // 1000}KB",
        "--data.batch_size",
        "16",
        "--data.num_workers",
        str(LOADERS),
        "--trainer.max_epochs",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.limit_test_batches",
        "1",
        *QUICK_FIT,
    ]
    out, err = cwd / "fit.out", cwd / "fit.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([*(COMMAND or PYTHON_M), *args], cwd=cwd, env=env, stdout=o, stderr=e, text=True)
        peak, peak_chunks, seen = 0, 0, set()
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            size, chunks, names = _folder_bytes(cache)
            peak, peak_chunks, seen = max(peak, size), max(peak_chunks, chunks), seen | names
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    fit = subprocess.CompletedProcess(args, proc.returncode, out.read_text(), err.read_text())
    return StreamedFit(
        url, cwd, cache, s3.env("admin")["AWS_SECRET_ACCESS_KEY"], made, fit, peak, peak_chunks, seen, time.monotonic() - start
    )


@pytest.mark.slow
def test_a_shipped_config_trains_from_the_bucket_through_the_cli(streamed_fit: StreamedFit, s3: S3Server) -> None:
    """``data optimize --out s3://`` wrote every split (checked object by object), ``fit`` trained from them and wrote
    its checkpoints, and its run record names the stream."""
    _ok(streamed_fit.optimize, "data optimize --out s3://")
    _ok(streamed_fit.fit, "fit --data.stream_from s3://")
    prefix = streamed_fit.url.split(f"s3://{BUCKET}/", 1)[1]
    names = {o["Key"][len(prefix) + 1 :] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]}
    for split in ("train", "val", "test"):
        assert {f"{split}/index.json", f"{split}/cloc_split.json", f"{split}/chunk-0-0.bin"} <= names
    run = streamed_fit.cwd / "runs" / "cloc_demo" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file() and list((run / "checkpoints").glob("best-*.ckpt"))
    stores = json.loads((run / "data.json").read_text())["stores"]
    assert [(s["kind"], s["folder"]) for s in stores] == [("stream", f"{streamed_fit.url}/{s}") for s in ("train", "val", "test")]
    assert f"data.stream_from {streamed_fit.url}: train 64, val 32, test 32 images" in streamed_fit.fit.stderr + streamed_fit.fit.stdout
    import torch

    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 2 * (64 // 16)


@pytest.mark.slow
def test_the_secret_key_is_in_no_output_and_no_file_of_the_run(streamed_fit: StreamedFit) -> None:
    secret = streamed_fit.secret.encode()
    assert len(secret) >= 16
    for proc in (streamed_fit.optimize, streamed_fit.fit):
        assert streamed_fit.secret not in proc.stdout + proc.stderr
    looked = []
    # the run folder (config.yaml, data.json, hparams.yaml, events, checkpoints), the chunk cache, the captured output
    for path in streamed_fit.cwd.rglob("*"):
        if path.is_file():
            looked.append(path.name)
            assert secret not in path.read_bytes(), f"the secret key is in {path}"
    assert {"config.yaml", "data.json", "hparams.yaml", "last.ckpt", "fit.err"} <= set(looked), looked


@pytest.mark.slow
def test_the_chunk_cache_stays_within_stream_cache_limit(
    s3: S3Server, aws: Callable[[str], dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A training epoch (2 loader workers) from a 36 MB bucket with a 24 MB limit: whole chunks land in the cache, and at no
    time (sampled every 20 ms) does the training split's cache hold more than its share of the limit plus LitData's
    accepted 5 % and one chunk in flight per worker.  (Below 10 MB per split LitData only deletes a chunk once read.)"""
    import threading

    from cloc_lightning.data import OrdinalShapesDataModule
    from cloc_lightning.data.optimize import optimize_data

    aws("admin")
    big = dict(num_classes=6, image_size=32, batch_size=64, augment="flip", train_size=12_000, val_size=64, test_size=64, num_workers=2)
    local = tmp_path_factory.mktemp("big") / "shapes"
    optimize_data(OrdinalShapesDataModule(**big), str(local), image_format="raw", workers=1, chunk_bytes="2MB")
    url = s3.upload(local, _prefix("big"))
    cache = tmp_path_factory.mktemp("big-cache")
    data = OrdinalShapesDataModule(**big, stream_from=url, stream_cache_dir=str(cache), stream_cache_limit="24MB")
    data.setup("fit")
    train = data._ensure_base()["train"]
    share = train.cache_limit  # type: ignore[attr-defined]
    chunk = max(int(c["chunk_bytes"]) for c in train.meta["chunks"])  # type: ignore[attr-defined]
    assert 10 * 2**20 <= share < 24_000_000 and share >= 2 * chunk
    peak, seen, done = 0, set(), threading.Event()

    def watch() -> None:
        nonlocal peak, seen
        while not done.is_set():
            _, chunks, names = _folder_bytes(cache)
            peak, seen = max(peak, chunks), seen | names
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        n = sum(len(labels) for _, labels in data.train_dataloader())
    finally:
        done.set()
        watcher.join()
    assert n == (12_000 // 64) * 64
    assert len({name.split(".bin")[0] for name in seen}) >= 10, sorted(seen)  # chunks were downloaded whole into the cache
    assert peak <= share * 1.05 + 2 * chunk, (peak, share, chunk)


@pytest.mark.slow
def test_the_chunks_are_downloaded_whole_into_the_cache(streamed_fit: StreamedFit) -> None:
    _ok(streamed_fit.fit, "fit --data.stream_from s3://")
    assert streamed_fit.chunk_files, "no chunk file was ever in stream_cache_dir during the fit"


@pytest.mark.slow
def test_a_chunk_read_denied_in_a_loader_worker_is_one_line(s3: S3Server, s3_chunks: str, tmp_path: Path) -> None:
    """The records may be read, the chunks not (user ``nochunks``): the fit stops at its first batch with one line."""
    fit = _cli(
        [
            "fit",
            "--config",
            DEMO,
            *DEMO_SIZES,
            "--data.stream_from",
            s3_chunks,
            "--data.num_workers",
            "2",
            "--trainer.max_steps",
            "2",
            *QUICK_FIT,
        ],
        tmp_path,
        s3.subprocess_env("nochunks"),
    )
    line = _one_line(Result(fit.returncode, fit.stderr, fit.stdout), f"{s3_chunks}/", "chunk", "AccessDenied", "AWS_ACCESS_KEY_ID")
    assert "cloc-lightning data optimize" not in line  # not the rebuild advice


@pytest.mark.slow
def test_data_optimize_denied_writes_is_one_line(s3: S3Server, tmp_path: Path) -> None:
    """A denied upload is one line and keeps the written split in its stage folder; the rerun that may write uploads it and
    removes the stage."""
    args = ["data", "optimize", "--config", DEMO, *DEMO_SIZES, "--out", f"s3://{BUCKET}/{_prefix('nowrite')}", "--workers", "1"]
    cache = {"CLOC_CACHE_DIR": str(tmp_path / "cache")}
    made = _cli(args, tmp_path, {**s3.subprocess_env("nowrite"), **cache})
    _one_line(Result(made.returncode, made.stderr, made.stdout), f"s3://{BUCKET}/", "AccessDenied", "AWS_ACCESS_KEY_ID")
    staged = list((tmp_path / "cache" / "optimize").glob("*/chunk-*.bin"))
    assert staged, "the split written before the denied upload is not in its stage folder"
    _ok(_cli(args, tmp_path, {**s3.subprocess_env("admin"), **cache}), "data optimize after a denied upload")
    assert not list((tmp_path / "cache" / "optimize").iterdir()), "the stage folder is left after the upload"


@pytest.mark.slow
def test_python_m_cloc_lightning_uploads_to_an_http_endpoint(s3: S3Server, tmp_path: Path) -> None:
    made = _cli(
        ["data", "optimize", "--config", DEMO, *DEMO_SIZES, "--out", f"s3://{BUCKET}/{_prefix('python-m')}", "--workers", "1"],
        tmp_path,
        s3.subprocess_env("admin"),
        command=PYTHON_M,
    )
    _ok(made, "python -m cloc_lightning data optimize --out s3:// (http:// endpoint)")


@pytest.mark.slow
@pytest.mark.realdata
@needs(CIFAR10)
def test_simclr_cifar10_cpu_trains_from_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    """``configs/simclr/cifar10_cpu.yaml`` on the shared CIFAR-10 copy: ``data optimize --out s3://`` (2 workers, about
    2 minutes on 2 cores), then 4 steps from the bucket."""
    env = s3.subprocess_env("admin")
    config = str(REPO / "configs" / "simclr" / "cifar10_cpu.yaml")
    url = f"s3://{BUCKET}/{_prefix('cifar')}"
    _ok(
        _cli(["data", "optimize", "--config", config, "--data.root", str(CIFAR10), "--out", url, "--workers", "2"], tmp_path, env, 900),
        "optimize",
    )
    fit = _cli(
        [
            "fit",
            "--config",
            config,
            "--data.root",  # the config's own data (the files are not read: the chunks' record must name them)
            str(CIFAR10),
            "--data.stream_from",
            url,
            "--data.stream_cache_dir",
            str(tmp_path / "cache"),
            "--trainer.max_steps",
            "4",
            "--trainer.limit_val_batches",
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger.init_args.save_dir",
            "runs",
        ],
        tmp_path,
        env,
    )
    _ok(fit, "fit --data.stream_from s3:// (cifar10_cpu)")
    assert (tmp_path / "runs" / "simclr_cifar10_cpu" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert env["AWS_SECRET_ACCESS_KEY"] not in fit.stdout + fit.stderr
