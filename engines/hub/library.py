"""The local library: model revisions in the shared Hugging Face cache, with what traylm knows
about them (verified or not, which profiles use them, which engines can serve them).

"verified" means: traylm hashed every engine file of that revision against the Hub's hashes and
nothing went missing or changed size since. Models another tool downloaded show as "unverified"
until ``verify`` is run. Blocking methods: the daemon calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engines.core.modelinfo import ConfigUnreadable, folder_config
from engines.errors import ModelNotFound
from engines.events.hub import LocalModel
from engines.hub import cachefs
from engines.hub.access import HubAccess
from engines.hub.cachefs import CachedRevision
from engines.hub.fit import supported
from engines.hub.names import validate_commit, validate_repo_id, validate_revision
from engines.hub.records import CheckRecord, HubRecords
from engines.hub.search import fetch_listing
from engines.hub.selection import select_files
from engines.hub.shape import parse_config
from engines.hub.verify import ExpectedFile, check_snapshot

TRTLLM_ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Phi3ForCausalLM",
        "DeepseekV3ForCausalLM",
        "NemotronForCausalLM",
        "GptOssForCausalLM",
    }
)


class Library:
    def __init__(self, *, access: Callable[[], HubAccess], records: HubRecords) -> None:
        self._access = access
        self._records = records

    def models(
        self,
        *,
        profiles: dict[str, list[str]] | None = None,
        served: dict[str, list[str]] | None = None,
    ) -> list[LocalModel]:
        """``profiles``/``served``: repo id → profile names / running engine ids."""
        checks = self._records.checks()
        trusted = self._records.trusted()
        out = []
        for repo_id, rev in self._revisions():
            key = (repo_id, rev.commit_hash)
            out.append(
                self._local(repo_id, rev, checks.get(key), trusted, profiles or {}, served or {})
            )
        return sorted(out, key=lambda m: (m.repo_id, -m.last_modified_s))

    def cached_revisions(self, repo_id: str) -> list[CachedRevision]:
        """The revisions of ``repo_id`` in the local cache ([] when it was never downloaded)."""
        validate_repo_id(repo_id)
        return [rev for rid, rev in self._revisions() if rid == repo_id]

    def find(self, repo_id: str, revision: str | None = None) -> list[CachedRevision]:
        """The cached revisions of a repo (all, or the one ``revision`` names)."""
        validate_repo_id(repo_id)
        revision = validate_revision(revision)
        found = [rev for rid, rev in self._revisions() if rid == repo_id]
        if revision:
            found = [r for r in found if r.commit_hash == revision or revision in r.refs]
        if not found:
            where = f" at {revision}" if revision else ""
            raise ModelNotFound(
                f"{repo_id}{where} is not in the local library; `traylm models ls` lists it"
            )
        return found

    def verify(self, repo_id: str, revision: str | None = None) -> list[LocalModel]:
        """Hash every engine file of the cached revision(s) against the Hub's hashes."""
        for rev in self.find(repo_id, revision):
            expected = self._expected(repo_id, rev.commit_hash)
            results = check_snapshot(Path(rev.snapshot_path), expected)
            ok = all(r.ok for r in results)
            self._records.mark_checked(repo_id, rev.commit_hash, expected, ok=ok)
        commits = {r.commit_hash for r in self.find(repo_id, revision)}
        return [m for m in self.models() if m.repo_id == repo_id and m.commit_sha in commits]

    def delete(self, repo_id: str, revision: str | None = None) -> int:
        """Delete cached revision(s); returns the bytes freed. The caller checks that no engine
        serves the model first."""
        revisions = self.find(repo_id, revision)
        freed = cachefs.delete_revisions(
            self._access().cache_dir, repo_id, (r.commit_hash for r in revisions)
        )
        for r in revisions:
            self._records.forget(repo_id, r.commit_hash)
        return freed

    # ----------------------------------------------------------------- internals

    def _revisions(self) -> list[tuple[str, CachedRevision]]:
        return [(r.repo_id, r) for r in cachefs.scan_models(self._access().cache_dir)]

    def _expected(self, repo_id: str, commit_sha: str) -> tuple[ExpectedFile, ...]:
        record = self._records.checks().get((repo_id, commit_sha))
        if record is not None and record.files:
            return record.files
        listing = fetch_listing(self._access(), repo_id, validate_commit(commit_sha))
        keep = select_files(repo_id, listing.entries).keep
        return tuple(ExpectedFile(e.path, e.size_bytes, e.sha256, e.git_sha1) for e in keep)

    def _local(
        self,
        repo_id: str,
        rev: CachedRevision,
        record: CheckRecord | None,
        trusted: set[str],
        profiles: dict[str, list[str]],
        served: dict[str, list[str]],
    ) -> LocalModel:
        snapshot = rev.snapshot_path
        verified, problems = _status(snapshot, record)
        if verified == "unverified" and rev.missing:
            verified = "incomplete"
            problems = tuple(f"{m} is missing" for m in rev.missing)
        config = _read_config(snapshot)
        shape = parse_config(config) if config else None
        return LocalModel(
            repo_id=repo_id,
            commit_sha=rev.commit_hash,
            refs=tuple(sorted(rev.refs)),
            size_bytes=int(rev.size_on_disk),
            files=int(rev.nb_files),
            snapshot_path=str(snapshot),
            verified=verified,
            verified_at_s=record.checked_s if record else None,
            problems=problems,
            profiles=tuple(sorted(profiles.get(repo_id, []))),
            engines=_engines(shape.architecture, shape.quantization) if shape else (),
            served_by=tuple(sorted(served.get(repo_id, []))),
            trust_remote_code=repo_id in trusted,
            needs_remote_code=bool(shape and shape.needs_remote_code),
            last_modified_s=float(rev.last_modified),
        )


def _status(snapshot: Path, record: CheckRecord | None) -> tuple[str, tuple[str, ...]]:
    """incomplete (a file is missing) > corrupt (a hash or size differs) > verified."""
    if record is None:
        return "unverified", ()
    missing, changed = [], []
    for f in record.files:
        local = snapshot / f.path
        if not local.exists():
            missing.append(f"{f.path} is missing")
        elif local.stat().st_size != f.size_bytes:
            changed.append(f"{f.path} changed size since it was verified")
    if missing:
        return "incomplete", tuple(missing + changed)
    if record.state != "verified":
        return "corrupt", ("a file did not match the Hub's hash at the last check", *changed)
    return ("corrupt", tuple(changed)) if changed else ("verified", ())


def _read_config(snapshot: Path) -> dict[str, Any] | None:
    try:
        return folder_config(snapshot)
    except ConfigUnreadable:
        return None


def _engines(architecture: str, quantization: str | None) -> tuple[str, ...]:
    engines = []
    if supported("vllm", quantization, "8.9")[0]:
        engines.append("vllm")
    if architecture in TRTLLM_ARCHITECTURES and supported("trtllm", quantization, "8.9")[0]:
        engines.append("trtllm")
    return tuple(engines)
