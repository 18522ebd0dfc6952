"""Loading CLIP models from open_clip, offline-safe.

:func:`load_clip` is the one place that turns ``clip_model`` / ``pretrained`` config
values into an open_clip model and its tokenizer. It adds three things on top of
:func:`open_clip.create_model`:

* an unknown model name is a :class:`ValueError` that lists close names;
* a ``pretrained`` *tag* (``"openai"``, ``"laion2b_s34b_b79k"``, ...) is first looked up in
  the local caches (Hugging Face hub cache, or ``~/.cache/clip`` for URL-only tags); a
  cached checkpoint is loaded from disk without touching the network at all;
* a tag that is not cached fails within about a second when the machine is offline
  (``HF_HUB_OFFLINE=1``, or the hub/URL host cannot be reached with a short probe)
  instead of the ~50 s of retries that ``huggingface_hub`` does by default, with a
  message that names the fixes (``pretrained: null``, a local checkpoint path, or
  downloading once with network);
* the activation follows the weights (:func:`resolve_clip_model`): a tag trained with
  QuickGELU (every ``openai`` tag, and some others) paired with an architecture name that
  uses ``nn.GELU`` (``ViT-B-16`` + ``openai``) is built as the ``-quickgelu`` variant
  (``ViT-B-16-quickgelu``), with a printed note. open_clip itself only warns and then runs
  the weights with the wrong activation (the seed repo, OrdinalCLIP, uses OpenAI's CLIP code,
  which always has QuickGELU). A mismatch with no matching variant is a ``ValueError``.

References: open_clip (https://github.com/mlfoundations/open_clip, ``factory.create_model``,
``pretrained.download_pretrained``); OrdinalCLIP (Li et al., NeurIPS 2022,
arXiv 2206.02338, https://github.com/xk-huang/OrdinalCLIP) uses CLIP RN50 / ViT-B-16 /
ViT-B-32 with OpenAI weights.
"""

from __future__ import annotations

import difflib
import os
import urllib.parse
from typing import Any, Literal

from torch import nn

# the project's one error for "weights not available", and its offline / reachability checks; the probe's
# timeout is read from the hub module at each call (``cloc_lightning.hub.HUB_PROBE_TIMEOUT_S = 1.0`` sets it)
from cloc_lightning import hub
from cloc_lightning._logging import print_line
from cloc_lightning.hub import PretrainedUnavailableError, hub_offline, unreachable_reason
from cloc_lightning.validation import check_choice

__all__ = [
    "load_clip",
    "resolve_clip_model",
    "build_open_clip_visual",
    "Precision",
]

#: open_clip's ``precision`` values
Precision = Literal["fp32", "fp16", "bf16", "pure_fp16", "pure_bf16", "amp", "amp_bf16", "amp_bfloat16"]


def _close_model_names(name: str, available: list[str], n: int = 5) -> list[str]:
    lowered = {m.lower(): m for m in available}
    close = [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.4)]
    return close or sorted(available)[:n]


def _validate_model_name(clip_model: str) -> None:
    import open_clip

    if not isinstance(clip_model, str) or not clip_model:
        raise TypeError(f"clip_model must be a non-empty open_clip model name (e.g. 'ViT-B-32'), got {clip_model!r}")
    if clip_model.startswith(("hf-hub:", "local-dir:")):
        return  # open_clip resolves these schemas itself
    available = open_clip.list_models()
    if clip_model.replace("/", "-") in available:
        return
    close = _close_model_names(clip_model, available)
    raise ValueError(
        f"Unknown open_clip model name {clip_model!r}. Close names: {close}. "
        "See open_clip.list_models() for all names (e.g. 'RN50', 'ViT-B-32', 'ViT-S-32-alt')."
    )


def _fix_hint(clip_model: str, tag: str) -> str:
    return (
        f"Fixes: set `pretrained: null` (random init, what the tests use), pass a local checkpoint "
        f"path as `pretrained`, or download once on a machine with network "
        f"(python -c \"import open_clip; open_clip.create_model('{clip_model}', pretrained='{tag}')\") "
        "and copy the Hugging Face cache (HF_HOME) / ~/.cache/clip here."
    )


