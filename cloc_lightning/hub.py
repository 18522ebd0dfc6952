"""Fail fast, with a message that names the fix, when weights or data cannot be downloaded.

timm and open_clip fetch weights from the Hugging Face hub, the torchvision data modules
fetch archives from their hosts.  Without a network ``huggingface_hub`` retries for about
a minute before giving up, and a plain download hangs on its socket; on a cluster node
without internet (or in CI) that is time lost and an error that does not say what to do.
This module is the one place that answers "can we download?":

* :func:`hub_offline` -- the user asked for offline mode (``HF_HUB_OFFLINE``);
* :func:`unreachable_reason` -- one short probe of a URL's host (``None`` = reachable);
* :func:`load_pretrained` -- cache first, then the two checks, then the download (timm
  backbones); :mod:`cloc_lightning.nn.clip` (open_clip tags) and
  :mod:`cloc_lightning.data.torchvision_sets` (dataset archives) use the same checks.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "PretrainedUnavailableError",
    "hub_offline",
    "hub_cache_only",
    "unreachable_reason",
    "load_pretrained",
    "HUB_PROBE_TIMEOUT_S",
]

#: Seconds :func:`unreachable_reason` waits by default (connect + first byte); module-level so
#: users and tests can change it (:mod:`cloc_lightning.nn.clip` reads it here at each call).
HUB_PROBE_TIMEOUT_S: float = 3.0

#: values of ``HF_HUB_OFFLINE`` that mean "on" (as ``huggingface_hub`` reads them)
_TRUE_VALUES = {"1", "on", "yes", "true"}


class PretrainedUnavailableError(RuntimeError):
    """Pretrained weights are neither cached nor downloadable right now."""


def hub_offline() -> bool:
    """True when the user asked ``huggingface_hub`` to stay offline.

    ``huggingface_hub`` reads ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) once, when it
    is imported; the environment variable is read again here, so setting it later counts too.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE_VALUES


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


def unreachable_reason(url: str, timeout: float | None = None) -> str | None:
    """``None`` when ``url``'s host answers within ``timeout`` seconds (default
    :data:`HUB_PROBE_TIMEOUT_S`), else why not (``"URLError: ..."``).

    Any HTTP answer counts as reachable (the real download then reports HTTP errors such
    as 401/404 itself).  Hugging Face hub files (``.../resolve/...``) are probed with the
    hub client (its endpoint, proxies and token), other URLs with an HTTP ``HEAD`` request
    (which honours the ``*_proxy`` environment variables).
    """
    timeout = HUB_PROBE_TIMEOUT_S if timeout is None else timeout
    if "/resolve/" in url:
        from huggingface_hub import get_hf_file_metadata
        from huggingface_hub.errors import HfHubHTTPError

        try:
            get_hf_file_metadata(url, timeout=timeout)
            return None
        except HfHubHTTPError:
            return None
        except Exception as exc:  # noqa: BLE001 - the client's transport errors (refused, DNS, timeout, offline) share no base class
            return f"{type(exc).__name__}: {exc}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError, timeouts, bad URLs, broken replies
        return f"{type(exc).__name__}: {exc}"


def load_pretrained(load: Callable[[], T], what: str, fix: str) -> T:
    """Run ``load`` (which may download from the hub) without minute-long offline retries.

    1. try ``load`` with the hub restricted to its local cache;
    2. if that fails and the hub is offline (:func:`hub_offline`) or unreachable
       (:func:`unreachable_reason` of the hub endpoint), raise
       :class:`PretrainedUnavailableError` naming ``what`` and ``fix``;
    3. otherwise call ``load`` again with network access.
    """
    from huggingface_hub import constants

    try:
        with hub_cache_only():
            return load()
    except (OSError, RuntimeError, ValueError) as cached_error:
        if hub_offline():
            reason = "HF_HUB_OFFLINE is set and they are not in the local cache"
        elif unreachable_reason(constants.ENDPOINT) is not None:
            reason = "they are not in the local cache and the Hugging Face hub cannot be reached (no internet?)"
        else:
            return load()
        raise PretrainedUnavailableError(f"Pretrained weights for {what} are unavailable: {reason}. {fix}") from cached_error
