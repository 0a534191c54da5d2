"""Frozen event dataclasses and API data types: the only things that cross from the core to a UI.

One module per feature, over a shared codec:

    codec.py     Event (the base: ``kind`` and ``ts_s``), to_plain, from_plain
    core.py      engine lifecycle, notices, the daemon stopping, engine-env installs
    gpu.py  hub.py  trt.py  remote.py  chat.py  bench.py  models.py  gateway.py  tune.py
    upgrade.py  peers.py
                 each feature's types
    registry.py  every event type by wire name, from_wire

Code in engines/ imports the module it needs (``from engines.events.gpu import GPUInfo``), so
that a process loads only its own feature's types (traylm-gpud never loads bench or chat). For
clients (desktop/, tests) this package also answers every name itself
(``from engines.events import GPUInfo, from_wire``): the first such lookup loads every module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engines.events.bench import *  # noqa: F403
    from engines.events.chat import *  # noqa: F403
    from engines.events.codec import *  # noqa: F403
    from engines.events.core import *  # noqa: F403
    from engines.events.gateway import *  # noqa: F403
    from engines.events.gpu import *  # noqa: F403
    from engines.events.hub import *  # noqa: F403
    from engines.events.models import *  # noqa: F403
    from engines.events.peers import *  # noqa: F403
    from engines.events.registry import *  # noqa: F403
    from engines.events.remote import *  # noqa: F403
    from engines.events.trt import *  # noqa: F403
    from engines.events.tune import *  # noqa: F403
    from engines.events.upgrade import *  # noqa: F403


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # dunder lookups (import machinery, pickling) are not types
        raise AttributeError(name)
    codec = importlib.import_module("engines.events.codec")
    registry = importlib.import_module("engines.events.registry")
    for module in (codec, registry, *map(registry.feature_module, registry.MODULES)):
        if not name.startswith("_") and name in vars(module):
            value = vars(module)[name]
            globals()[name] = value
            return value
    raise AttributeError(f"module 'engines.events' has no attribute {name!r}")