def _resolve_tag(clip_model: str, tag: str, cfg: dict[str, Any], cache_dir: str | None) -> str | None:
    """Local path of a cached checkpoint for ``tag``, or None when it has to be downloaded.

    Raises :class:`PretrainedUnavailableError` quickly when the download cannot work.
    """
    if "file" in cfg:
        return str(cfg["file"])
    hf_hub = cfg.get("hf_hub", "")
    url = cfg.get("url", "")
    where: list[str] = []
    if hf_hub:
        from huggingface_hub import constants as hf_constants
        from huggingface_hub import hf_hub_url, try_to_load_from_cache
        from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

        repo_id, filename = os.path.split(hf_hub)
        filename = filename or HF_WEIGHTS_NAME
        candidates = []
        if filename == HF_WEIGHTS_NAME:
            candidates.append(HF_SAFE_WEIGHTS_NAME)
        elif filename.endswith((".bin", ".pth")):
            candidates.append(filename[:-4] + ".safetensors")
        candidates.append(filename)
        for name in candidates:
            hit = try_to_load_from_cache(repo_id, name, cache_dir=cache_dir)
            if isinstance(hit, str) and os.path.isfile(hit):
                return hit
        hub_cache = cache_dir or hf_constants.HF_HUB_CACHE
        where.append(f"Hugging Face cache {hub_cache} (repo {repo_id}, files {candidates})")
        probe_url = hf_hub_url(repo_id, filename, endpoint=hf_constants.ENDPOINT)
    else:
        clip_cache = cache_dir or os.path.expanduser("~/.cache/clip")
        target = os.path.join(clip_cache, os.path.basename(urllib.parse.urlparse(url).path))
        if os.path.isfile(target):
            from open_clip.pretrained import download_pretrained_from_url

            # verifies the checksum of the cached file; no network when it matches
            return str(download_pretrained_from_url(url, cache_dir=clip_cache))
        where.append(f"{target}")
        probe_url = url
    if hub_offline():
        raise PretrainedUnavailableError(
            f"pretrained={tag!r} for {clip_model!r} is not cached ({'; '.join(where)}) and "
            f"HF_HUB_OFFLINE is set, so it cannot be downloaded. {_fix_hint(clip_model, tag)}"
        )
    timeout = hub.HUB_PROBE_TIMEOUT_S
    err = unreachable_reason(probe_url, timeout)
    if err is not None:
        raise PretrainedUnavailableError(
            f"pretrained={tag!r} for {clip_model!r} is not cached ({'; '.join(where)}) and "
            f"{probe_url} cannot be reached within {timeout:g} s ({err}); no network? "
            f"{_fix_hint(clip_model, tag)}"
        )
    return None  # reachable: let open_clip download it


_QUICKGELU_SUFFIX = "-quickgelu"


