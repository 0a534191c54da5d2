"""Models on demand is built first (the gateway routes through it) and gets the parts it uses
that are built after it once, from the daemon (engines/ondemand/parts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.config.sections import Paths
from engines.daemon import Daemon
from tests.conftest import fast_settings


def test_the_daemon_hands_models_on_demand_its_parts_once(tmp_path: Path) -> None:
    d = Daemon(Paths.from_env({"TRAYLM_HOME": str(tmp_path)}), fast_settings(8000))
    parts = d.ondemand.parts
    assert (parts.control, parts.gateway, parts.gpus, parts.hub) == (d.control, d.ctx, d.gpu, d.hub)
    with pytest.raises(RuntimeError, match="connected to its parts already"):
        d.ondemand.connect(parts)
