"""Every path the control-API client calls exists in the daemon's router, with its method: read
from the client's source (each ``_call`` and stream it makes, with its path template), resolved
by the daemon's own aiohttp router. A route renamed on one side only fails here, not in the
desktop app a week later."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

import engines.client
from engines.client import DaemonClient, DaemonInfo
from engines.config.sections import Paths
from engines.core.procs import free_loopback_port
from engines.daemon import Daemon
from engines.errors import DaemonUnavailable
from tests.conftest import fast_settings

NAME = "x"  # what each name in a path template stands for here


def _template(expr: ast.expr, assigned: dict[str, ast.expr]) -> str | None:
    """The path an expression builds, with every name as NAME (None: not a path we can read)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Name) and expr.id in assigned:
        return _template(assigned[expr.id], assigned)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = _template(expr.left, assigned), _template(expr.right, assigned)
        return None if left is None or right is None else left + right
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        first = _template(expr.args[0], assigned) if expr.args else None
        if expr.func.id in ("api_path", "named_path") and first is not None:
            return first.replace("{}", NAME)
        if expr.func.id == "_repo_path":
            tail = _template(expr.args[1], assigned) if len(expr.args) > 1 else ""
            return None if tail is None else f"/api/models/{NAME}/{NAME}{tail}"
    return None


def client_calls() -> list[tuple[str, str, int]]:
    """(method, path, line) of every request in the source of engines.client's modules (one
    per feature)."""
    folder = Path(inspect.getfile(engines.client)).parent
    trees = [ast.parse(module.read_text()) for module in sorted(folder.glob("*.py"))]
    calls = []
    for func in (node for tree in trees for node in ast.walk(tree)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) or func.name == "_text":
            continue  # _text GETs the path it is given: its callers are read below
        assigned = {
            t.id: node.value
            for node in ast.walk(func)
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(func):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            attr, owner = node.func.attr, node.func.value
            if attr == "_text" and node.args:  # a GET answered with a page
                path = _template(node.args[0], assigned)
                assert path is not None, f"line {node.lineno}: a path this test cannot read"
                calls.append(("GET", path, node.lineno))
            elif attr == "_call" and len(node.args) >= 2:
                method = node.args[0]
                assert isinstance(method, ast.Constant), f"line {node.lineno}: method not a literal"
                path = _template(node.args[1], assigned)
                assert path is not None, f"line {node.lineno}: a path this test cannot read"
                calls.append((str(method.value), path, node.lineno))
            elif (
                attr in ("get", "post")
                and isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Attribute)
                and owner.func.attr == "_http"
            ):
                path = _template(node.args[0], assigned)
                assert path is not None, f"line {node.lineno}: a path this test cannot read"
                calls.append((attr.upper(), path, node.lineno))
    return calls


async def test_every_path_the_client_calls_is_a_route_of_the_daemon(tmp_path: Path) -> None:
    calls = client_calls()
    assert len(calls) > 60  # the reading found the client's calls
    paths = Paths.from_env({"TRAYLM_HOME": str(tmp_path)})
    app = Daemon(paths, fast_settings(8000))._app()
    missing = []
    for method, path, line in calls:
        match = await app.router.resolve(make_mocked_request(method, path, app=app))
        if match.http_exception is not None:
            missing.append(f"{method} {path} (client line {line}): {match.http_exception.status}")
    assert not missing, "the client calls routes the daemon does not have:\n" + "\n".join(missing)


async def test_a_closed_client_refuses_calls_and_opens_no_session() -> None:
    """A task that outlives the client's owner (the desktop link's refreshes) gets a clear
    refusal instead of a new aiohttp session that nobody closes (it surfaced as an unclosed
    session warning in whichever test ran when it was collected)."""
    info = DaemonInfo(
        pid=0, url=f"http://127.0.0.1:{free_loopback_port()}", port=0, token="t", version="x",
        started_at_s=0.0,
    )  # fmt: skip
    client = DaemonClient(info)
    await client.close()
    with pytest.raises(DaemonUnavailable, match="closed"):
        await client.status()
    assert client._session is None
