"""The library's models the tray (and the chat's model picker) can start: registered model
folders (started by name, like a profile) and models in the Hugging Face cache (started as a
quick engine with ``--model``), each with what stops it from starting here, if anything (the
daemon's answer: its servable model's ``blocked``)."""

from __future__ import annotations

from dataclasses import dataclass

from desktop.daemon.state import LIVE_STATES, AppState


@dataclass(frozen=True)
class LibraryStart:
    kind: str  # "folder" (start by name) | "cached" (start --model REPO)
    name: str  # the folder's name, or the repo id
    served_name: str
    path: str
    blocker: str  # why it cannot start here ("" when it can)

    @property
    def label(self) -> str:
        return f"Start {self.name}" + (f"  ({self.blocker})" if self.blocker else "")


def library_starts(state: AppState) -> list[LibraryStart]:
    """Library models not served or starting now, folders first."""
    busy = {n for e in state.engines.values() if e.state in LIVE_STATES for n in e.served_names}
    busy |= {e.engine_id for e in state.engines.values() if e.state in LIVE_STATES}
    starts = []
    for f in state.folders:
        if f.name in busy or f.served_name in busy:
            continue
        why = f.problems[0] if f.problems else state.why_blocked(f.name)
        starts.append(LibraryStart("folder", f.name, f.served_name, f.path, why))
    seen: set[str] = set()
    for m in state.cached_models:
        served = m.repo_id.rsplit("/", 1)[-1]
        if m.repo_id in seen or served in busy or m.profiles:
            continue  # one entry per repo; a profile of its own is in Profiles ▸
        seen.add(m.repo_id)
        why = state.why_blocked(m.repo_id)
        if m.verified in ("incomplete", "corrupt"):
            why = f"{m.verified}: {m.problems[0] if m.problems else 'verify it'}"
        starts.append(LibraryStart("cached", m.repo_id, served, m.snapshot_path, why))
    return starts