def resolve_clip_model(clip_model: str, pretrained: str | os.PathLike[str] | None) -> tuple[str, str | None]:
    """The open_clip model name whose activation matches the ``pretrained`` tag's weights.

    open_clip registers some tags (all ``openai`` ones, ``yfcc15m``, ``cc12m``, the MetaCLIP and
    DFN tags of some models, ...) as trained with QuickGELU (``get_pretrained_cfg(name, tag)
    ["quick_gelu"]``), while the plain architecture names (``RN50``, ``ViT-B-16``, ...) build
    ``nn.GELU``; their ``-quickgelu`` names build ``QuickGELU``. Both activations have no
    parameters, so the weights load either way and a mismatch silently changes every MLP of
    both towers. This function picks the variant whose model config has the tag's
    ``quick_gelu`` (and under which the tag is registered):

    * ``("ViT-B-16", "openai")`` → ``("ViT-B-16-quickgelu", note)``;
    * ``("ViT-B-16-quickgelu", "openai")``, ``("ViT-B-32", "laion2b_s34b_b79k")`` → unchanged, ``None``;
    * ``pretrained`` ``None`` / ``""``, a file path (not a tag of this model), or a schema name
      (``hf-hub:``, ``local-dir:``) → unchanged, ``None`` (nothing to go by: name the
      ``-quickgelu`` model yourself for OpenAI checkpoint files).

    Args:
        clip_model: open_clip model name (``/`` is read as ``-``, as open_clip does).
        pretrained: the ``pretrained`` value given to :func:`load_clip`.

    Returns:
        ``(name, note)``: the name to build and a one-line note when it differs from
        ``clip_model`` (``None`` otherwise).

    Raises:
        ValueError: the tag's activation differs from the model's and open_clip has no variant
            of ``clip_model`` with the tag's activation registered for that tag.
    """
    import open_clip
    from open_clip.pretrained import get_pretrained_cfg, list_pretrained_tags_by_model

    if not pretrained or not isinstance(pretrained, str) or clip_model.startswith(("hf-hub:", "local-dir:")):
        return clip_model, None
    name = clip_model.replace("/", "-")
    tag_cfg = get_pretrained_cfg(name, pretrained)
    if not tag_cfg:
        return clip_model, None  # a file path, or an unknown tag (load_clip reports it)
    want = bool(tag_cfg.get("quick_gelu", False))
    have = bool((open_clip.get_model_config(name) or {}).get("quick_gelu", False))
    if want == have:
        return clip_model, None
    if want and not name.endswith(_QUICKGELU_SUFFIX):
        candidate: str | None = name + _QUICKGELU_SUFFIX
    elif not want and name.endswith(_QUICKGELU_SUFFIX):
        candidate = name[: -len(_QUICKGELU_SUFFIX)]
    else:
        candidate = None
    cand_cfg = open_clip.get_model_config(candidate) if candidate else None
    if (
        candidate is not None
        and cand_cfg is not None
        and bool(cand_cfg.get("quick_gelu", False)) == want
        and get_pretrained_cfg(candidate, pretrained)
    ):
        act = "QuickGELU" if want else "nn.GELU"
        note = (
            f"note: pretrained={pretrained!r} was trained with {act}, so {clip_model!r} is built as {candidate!r} "
            f"(open_clip would build {clip_model!r} with {'nn.GELU' if want else 'QuickGELU'} and only warn); "
            f"write clip_model: {candidate} to silence this note."
        )
        return candidate, note
    tags = [t for t in list_pretrained_tags_by_model(name) if bool(get_pretrained_cfg(name, t).get("quick_gelu", False)) == have]
    raise ValueError(
        f"pretrained={pretrained!r} was trained with quick_gelu={want} but {clip_model!r} builds quick_gelu={have}, "
        f"and open_clip registers no variant of {clip_model!r} with quick_gelu={want} for that tag, so the weights "
        f"would run with the wrong activation. Use a tag of {clip_model!r} trained with its activation "
        f"({tags or 'none registered'}), another model name, or a local checkpoint path (then the named "
        "architecture is used as it is)."
    )


