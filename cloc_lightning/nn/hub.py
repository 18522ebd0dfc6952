"""Fail fast, with a message that names the fix, when pretrained weights cannot be had.

timm and open_clip fetch weights from the Hugging Face hub.  Without a network,
``huggingface_hub`` retries for about a minute before giving up; on a cluster
node without internet (or in CI) that is a minute lost per model and an error
that does not say what to do.  :func:`load_pretrained` first tries the local
cache only, then checks in a few seconds whether the hub can be reached at all,
and only then lets the library download.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Callable, Iterator, TypeVar
from urllib.parse import urlparse

T = TypeVar("T")

__all__ = ["hub_cache_only", "hub_offline", "hub_reachable", "load_pretrained", "PretrainedUnavailableError"]


class PretrainedUnavailableError(RuntimeError):
    """Pretrained weights are neither cached nor downloadable right now."""


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


@contextlib.contextmanager
def hub_cache_only() -> Iterator[None]:
    """Within the block, ``huggingface_hub`` reads its cache and never the network."""
    from huggingface_hub import constants

    old = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = old


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub endpoint opens within ``timeout`` seconds."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def load_pretrained(load: Callable[[], T], what: str, fix: str) -> T:
    """Run ``load`` (which may download from the hub) without minute-long offline retries.

    1. try ``load`` with the hub restricted to its local cache;
    2. if that fails and the hub is offline (``HF_HUB_OFFLINE=1``) or unreachable,
       raise :class:`PretrainedUnavailableError` naming ``what`` and ``fix``;
    3. otherwise call ``load`` again with network access.
    """
    try:
        with hub_cache_only():
            return load()
    except (OSError, RuntimeError, ValueError) as cached_error:
        if hub_offline():
            reason = "HF_HUB_OFFLINE is set and they are not in the local cache"
        elif not hub_reachable():
            reason = "they are not in the local cache and the Hugging Face hub cannot be reached (no internet?)"
        else:
            return load()
        raise PretrainedUnavailableError(f"Pretrained weights for {what} are unavailable: {reason}. {fix}") from cached_error
