"""What keeps the supervisor from watching an engine fully right now (out of descriptors, a
process scan that failed): it goes on and retries, says so once in the log and shows it in the
engine's status (`traylm status`) until it passes."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class Supervision:
    """The trouble of one engine's supervisor, or none (``text`` is "")."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.text = ""

    def trouble(self, what: str, exc: BaseException) -> None:
        """Something the supervisor needs failed; it goes on and retries. Logged once per
        distinct trouble, and shown in the engine's status until it passes."""
        text = f"{what}: {exc} (retrying)"
        if text != self.text:
            log.warning("engine %s: %s", self.engine_id, text)
            self.text = text

    def over(self) -> None:
        if self.text:
            log.info("engine %s: supervision is back to normal", self.engine_id)
            self.text = ""
