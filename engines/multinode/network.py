"""The network between the boxes of a model across boxes: the interface this box reaches a
paired box on, the rendezvous port, and what a measured link means for tokens per second."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from dataclasses import dataclass

import psutil

from engines.errors import PeerError

VIRTUAL_PREFIXES = ("docker", "br-", "virbr", "lxcbr", "tailscale", "wg", "zt")
"""Interfaces that are usually not the wire between two boxes (containers, VPNs)."""
LINK_PROBE_PORT = 9  # discard: a UDP connect() sends nothing, it only asks the routing table


@dataclass(frozen=True)
class Route:
    """How this box reaches another: the interface and this box's address on it."""

    interface: str
    address: str


def virtual(interface: str) -> bool:
    return interface.startswith(VIRTUAL_PREFIXES)


def host_of(address: str) -> str:
    """``host:port`` or ``[v6]:port`` → host."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or "]" in address else address
    return host.strip("[]")


def route_to(host: str, box: str) -> Route:
    """The interface and source address the kernel uses towards ``host`` (a UDP connect sends
    no packet). PeerError names ``box`` and the fix when there is none."""
    try:
        infos = socket.getaddrinfo(host, LINK_PROBE_PORT, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            address = str(s.getsockname()[0])
    except OSError as exc:
        raise PeerError(
            f"this box has no route to box {box!r} at {host} ({exc.strerror or exc}): connect "
            "the two boxes on one network (a cable or switch between them), then pair them on "
            "that network's addresses"
        ) from None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%", 1)[0] == address for a in addrs):
            return Route(name, address)
    raise PeerError(f"the address {address} this box uses towards box {box!r} is on no interface")


def loopback(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address).is_loopback
    return False


def free_port_on(address: str) -> int:
    """A TCP port free on ``address`` now (the rendezvous port vLLM's head rank binds)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LinkMeaning:
    """What a measured link between two pipeline stages allows."""

    bytes_per_token: int  # activations one token carries across a stage boundary
    prefill_tokens_per_s: float  # the most the link can carry while prompts are read
    decode_tokens_per_s: float  # one stream's ceiling: a round trip per generated token
    text: str


def link_meaning(
    *, box: str, bandwidth_bytes_s: float, rtt_s: float, hidden_size: int, dtype_bytes: int
) -> LinkMeaning:
    """Pipeline parallel sends each token's hidden state and residual (2 × hidden × dtype
    bytes) to the next stage, and the sampled token comes back: the bandwidth caps prefill,
    the round trip caps each stream's decode."""
    per_token = 2 * hidden_size * dtype_bytes
    prefill = bandwidth_bytes_s / per_token if per_token else 0.0
    decode = 1.0 / rtt_s if rtt_s > 0 else float("inf")
    mbit = bandwidth_bytes_s * 8 / 1e6
    text = (
        f"link to box {box!r}: {mbit:,.0f} Mbit/s measured, {rtt_s * 1000:.1f} ms round trip. "
        f"A token crosses it as {_size(per_token)} (hidden {hidden_size}), so prompts "
        f"pass at most {prefill:,.0f} tokens/s, and one stream's decode waits a round trip a "
        f"token (at most {decode:,.0f} tokens/s)"
    )
    if mbit < 1000:
        text += (
            "; below 1 Gbit/s long prompts will wait on the network: use a wired link "
            "(10 GbE or faster for big models), not Wi-Fi or a VPN"
        )
    return LinkMeaning(per_token, prefill, decode, text)


def _size(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"
