"""``data.stream_from``: train from LitData chunks on a local disk or in object storage.

A *chunk set* is what ``cloc-lightning data optimize`` writes (:mod:`cloc_lightning.data.optimize`):
one LitData chunk folder per split (``<url>/train``, ``<url>/val``, ``<url>/test``), each with a
``cloc_split.json`` (the labels, file names and stored layout, in chunk order), and a
``cloc_stream.json`` at the top saying what it was built from.  The images are the stored images of
``data.cache`` (the same layout and size rule of :mod:`cloc_lightning.data.cache`), encoded once
(``raw`` pixels, ``png``, ``jpeg`` or ``webp``).

Reading is LitData's (`Lightning-AI/litData <https://github.com/Lightning-AI/litData>`_):
:class:`ChunkSplit` opens a ``litdata.StreamingDataset`` per process (lazily, so loader workers open
their own) and reads sample ``i`` by index; LitData downloads the chunk it lies in to a local cache
folder, keeps at most ``stream_cache_limit`` bytes there and evicts used chunks.  A chunk split is
a stored base set like :class:`~cloc_lightning.data.cache.StoredImages` (``stored(i)``, ``load(i)``,
``targets``), so the transforms, the views, ``augment_on: device``, the subsampling and the exact
evaluation under DDP are the data module's own, unchanged.

The *order* is ours, not LitData's: :class:`ChunkShuffleSampler` draws epoch ``e``'s order from
``(seed, e)`` alone -- the chunks in a random order, the samples shuffled within windows of
``window`` chunks -- so a worker reads a chunk from start to end before it moves on, and a resumed
run skips the batches already seen (:class:`~cloc_lightning.resume.ResumableDataLoader`).  Under DDP
every process takes one contiguous part of that order (:class:`DistributedChunkShuffleSampler`), so
each reads its own chunks.  The order is a function of ``(seed, epoch, number of processes)``, the
views of ``(seed, epoch, sample index)``: neither depends on LitData's loader state, which has open
resume reports (Lightning-AI/litData#248 across nodes, #760 after a second epoch broken off early).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch

from cloc_lightning._s3_http import allow_http_endpoint
from cloc_lightning.data.cache import StoreLayout, slot_of
from cloc_lightning.data.datasets import LabelledDataset
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.resume import DistributedEpochShuffleSampler, EpochShuffleSampler, epoch_seed

__all__ = [
    "STREAM_FILE",
    "SPLIT_FILE",
    "StreamError",
    "DamagedRecord",
    "ChunkSplit",
    "ChunkShuffleSampler",
    "DistributedChunkShuffleSampler",
    "chunk_order",
    "read_json",
    "is_remote",
    "join_url",
    "parse_size",
    "require_litdata",
    "decode_item",
    "missing_chunks",
    "changed_chunks",
    "s3_etags",
    "file_md5",
]

#: the chunk set's record of what it was built from (at the top of ``--out``)
STREAM_FILE = "cloc_stream.json"
#: each split's labels, file names and layout, in chunk order (in ``<out>/<split>/``)
SPLIT_FILE = "cloc_split.json"
#: what a chunk set's records mean; bumped when they change
STREAM_FORMAT = 1
#: the cache limit LitData is given (none: :meth:`ChunkSplit._evict` keeps ``stream_cache_limit``)
_NO_LIMIT = 2**62


class StreamError(DataConfigError):
    """A chunk set that cannot be read (missing, denied, truncated, built from other data): the message names the URL and the fix."""


class DamagedRecord(StreamError):
    """A record of a chunk set (``cloc_stream.json``, ``cloc_split.json``) that is not a JSON object: the set is damaged."""


def require_litdata(what: str) -> Any:
    """``litdata``, or a one-line :class:`StreamError` saying how to install it."""
    try:
        import litdata
    except ImportError as e:
        raise StreamError(f'{what} needs LitData, which is not installed: pip install "cloc-lightning[streaming]" ({e})') from None
    allow_http_endpoint()
    return litdata


def is_remote(url: str) -> bool:
    """Whether ``url`` names object storage (``s3://``, ``gs://``, ...) rather than a local folder."""
    scheme = urlparse(str(url)).scheme
    return len(scheme) > 1  # 'C:' of a Windows path is not a scheme


def join_url(url: str, *parts: str) -> str:
    """``url/part/...`` for a local folder or an object-storage URL."""
    if is_remote(url):
        return "/".join([str(url).rstrip("/"), *parts])
    return os.path.join(os.path.expanduser(str(url)), *parts)


def parse_size(name: str, value: Any) -> int:
    """Bytes of ``'50GB'``, ``'512MB'``, ``'2.5 GiB'`` or a plain number, else a one-line error naming ``name``."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    text = str(value).strip().upper().replace(" ", "")
    number = text.rstrip("KMGTIB")
    unit = text[len(number) :]
    try:
        n = float(number)
    except ValueError:
        n = -1.0
    if unit not in units or not n > 0 or not np.isfinite(n):
        raise StreamError(f"{name}={value!r} is not a size; give bytes as a number or with a unit, e.g. 50GB or 512MB")
    return int(n * units[unit])


def _s3_problem(url: str, error: BaseException) -> str | None:
    """A botocore error of reading ``url`` in words, with the fix; ``None`` when it is not one.

    Credentials are named by their variables, never shown, and the endpoint without a ``user:password@`` part.
    """
    bucket = urlparse(url).netloc
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    parsed = urlparse(endpoint)
    if parsed.hostname and (parsed.username or parsed.password):  # never print a password given in the URL
        endpoint = parsed._replace(netloc=parsed.hostname + (f":{parsed.port}" if parsed.port else "")).geturl()
    where = endpoint or "AWS S3 (AWS_ENDPOINT_URL is not set)"
    credentials = (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN for temporary credentials), or AWS_PROFILE, "
        "in the environment"
    )
    kind = type(error).__name__
    if kind in ("NoCredentialsError", "PartialCredentialsError"):
        return f"no S3 credentials found ({kind}); {credentials}"
    if kind in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError", "ProxyConnectionError"):
        return (
            f"cannot connect to {where} ({kind}); check that the server is running and that AWS_ENDPOINT_URL names it (unset it for AWS S3)"
        )
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        # wrapped where the code is only in the text: boto3's S3UploadFailedError, LitData's prefetch thread (obstore)
        text = str(error)
        for marker, code in (
            ("AccessDenied", "AccessDenied"),
            ("PermissionDenied", "AccessDenied"),
            ("403 Forbidden", "403"),
            ("NoSuchBucket", "NoSuchBucket"),
            ("InvalidAccessKeyId", "InvalidAccessKeyId"),
            ("SignatureDoesNotMatch", "SignatureDoesNotMatch"),
            ("ExpiredToken", "ExpiredToken"),
        ):
            if marker in text:
                response = {"Error": {"Code": code}}
                break
        else:
            return None
    code = str(response.get("Error", {}).get("Code", ""))
    if code in ("NoSuchBucket",):
        return (
            f"the bucket {bucket!r} does not exist at {where}; create it (e.g. `aws s3 mb s3://{bucket}`) or correct the bucket "
            "in the URL (for an S3-compatible server, AWS_ENDPOINT_URL must name the one that holds it)"
        )
    if code in ("InvalidAccessKeyId",):
        return f"the access key in AWS_ACCESS_KEY_ID is not known at {where} ({code}); {credentials} with a key of that server"
    if code in ("SignatureDoesNotMatch",):
        return f"AWS_SECRET_ACCESS_KEY does not match AWS_ACCESS_KEY_ID ({code}); {credentials} with the secret of that key"
    if code in ("ExpiredToken", "TokenRefreshRequired", "InvalidToken", "ExpiredTokenException"):
        return f"the S3 credentials have expired ({code}); renew them: {credentials}"
    if code in ("AccessDenied", "403", "AllAccessDisabled", "Forbidden"):
        return (
            f"access denied ({code}): the credentials in the environment may not use s3://{bucket}; give credentials allowed "
            f"to (s3:GetObject and s3:ListBucket; data optimize also s3:PutObject): {credentials}"
        )
    if code in ("NoSuchKey", "404", "NotFound"):
        return "no such object"
    message = str(response.get("Error", {}).get("Message", "")).strip()
    return f"{code}: {message}".strip(": ") or None


def _bucket_problem(url: str) -> str:
    """After a 404 on ``url``: the missing bucket in words (an ``s3://`` URL whose bucket is not there), else ``'no such object'``."""
    if urlparse(url).scheme != "s3":
        return "no such object"
    import boto3

    try:
        boto3.client("s3").head_bucket(Bucket=urlparse(url).netloc)
    except Exception as e:  # noqa: BLE001 - the HEAD's error decides the message
        code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return _s3_problem(url, _Coded("NoSuchBucket")) or "no such object"
        return _s3_problem(url, e) or "no such object"
    return "no such object"


class _Coded(Exception):
    """An error with a botocore-style ``response`` (for :func:`_s3_problem`)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}}


def read_json(url: str, what: str, fix: str) -> dict[str, Any]:
    """The JSON object at ``url`` (a local file or an ``s3://``/other LitData URL), else a one-line :class:`StreamError`."""
    if not is_remote(url):
        path = Path(url)
        if not path.is_file():
            raise StreamError(f"{url}: no {what} there; {fix}")
        try:
            text = path.read_text()
        except OSError as e:
            raise StreamError(f"{url}: cannot read the {what} ({e.strerror or type(e).__name__}); check the file's permissions") from None
    else:
        require_litdata("data.stream_from")
        from litdata.streaming.fs_provider import _get_fs_provider

        with tempfile.TemporaryDirectory() as tmp:
            local = os.path.join(tmp, os.path.basename(urlparse(url).path) or "file.json")
            try:
                _get_fs_provider(url).download_file(url, local)
            except Exception as e:  # noqa: BLE001 - botocore/gcs/azure errors: classified where they can be, else the client's words
                problem = _s3_problem(url, e)
                if problem == "no such object":
                    problem = _bucket_problem(url)
                elif str(getattr(e, "response", {}).get("Error", {}).get("Code", "")) == "403" and urlparse(url).scheme == "s3":
                    # a HEAD's 403 has no body: one GET says why (denied, unknown key, wrong secret, expired)
                    import boto3

                    parsed = urlparse(url)
                    try:
                        boto3.client("s3").get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"), Range="bytes=0-0")
                    except Exception as precise:  # noqa: BLE001 - its code is the answer
                        problem = _s3_problem(url, precise) or problem
                if problem == "no such object":
                    raise StreamError(f"{url}: no {what} there; {fix}") from None
                detail = problem or f"{type(e).__name__}: {_first_line(e)}"
                raise StreamError(f"{url}: cannot read the {what}: {detail}") from None
            text = Path(local).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DamagedRecord(f"{url}: the {what} is not valid JSON ({e}); the chunk set is damaged: {fix}") from None
    if not isinstance(data, dict):
        raise DamagedRecord(f"{url}: the {what} is not a JSON object; the chunk set is damaged: {fix}")
    return data


def _s3_objects(url: str) -> dict[str, dict[str, Any]]:
    """``{file name: LIST entry}`` of the objects directly under the ``s3://`` prefix ``url`` (paginated LIST requests)."""
    import boto3

    parsed = urlparse(url)
    prefix = parsed.path.strip("/")
    prefix = prefix + "/" if prefix else ""  # s3://bucket: the bucket's top level
    found: dict[str, dict[str, Any]] = {}
    for page in boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=parsed.netloc, Prefix=prefix):
        for obj in page.get("Contents", []):
            name = str(obj["Key"])[len(prefix) :]
            if "/" not in name:
                found[name] = obj
    return found


def s3_etags(url: str) -> dict[str, str]:
    """``{file name: ETag}`` of the objects directly under the ``s3://`` prefix ``url`` (what ``data optimize`` records)."""
    return {name: str(obj.get("ETag", "")) for name, obj in _s3_objects(url).items()}


def file_md5(path: str | Path) -> str:
    """The MD5 of a local file (a chunk's content fingerprint, recorded by ``data optimize``)."""
    import hashlib

    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def changed_chunks(url: str, chunks: list[dict[str, Any]]) -> list[str]:
    """The local chunk files whose content is not what ``data optimize`` wrote (same size, other bytes: their MD5).

    Reads every chunk once; object storage is checked by :func:`missing_chunks` (the ETags of its listing).
    """
    if is_remote(url):
        return []
    folder = os.path.expanduser(url)
    return [
        c["filename"]
        for c in chunks
        if c.get("md5")
        and os.path.isfile(os.path.join(folder, c["filename"]))
        and file_md5(os.path.join(folder, c["filename"])) != c["md5"]
    ]


def missing_chunks(url: str, chunks: list[dict[str, Any]]) -> str | None:
    """What is wrong with the chunk files of ``url`` against LitData's index (missing or of another size), or ``None``.

    ``chunks`` are ``index.json``'s entries (``filename``, ``chunk_bytes``).  A local folder is listed
    with ``os.scandir``, an ``s3://`` prefix with LIST requests; other schemes are checked for presence.

    Raises:
        StreamError: object storage that cannot be listed (access denied, no bucket, no connection):
            rewriting the chunks would not help, so the message names that fix instead.
    """
    if not chunks:
        return f"its {SPLIT_FILE} lists no chunk files (written by an older or interrupted run)"
    tags: dict[str, str] = {}
    try:
        if not is_remote(url):
            sizes = {e.name: e.stat().st_size for e in os.scandir(os.path.expanduser(url)) if e.is_file()}
        elif urlparse(url).scheme == "s3":
            listed = _s3_objects(url)
            sizes = {name: int(obj["Size"]) for name, obj in listed.items()}
            tags = {name: str(obj.get("ETag", "")) for name, obj in listed.items()}
        else:
            from litdata.streaming.fs_provider import _get_fs_provider

            provider = _get_fs_provider(url)
            sizes = {c["filename"]: int(c["chunk_bytes"]) for c in chunks if provider.exists(join_url(url, c["filename"]))}
    except FileNotFoundError:
        return f"its folder {url} is gone"
    except Exception as e:  # noqa: BLE001 - the listing's own error, in words, is the message
        problem = _s3_problem(url, e)
        if is_remote(url):
            raise StreamError(
                f"{url}: cannot list the chunk files: {problem or f'{type(e).__name__}: {_first_line(e)}; check the URL and the connection'}"
            ) from None
        return f"its chunks cannot be listed ({problem or f'{type(e).__name__}: {_first_line(e)}'})"
    gone = [c["filename"] for c in chunks if c["filename"] not in sizes]
    short = [c for c in chunks if c["filename"] in sizes and sizes[c["filename"]] != int(c["chunk_bytes"])]
    # an object replaced in the bucket since data optimize wrote it (its ETag), for free with the listing
    replaced = [c["filename"] for c in chunks if c.get("etag") and c["filename"] in tags and tags[c["filename"]] != c["etag"]]
    if not gone and not short and not replaced:
        return None
    parts = []
    if gone:
        parts.append(f"{len(gone)} of {len(chunks)} chunk files are missing ({', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''})")
    if short:
        named = ", ".join(f"{c['filename']}: {sizes[c['filename']]} of {int(c['chunk_bytes'])} bytes" for c in short[:3])
        parts.append(
            f"{len(short)} of {len(chunks)} chunk files have another size than LitData wrote, i.e. truncated or replaced "
            f"({named}{' ...' if len(short) > 3 else ''})"
        )
    if replaced:
        parts.append(f"{len(replaced)} chunk objects were replaced since data optimize wrote them ({', '.join(replaced[:3])})")
    return "; ".join(parts)


def decode_item(item: dict[str, Any]) -> torch.Tensor:
    """The ``uint8 [3, h, w]`` stored image of a chunk item (raw bytes, or PNG/JPEG/WebP decoded with Pillow)."""
    h, w = int(item["h"]), int(item["w"])
    data = item["image"]
    if item.get("codec", "raw") == "raw":
        raw: torch.Tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(3, h, w)
        return raw
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image.convert("RGB"))
    if pixels.shape != (h, w, 3):
        raise ValueError(f"decoded {pixels.shape[:2]}, the chunk set records ({h}, {w})")
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()


class ChunkSplit(LabelledDataset):
    """One split of a chunk set, read by index: a stored base set (``stored``, ``load``, ``targets``).

    Args:
        url: the split's chunk folder (``<stream_from>/<split>``).
        meta: its ``cloc_split.json``.
        cache_dir: where LitData keeps downloaded chunks (remote sets; ``None``: LitData's default).
        cache_limit: at most this many bytes of chunks in ``cache_dir``.
    """

    def __init__(self, url: str, meta: dict[str, Any], cache_dir: str | None = None, cache_limit: int | None = None) -> None:
        self.url = url
        self.meta = meta
        self.targets = [int(t) for t in meta["targets"]]
        self.labelled = bool(meta.get("labelled", True))
        #: the original files (as data optimize read them), else their names: predictions and subsets name them
        self.files = list(meta.get("paths") or meta.get("keys") or [str(i) for i in range(len(self.targets))])
        self.layout = StoreLayout(meta["layout"]["mode"], int(meta["layout"]["size"]))
        self.cache_dir = cache_dir
        self.cache_limit = cache_limit
        self.chunk_sizes = [int(n) for n in meta["chunk_sizes"]]
        self._bounds = np.cumsum(self.chunk_sizes)
        self._entered = -1
        self._ds: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ds"] = None  # every process (loader worker) opens its own reader
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        allow_http_endpoint()  # a spawned loader worker

    def _dataset(self) -> Any:
        if self._ds is None:
            litdata = require_litdata("data.stream_from")
            # one item unpacked per read: LitData's default (batch_decode 'auto') unpacks a block of up to 256 items around
            # every read, which a shuffled read uses one of (benchmarks/results/streaming.md: 2-18x the items/s)
            kwargs: dict[str, Any] = {"batch_decode": 0}
            if is_remote(self.url):
                if self.cache_dir is not None:
                    kwargs["cache_dir"] = self.cache_dir
                # LitData's own eviction assumes chunks read in sequence (read by index in a shuffle window it deletes chunks
                # still in use, or deadlocks on its slot budget): it is given no limit, and _evict keeps the cache's size
                kwargs["max_cache_size"] = _NO_LIMIT
            try:
                self._ds = litdata.StreamingDataset(self.url, **kwargs)
                # read by index, LitData fetches each sample's bytes with ranged GETs and caches nothing: whole chunks
                # instead, into the cache (bounded by cache_limit), as its own iteration does
                self._ds._on_demand_bytes = False
            except Exception as e:  # noqa: BLE001 - LitData's own messages are long; ours names the URL and the fix
                raise StreamError(
                    f"{self.url}: LitData cannot open the chunks ({type(e).__name__}: {_first_line(e)}); {_REBUILD}"
                ) from None
            # under torch.distributed, len() is this process's share; reads by index use the whole set's index
            held = sum(int(b) - int(a) for a, b in getattr(self._ds, "region_of_interest", []) or []) or len(self._ds)
            if held != len(self.targets):
                raise StreamError(
                    f"{self.url}: the chunks hold {held} samples, {SPLIT_FILE} lists {len(self.targets)}: the chunk set is "
                    f"incomplete or mixed with another; {_REBUILD}"
                )
        return self._ds

    def open(self) -> None:
        """Open the reader here, before loader workers start: a remote split's index is fetched into the cache once.

        (Two workers opening a remote split at once race for LitData's lock on ``index.json``, and the loser
        finds no index.)
        """
        self._dataset()
        chunks = self.meta.get("chunks") or []
        if chunks and urlparse(self.url).scheme == "s3":  # a chunk the credentials may list but not read: here, not in a worker
            import boto3

            key = urlparse(join_url(self.url, str(chunks[0]["filename"]))).path.lstrip("/")
            try:
                boto3.client("s3").get_object(Bucket=urlparse(self.url).netloc, Key=key, Range="bytes=0-0")["Body"].read()
            except Exception as e:  # noqa: BLE001 - in words
                raise StreamError(f"{self.url}: cannot read its chunks ({_s3_problem(self.url, e) or _first_line(e)})") from None

    def _drop_reader(self) -> None:
        reader = getattr(getattr(self._ds, "cache", None), "_reader", None)
        thread = getattr(reader, "_prepare_thread", None)
        if thread is not None and callable(getattr(thread, "stop", None)):
            thread.stop()
        self._ds = None

    def _evict(self, index: int) -> None:
        """On entering a new chunk: the least recently entered chunk files of this split's cache folder beyond ``cache_limit``.

        Runs in every loader worker (each its own reader, one folder): a chunk another worker still reads is downloaded
        again by it (:meth:`read`), so the limit should hold a few chunks per worker.
        """
        chunk = int(np.searchsorted(self._bounds, index, side="right"))
        if chunk == self._entered or self.cache_limit is None:
            return
        self._entered = chunk
        folder = Path(str(getattr(getattr(self._ds, "input_dir", None), "path", "") or ""))
        if not folder.is_dir():
            return
        current = folder / str(self.meta["chunks"][chunk]["filename"]) if chunk < len(self.meta.get("chunks") or []) else None
        files = []
        for path in folder.glob("chunk-*.bin"):
            try:
                if current is not None and path == current:
                    os.utime(path)  # the most recently entered
                files.append((path.stat().st_mtime, path.stat().st_size, path))
            except OSError:
                continue  # evicted by another worker meanwhile
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.cache_limit:
                break
            if path == current:
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size

    def describe(self, index: int) -> str:
        """The original file of sample ``index`` (what a prediction row names), else its name and place in the chunks."""
        if self.meta.get("paths"):
            return str(self.files[index])
        return self._where(index)

    def _where(self, index: int) -> str:
        return f"{self.url} sample {index} ({self.files[index]})"

    def store_identity(self) -> str | None:
        return str(self.meta.get("identity")) if self.meta.get("identity") else None

    def unreadable(self) -> list[int]:
        return []

    def read(self, index: int) -> dict[str, Any]:
        """The chunk item of sample ``index`` (checked: it names ``index``), else a one-line :class:`StreamError`."""
        try:
            try:
                item: dict[str, Any] = self._dataset()[int(index)]
            except FileNotFoundError:
                if not is_remote(self.url):
                    raise
                # a chunk evicted (_evict, in this or another loader worker) that this reader had downloaded: a fresh reader
                # downloads it again
                self._drop_reader()
                item = self._dataset()[int(index)]
        except StreamError:
            raise
        except Exception as e:  # noqa: BLE001 - a truncated or damaged chunk, a chunk deleted from the bucket, a lost connection
            problem = _s3_problem(self.url, e) if is_remote(self.url) else None
            fix = problem or f"{type(e).__name__}: {_first_line(e)}); {_REBUILD}"
            raise StreamError(f"{self._where(index)}: cannot read its chunk ({fix}" + (")" if problem else "")) from None
        if is_remote(self.url):
            self._evict(int(index))
        if int(item.get("index", -1)) != int(index):
            raise StreamError(
                f"{self._where(index)}: the chunk holds sample {item.get('index')} in its place; the chunks and {SPLIT_FILE} "
                f"come from different runs of data optimize; {_REBUILD}"
            )
        return item

    def load(self, index: int) -> torch.Tensor:
        item = self.read(index)
        try:
            return decode_item(item)
        except Exception as e:  # noqa: BLE001 - whatever the decoder raises, the message names the sample and the fix
            raise StreamError(
                f"{self._where(index)}: its image does not decode ({type(e).__name__}: {_first_line(e)}); {_REBUILD}"
            ) from None

    def stored(self, index: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """``(uint8 [3, S, S] slot, original [2], stored [2])`` of sample ``index``, as a ``data.cache`` store gives it."""
        item = self.read(index)
        x = decode_item(item)
        native = np.asarray([int(item["nh"]), int(item["nw"])], dtype=np.int32)
        return slot_of(x, self.layout), native, np.asarray(x.shape[1:], dtype=np.int32)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.load(index), self.targets[index]


_REBUILD = (
    "run `cloc-lightning data optimize` again for this --out (finished splits are kept), or point data.stream_from at a complete chunk set"
)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else "no message"


# ----------------------------------------------------------------------------
# the training order: chunk by chunk, from (seed, epoch) alone
# ----------------------------------------------------------------------------
def chunk_order(chunk_of: np.ndarray, seed: int, epoch: int, window: int) -> list[int]:
    """Epoch ``epoch``'s order of the positions ``0..n-1`` whose chunks are ``chunk_of[p]``.

    The chunks come in a random order; the positions of every ``window`` consecutive chunks (in that
    order) are shuffled together.  Everything is drawn from ``(seed, epoch)`` alone (:func:`epoch_seed`).
    """
    g = torch.Generator()
    g.manual_seed(epoch_seed(seed, epoch))
    chunks = np.unique(chunk_of)
    ranked = chunks[torch.randperm(len(chunks), generator=g).numpy()]
    rank_of = np.empty(int(chunks.max()) + 1 if len(chunks) else 0, dtype=np.int64)
    rank_of[ranked] = np.arange(len(ranked))
    group = rank_of[chunk_of] // max(1, int(window))
    by_group = np.argsort(group, kind="stable")
    order: list[int] = []
    bounds = np.flatnonzero(np.diff(group[by_group])) + 1
    for block in np.split(by_group, bounds):
        order.extend(block[torch.randperm(len(block), generator=g).numpy()].tolist())
    return order


def chunk_of_positions(dataset: Any) -> np.ndarray:
    """The chunk of every position of a training set over a :class:`ChunkSplit` (a subset: its ``indices``)."""
    base = getattr(dataset, "base", dataset)
    if not isinstance(base, ChunkSplit):
        raise TypeError(f"ChunkShuffleSampler needs a set over a ChunkSplit, got {type(base).__name__}")
    bounds = np.cumsum(base.chunk_sizes)
    indices = np.asarray(getattr(dataset, "indices", range(len(base))), dtype=np.int64)
    return np.searchsorted(bounds, indices, side="right")


class ChunkShuffleSampler(EpochShuffleSampler):
    """:class:`~cloc_lightning.resume.EpochShuffleSampler` in chunk order (:func:`chunk_order`): each chunk read once, start to end.

    ``window`` chunks are shuffled together (more: batches mix more chunks, and a worker holds more
    chunks at a time).  ``skip(n)``/``set_epoch`` resume as the base class does.
    """

    def __init__(self, data_source: Any, seed: int = 0, window: int = 4) -> None:
        super().__init__(data_source, seed)
        self.window = int(window)
        self._chunk_of = chunk_of_positions(data_source)

    def __iter__(self) -> Iterator[int]:
        order = chunk_order(self._chunk_of, self.seed, self.epoch, self.window)
        start, self._skip = self._skip, 0
        yield from order[start:]


class DistributedChunkShuffleSampler(DistributedEpochShuffleSampler):
    """One process's share of :func:`chunk_order`: a contiguous part (its own chunks), ``len(self)`` samples on every process.

    The order is cut to a multiple of ``num_replicas`` (``drop_last``) or padded with its own first
    positions, then process ``r`` takes part ``r`` of ``num_replicas`` equal parts.
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, seed: int = 0, drop_last: bool = False, window: int = 4) -> None:
        super().__init__(dataset, num_replicas, rank, seed=seed, drop_last=drop_last)
        self.window = int(window)
        self._chunk_of = chunk_of_positions(dataset)

    def __iter__(self) -> Iterator[int]:
        order = chunk_order(self._chunk_of, self.seed, self.epoch, self.window)
        if self.drop_last:
            order = order[: self.total_size]
        else:
            while len(order) < self.total_size:
                order += order[: self.total_size - len(order)]
        share = order[self.rank * self.num_samples : (self.rank + 1) * self.num_samples]
        start, self._skip = self._skip, 0
        yield from share[start:]
