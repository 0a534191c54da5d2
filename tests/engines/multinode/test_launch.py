"""The launch form of one model across boxes: the profile field `boxes`, vLLM 0.32's
multi-node flags per rank (checked against the shipped 0.32 allow-list), the network
environment, and the entry that honours --headless."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from engines.config.profiles import Profile, profile_from_mapping
from engines.envs.manager import load_flags
from engines.errors import ConfigError
from engines.multinode.launch import RankPlan, has_rdma, rank_profile
from engines.runtime.adapters.base import EngineRuntime
from engines.runtime.adapters.vllm import VLLMAdapter

PLAN = RankPlan(
    nnodes=2, node_rank=0, master_addr="10.0.0.1", master_port=29511, interface="enp5s0",
    host_ip="10.0.0.1",
)  # fmt: skip


def runtime(device: str) -> EngineRuntime:
    flags = load_flags("vllm", "0.32.0")
    return EngineRuntime("vllm", Version("0.32.0"), Path("/e/bin/python"), Path("/e/bin"),
                         device, flags)  # fmt: skip


def across(**fields: object) -> Profile:
    data = {"model": "/m/tiny", "device": "cpu", "boxes": ["box-b"], "pipeline_parallel_size": 2}
    return profile_from_mapping("big", {**data, **fields})


def argv(profile: Profile, plan: RankPlan, device: str = "cpu") -> list[str]:
    spec = VLLMAdapter().launch(
        rank_profile(profile, plan), runtime=runtime(device), port=5, model="/m/tiny"
    )
    return list(spec.argv)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_head_rank_serves_through_the_cli_entry_with_every_multinode_flag() -> None:
    args = argv(across(), PLAN)
    assert "run_module('vllm.entrypoints.cli.main'" in args[2]  # 0.32: only `serve` is headless
    assert args[3:5] == ["serve", "/m/tiny"]
    assert (flag(args, "--nnodes"), flag(args, "--node-rank")) == ("2", "0")
    assert (flag(args, "--master-addr"), flag(args, "--master-port")) == ("10.0.0.1", "29511")
    assert flag(args, "--pipeline-parallel-size") == "2"  # on the CPU build too
    assert flag(args, "--distributed-executor-backend") == "mp"  # not the in-process worker
    assert "--headless" not in args
    assert flag(args, "--host") == "127.0.0.1"  # the API stays on loopback, behind :8000


def test_a_follower_rank_is_headless_and_its_network_is_the_paired_interface() -> None:
    plan = RankPlan(2, 1, "10.0.0.1", 29511, "enp5s0", "10.0.0.2", rdma=False)
    profile = rank_profile(across(), plan)
    args = argv(across(), plan)
    assert "--headless" in args and flag(args, "--node-rank") == "1"
    assert profile.env["GLOO_SOCKET_IFNAME"] == profile.env["NCCL_SOCKET_IFNAME"] == "enp5s0"
    assert profile.env["VLLM_HOST_IP"] == "10.0.0.2"
    assert profile.env["NCCL_IB_DISABLE"] == "1"
    with_rdma = rank_profile(across(), RankPlan(2, 1, "10.0.0.1", 1, "ib0", "10.0.0.2", rdma=True))
    assert "NCCL_IB_DISABLE" not in with_rdma.env


def test_on_gpus_tensor_parallel_stays_inside_the_box() -> None:
    profile = across(device="cuda", tensor_parallel_size=2, gpus=[0, 1])
    args = argv(profile, PLAN, device="cuda")
    assert flag(args, "--tensor-parallel-size") == "2"
    assert flag(args, "--pipeline-parallel-size") == "2"
    assert profile.local_world_size == 2 and profile.world_size == 4


def test_a_profile_that_sets_the_flags_itself_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="remove --nnodes=3 from extra_flags"):
        rank_profile(across(extra_flags=["--nnodes=3"]), PLAN)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pipeline_parallel_size": 1}, "set pipeline_parallel_size = 2"),
        ({"boxes": ["box-b", "box-b"], "pipeline_parallel_size": 3}, "names a box twice"),
        ({"boxes": ["no/such"]}, "is not a box name"),
        ({"engine": "sglang"}, "for engine = 'vllm' only"),
    ],
)
def test_bad_boxes_fields_say_what_to_set(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        across(**fields)


def test_rdma_is_seen_from_sysfs(tmp_path: Path) -> None:
    assert not has_rdma(tmp_path / "none")
    assert not has_rdma(tmp_path)
    (tmp_path / "mlx5_0").mkdir()
    assert has_rdma(tmp_path)
