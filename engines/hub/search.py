"""Search the Hub and describe a model from metadata only (no weights are downloaded).

Every function here blocks (huggingface_hub is synchronous): the daemon calls them through
``asyncio.to_thread``. Hub errors become traylm errors whose message says what to do.
"""

from __future__ import annotations

import contextlib
import difflib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engines import __version__
from engines.errors import (
    HubAccessDenied,
    HubError,
    HubUnavailable,
    ModelNotFound,
)
from engines.events.hub import ModelDetails, ModelFile, ModelSummary
from engines.hub.access import HubAccess
from engines.hub.names import validate_repo_id, validate_revision
from engines.hub.selection import RepoEntry, file_kind, select_files
from engines.hub.shape import Shape, model_parameters, parse_config, weight_bytes_from_parameters

if TYPE_CHECKING:
    from huggingface_hub import HfApi

SORTS = {"downloads": "downloads", "likes": "likes", "recent": "last_modified"}
QUANT_TAGS = ("awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "nvfp4", "mxfp4")
_EXPAND = ["downloads", "likes", "lastModified", "gated", "safetensors", "tags", "pipeline_tag"]
CONFIG_MAX_BYTES = 4 << 20
HUB_TIMEOUT_S = 20.0


def hub_api(access: HubAccess) -> HfApi:
    from huggingface_hub import HfApi

    return HfApi(
        endpoint=access.endpoint,
        token=access.hf_token_arg,
        library_name="traylm",
        library_version=__version__,
    )


@contextlib.contextmanager
def hub_errors(access: HubAccess, repo_id: str = "", revision: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub and network errors into traylm errors with advice."""
    import httpx2
    from huggingface_hub import errors as hf

    try:
        yield
    except hf.GatedRepoError:
        raise HubAccessDenied(access.gated_advice(repo_id)) from None
    except hf.RevisionNotFoundError:
        raise ModelNotFound(
            f"{repo_id} has no revision {revision!r}; use a branch, tag or commit sha that "
            "exists on the model page (default: main)"
        ) from None
    except hf.RepositoryNotFoundError:
        raise ModelNotFound(_not_found_message(access, repo_id)) from None
    except hf.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if status in (401, 403):
            raise HubAccessDenied(access.gated_advice(repo_id)) from None
        raise HubUnavailable(
            f"{access.endpoint} answered HTTP {status} for {repo_id or 'the search'}; "
            "try again in a minute"
        ) from None
    except (httpx2.TransportError, hf.OfflineModeIsEnabled, TimeoutError) as exc:
        raise HubUnavailable(
            f"cannot reach {access.endpoint} ({type(exc).__name__}); check your network "
            "connection (or hub.endpoint / HF_ENDPOINT)"
        ) from None


def _not_found_message(access: HubAccess, repo_id: str) -> str:
    message = f"no model {repo_id} on {access.endpoint}"
    close = _close_names(access, repo_id)
    if close:
        message += f"; did you mean {' or '.join(close)}?"
    else:
        message += "; check the spelling (org/name), or log in if it is private"
    return message


def _close_names(access: HubAccess, repo_id: str) -> list[str]:
    """Close repo ids for a typo: the same author's models, and models sharing the longest word
    of the name (the Hub's search matches substrings, so a misspelt name finds nothing)."""
    import re

    org, _, name = repo_id.partition("/")
    words = sorted(re.split(r"[-_.]", name), key=len, reverse=True)
    api = hub_api(access)
    hits: set[str] = set()
    try:
        hits.update(m.id for m in api.list_models(author=org, limit=100))
        if words and len(words[0]) >= 3:
            hits.update(m.id for m in api.list_models(search=words[0], limit=100))
    except Exception:  # boundary: a suggestion is optional; the error is reported anyway
        return []
    return difflib.get_close_matches(repo_id, sorted(hits), n=2, cutoff=0.8)


# --------------------------------------------------------------------------- search


def search_models(
    access: HubAccess,
    *,
    query: str = "",
    sort: str = "downloads",
    quantization: str | None = None,
    limit: int = 20,
) -> tuple[ModelSummary, ...]:
    """Text-generation models matching ``query``, sorted by downloads, likes or recent."""
    if sort not in SORTS:
        raise HubError(f"sort must be one of {', '.join(SORTS)}", code="invalid_sort")
    if quantization and quantization not in QUANT_TAGS:
        raise HubError(
            f"quantization filter must be one of {', '.join(QUANT_TAGS)}", code="invalid_filter"
        )
    limit = max(1, min(limit, 100))
    with hub_errors(access):
        found = hub_api(access).list_models(
            search=query or None,
            pipeline_tag="text-generation",
            filter=quantization or None,
            sort=SORTS[sort],  # type: ignore[arg-type]
            limit=limit,
            expand=_EXPAND,  # type: ignore[arg-type]
        )
        return tuple(_summary(m) for m in found)


def _summary(m: Any) -> ModelSummary:
    params = dict(m.safetensors.parameters) if m.safetensors else {}
    tags = tuple(str(t) for t in (m.tags or ()))
    quantization = next((t for t in QUANT_TAGS if t in tags), None)
    return ModelSummary(
        repo_id=str(m.id),
        author=str(m.author or m.id.split("/")[0]),
        downloads=int(m.downloads or 0),
        likes=int(m.likes or 0),
        last_modified=m.last_modified.isoformat() if m.last_modified else "",
        gated=str(m.gated) if m.gated else "",
        quantization=quantization,
        parameters=model_parameters(params, quantization),
        weights_bytes=weight_bytes_from_parameters(params) if params else None,
        tags=tags,
        pipeline_tag=str(m.pipeline_tag or ""),
    )


# --------------------------------------------------------------------------- details


@dataclass(frozen=True)
class Listing:
    """A repo at one commit: metadata and every file with its hashes."""

    repo_id: str
    revision: str
    commit_sha: str
    entries: tuple[RepoEntry, ...]
    gated: str
    private: bool
    license: str
    parameters_by_dtype: Mapping[str, int]


def fetch_listing(access: HubAccess, repo_id: str, revision: str | None) -> Listing:
    """Resolve the revision to a commit sha and list the repo's files at that commit."""
    from huggingface_hub import RepoFile

    validate_repo_id(repo_id)
    rev = validate_revision(revision) or "main"
    api = hub_api(access)
    with hub_errors(access, repo_id, rev):
        info = api.model_info(repo_id, revision=rev, timeout=HUB_TIMEOUT_S)
        sha = str(info.sha)
        entries = tuple(
            RepoEntry(f.path, int(f.size), str(f.blob_id), f.lfs.sha256 if f.lfs else None)
            for f in api.list_repo_tree(repo_id, revision=sha, recursive=True)
            if isinstance(f, RepoFile)
        )
    card = info.card_data
    license_ = str(getattr(card, "license", "") or "") if card else ""
    return Listing(
        repo_id=repo_id,
        revision=rev,
        commit_sha=sha,
        entries=entries,
        gated=str(info.gated) if info.gated else "",
        private=bool(info.private),
        license=license_,
        parameters_by_dtype=dict(info.safetensors.parameters) if info.safetensors else {},
    )


def fetch_json(access: HubAccess, listing: Listing, filename: str) -> dict[str, Any] | None:
    """A small JSON file of the repo at the listed commit, read without touching the cache.
    None when the repo has no such file or it is gated for us."""
    from huggingface_hub import get_session, hf_hub_url, hf_raise_for_status
    from huggingface_hub.utils._headers import build_hf_headers

    if not any(e.path == filename for e in listing.entries):
        return None
    url = hf_hub_url(
        listing.repo_id, filename, revision=listing.commit_sha, endpoint=access.endpoint
    )
    headers = build_hf_headers(token=access.hf_token_arg, library_name="traylm")
    with hub_errors(access, listing.repo_id, listing.revision):
        try:
            response = get_session().get(url, headers=headers, timeout=HUB_TIMEOUT_S)
            hf_raise_for_status(response)
        except Exception as exc:
            from huggingface_hub import errors as hf

            if isinstance(exc, hf.GatedRepoError):
                return None
            raise
    if len(response.content) > CONFIG_MAX_BYTES:
        raise HubError(f"{listing.repo_id}/{filename} is larger than a config file can be")
    data = json.loads(response.content)
    return data if isinstance(data, dict) else None


def model_details(
    access: HubAccess, repo_id: str, revision: str | None = None, *, include_code: bool = False
) -> ModelDetails:
    listing = fetch_listing(access, repo_id, revision)
    config = fetch_json(access, listing, "config.json") or {}
    extra = fetch_json(access, listing, "hf_quant_config.json")
    shape = parse_config(config, extra)
    return details_from(listing, shape, include_code=include_code)


def details_from(listing: Listing, shape: Shape, *, include_code: bool = False) -> ModelDetails:
    selection = select_files(listing.repo_id, listing.entries, include_code=include_code)
    files = tuple(
        ModelFile(e.path, e.size_bytes, file_kind(e.path), e.sha256, e.git_sha1)
        for e in selection.keep
    )
    params = dict(listing.parameters_by_dtype)
    return ModelDetails(
        repo_id=listing.repo_id,
        revision=listing.revision,
        commit_sha=listing.commit_sha,
        architecture=shape.architecture,
        model_type=shape.model_type,
        parameters=model_parameters(params, shape.quantization),
        parameters_by_dtype=params,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_attention_heads=shape.num_attention_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        kv_latent_dim=shape.kv_latent_dim,
        vocab_size=shape.vocab_size,
        max_context=shape.max_context,
        dtype=shape.dtype,
        quantization=shape.quantization,
        quantization_config=shape.quantization_config,
        license=listing.license,
        gated=listing.gated,
        private=listing.private,
        needs_remote_code=shape.needs_remote_code,
        files=files,
        skipped_files=selection.skipped,
        download_bytes=sum(f.size_bytes for f in files),
        weights_bytes=sum(f.size_bytes for f in files if f.kind == "weights"),
        tie_word_embeddings=shape.tie_word_embeddings,
    )
