"""Let LitData's object-store client use an ``http://`` S3-compatible endpoint (a local MinIO or moto server).

LitData 0.2.7x builds its obstore S3 client with fixed client options, and obstore refuses plain
HTTP unless ``allow_http`` is set; real S3 is HTTPS and is not touched.  Only an ``http://``
``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``), which the user sets, turns it on.  It is called
where LitData is first used in a process (:func:`cloc_lightning.data.streaming.require_litdata`) and
where a chunk split is unpickled in a spawned loader worker; ``data optimize`` uploads from its own
process with boto3, which needs nothing of this.
"""

from __future__ import annotations

import os

__all__ = ["allow_http_endpoint", "http_endpoint"]


def http_endpoint() -> bool:
    """Whether the environment names an ``http://`` S3 endpoint."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return endpoint.startswith("http://")


def allow_http_endpoint() -> None:
    """Add ``allow_http`` to LitData's obstore client options when the endpoint is ``http://`` (else nothing)."""
    if not http_endpoint():
        return
    try:
        from litdata.streaming import downloader
    except ImportError:
        return
    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"
