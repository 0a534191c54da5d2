"""``DaemonClient``: every feature's calls (one mixin each, engines/client/*.py) on one
connection (base.py)."""

from __future__ import annotations

from engines.client.batches import BatchCalls
from engines.client.bench import BenchCalls
from engines.client.chats import ChatCalls
from engines.client.control import ControlCalls
from engines.client.gpu import GPUCalls
from engines.client.hub import HubCalls
from engines.client.models import ModelCalls
from engines.client.peers import PeerCalls
from engines.client.remote import RemoteCalls
from engines.client.requests import RequestCalls
from engines.client.trt import TRTCalls
from engines.client.tune import TuneCalls
from engines.client.upgrade import UpgradeCalls


class DaemonClient(
    ControlCalls,
    ModelCalls,
    GPUCalls,
    HubCalls,
    TRTCalls,
    RemoteCalls,
    BenchCalls,
    ChatCalls,
    PeerCalls,
    RequestCalls,
    TuneCalls,
    UpgradeCalls,
    BatchCalls,
):
    """The daemon's control API: every feature's calls (one module each, engines/client/*.py)
    on one connection (base.py)."""