def load_clip(
    clip_model: str,
    pretrained: str | None,
    precision: Precision = "fp32",
    cache_dir: str | None = None,
) -> tuple[nn.Module, Any]:
    """Build an open_clip CLIP model and its tokenizer.

    Args:
        clip_model: open_clip model name (``open_clip.list_models()``), e.g. ``"RN50"``,
            ``"ViT-B-32"``, ``"ViT-S-32-alt"``; ``"hf-hub:org/repo"`` and
            ``"local-dir:/path"`` are passed to open_clip unchanged. With a tag trained with the
            other activation, the matching variant is built instead (``ViT-B-16`` + ``openai`` →
            ``ViT-B-16-quickgelu``, with a printed note; :func:`resolve_clip_model`).
        pretrained: ``None`` (or ``""``) → random initialisation; an open_clip tag for this
            model (``open_clip.list_pretrained_tags_by_model(clip_model)``, e.g. ``"openai"``);
            or the path of a local checkpoint file (an open_clip / OpenAI state dict).
        precision: open_clip precision (``"fp32"``, ``"fp16"``, ``"bf16"``, ``"pure_fp16"``,
            ``"pure_bf16"``, ``"amp"``, ``"amp_bf16"``).
        cache_dir: download/cache folder passed to open_clip (the Hugging Face hub cache
            folder for hub-hosted tags; default ``$HF_HOME/hub``, or ``~/.cache/clip`` for URL tags).

    Returns:
        ``(model, tokenizer)``: the model in eval mode on CPU, and ``open_clip.get_tokenizer(clip_model)``
        (a callable ``list[str] -> LongTensor [N, context_length]``).

    Raises:
        ValueError: unknown model name (with close names), unknown precision, a ``pretrained``
            value that is neither a tag of this model nor an existing file, or a tag whose activation
            (QuickGELU or not) no variant of ``clip_model`` has.
        PretrainedUnavailableError (``cloc_lightning.hub``, a RuntimeError): a tag that is not cached while offline
            (``HF_HUB_OFFLINE=1``) or while its host cannot be reached within
            :data:`~cloc_lightning.hub.HUB_PROBE_TIMEOUT_S` seconds.

    Example:
        >>> model, tokenizer = load_clip("ViT-S-32-alt", pretrained=None)  # doctest: +SKIP
        >>> model, tokenizer = load_clip("RN50", pretrained="openai")      # doctest: +SKIP
        note: pretrained='openai' was trained with QuickGELU, so 'RN50' is built as 'RN50-quickgelu' ...
    """
    import open_clip
    from open_clip.pretrained import get_pretrained_cfg, list_pretrained_tags_by_model

    _validate_model_name(clip_model)
    check_choice("precision", precision, Precision)
    if pretrained is not None and not isinstance(pretrained, (str, os.PathLike)):
        raise TypeError(f"pretrained must be None, an open_clip tag or a file path, got {type(pretrained).__name__}")
    pretrained = os.fspath(pretrained) if pretrained else None
    # before any download: the architecture must match the weights' activation
    clip_model, note = resolve_clip_model(clip_model, pretrained)
    if note:
        print_line(None, note)

    create_kwargs: dict[str, Any] = dict(precision=precision, cache_dir=cache_dir)
    has_schema = clip_model.startswith(("hf-hub:", "local-dir:"))
    if pretrained is not None and not has_schema:
        name = clip_model.replace("/", "-")
        cfg = get_pretrained_cfg(name, pretrained)
        if cfg:
            local = _resolve_tag(clip_model, pretrained, cfg, cache_dir)
            if local is not None:
                pretrained = local
        elif not os.path.isfile(pretrained):
            tags = list_pretrained_tags_by_model(name)
            raise ValueError(
                f"pretrained={pretrained!r} is neither a known open_clip tag for {clip_model!r} "
                f"(tags: {tags}) nor an existing checkpoint file. Use one of the tags, a local path, "
                "or `pretrained: null` for random init."
            )
    model = open_clip.create_model(clip_model, pretrained=pretrained, **create_kwargs)
    model.eval()
    tokenizer = open_clip.get_tokenizer(clip_model, cache_dir=cache_dir)
    return model, tokenizer


def build_open_clip_visual(
    clip_model: str | None = None,
    embed_dim: int | None = None,
    vision_cfg: dict[str, Any] | None = None,
    quick_gelu: bool | None = None,
) -> nn.Module:
    """Build (randomly initialised) the visual tower of an open_clip architecture, without its text tower.

    Used to re-create an exported image encoder before loading its state dict
    (the ``"open_clip_visual"`` builder of :mod:`cloc_lightning.nn.encoders`; see
    :class:`cloc_lightning.nn.prototype_classifier.PrototypeClassifier`).

    Args:
        clip_model: open_clip model name whose ``embed_dim`` / ``vision_cfg`` / ``quick_gelu`` are used.
        embed_dim: output feature dimension D (overrides the model config).
        vision_cfg: open_clip ``CLIPVisionCfg`` fields as a dict (overrides the model config).
        quick_gelu: activation flag (overrides the model config).

    Returns:
        ``nn.Module`` mapping images ``[N, 3, H, W]`` to features ``[N, D]``.
    """
    import open_clip
    from open_clip.model import _build_vision_tower

    cfg: dict[str, Any] = {}
    if clip_model is not None:
        _validate_model_name(clip_model)
        cfg = dict(open_clip.get_model_config(clip_model.replace("/", "-")) or {})
    if embed_dim is not None:
        cfg["embed_dim"] = embed_dim
    if vision_cfg is not None:
        cfg["vision_cfg"] = dict(vision_cfg)
    if quick_gelu is not None:
        cfg["quick_gelu"] = quick_gelu
    if "embed_dim" not in cfg or "vision_cfg" not in cfg:
        raise ValueError("build_open_clip_visual needs clip_model, or both embed_dim and vision_cfg")
    visual: nn.Module = _build_vision_tower(cfg["embed_dim"], cfg["vision_cfg"], bool(cfg.get("quick_gelu", False)), None)
    return visual
