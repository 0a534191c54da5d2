"""Preflight of a model across boxes: what each box reports, and every difference that would
make vLLM's multi-node start fail or hang, as findings that name the box and the fix (pure:
the head box gathers the facts, engines/multinode/head.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engines.multinode.network import virtual

CLOCK_WARN_S = 2.0
CLOCK_BLOCK_S = 60.0  # certificates carry validity times: far off, TLS itself starts to fail


@dataclass(frozen=True)
class Facts:
    """What one box reports about running its rank (the peer route /peer/spread/facts)."""

    box: str
    engine_version: str  # "" when the asked version is not installed there
    engine_problem: str
    model_digest: str  # "" when the model is missing there
    model_problem: str
    time_s: float  # the box's clock when it answered
    interface: str  # the box's interface towards the head box
    address: str  # its address on it


@dataclass(frozen=True)
class Finding:
    box: str
    check: str  # engine | model | clock | interface | port | link
    text: str  # what was found and what to do
    blocking: bool = True

    def __str__(self) -> str:
        return self.text


def compare(head: Facts, other: Facts, *, skew_s: float) -> list[Finding]:
    """Everything about ``other`` that differs from ``head`` in a way that matters.
    ``skew_s``: ``other``'s clock minus this box's at the moment it answered."""
    box = other.box
    found: list[Finding] = []
    install = f"`traylm engines install vllm --version {head.engine_version}` on {box}"
    if not other.engine_version:
        found.append(Finding(box, "engine", f"{box}: {other.engine_problem}; run {install}"))
    elif other.engine_version != head.engine_version:
        found.append(
            Finding(
                box,
                "engine",
                f"{box} runs vLLM {other.engine_version}, {head.box} runs "
                f"{head.engine_version}: every box needs the same engine version (and with it the "
                f"same torch and NCCL); run {install}",
            )
        )
    if not other.model_digest:
        found.append(Finding(box, "model", f"{box}: {other.model_problem}"))
    elif other.model_digest != head.model_digest:
        found.append(
            Finding(
                box,
                "model",
                f"the model's files on {box} differ from {head.box}'s (digest "
                f"{other.model_digest[:12]} vs {head.model_digest[:12]}): copy the same folder "
                "(or pull the same revision) to both boxes",
            )
        )
    if abs(skew_s) > CLOCK_WARN_S:
        found.append(
            Finding(
                box,
                "clock",
                f"{box}'s clock is {skew_s:+.0f} s off {head.box}'s: turn on time sync on both "
                "(`timedatectl set-ntp true`); logs of the two ranks will not line up"
                + (", and TLS between the boxes fails" if abs(skew_s) > CLOCK_BLOCK_S else ""),
                blocking=abs(skew_s) > CLOCK_BLOCK_S,
            )
        )
    if virtual(other.interface):
        found.append(
            Finding(
                box,
                "interface",
                f"{box} reaches {head.box} over {other.interface} (a container bridge or VPN): "
                "pair the boxes on the addresses of the wire between them for full speed",
                blocking=False,
            )
        )
    return found


def port_closed(box: str, head: str, address: str, port: int, error: str) -> Finding:
    return Finding(
        box,
        "port",
        f"{box} cannot reach the rendezvous port {address}:{port} on {head} ({error}): open "
        f"TCP ports from {box} to {head} on that interface (e.g. `sudo ufw allow from "
        f"{box}'s address`), or pair the boxes on a network without a firewall between them",
    )
