"""The layers hold: importing every engines module loads no Qt (the rule in STYLE.md;
import-linter checks the static imports, this checks what really gets loaded), the root helper
loads only its own types, and the import graph has no cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import importlib, pkgutil, sys
import engines
for mod in pkgutil.walk_packages(engines.__path__, "engines."):
    if mod.name.endswith("__main__"):
        continue
    importlib.import_module(mod.name)
qt = sorted(m for m in sys.modules if m.split(".")[0] in ("PySide6", "shiboken6", "qasync", "desktop"))
print(len(sys.modules), qt)
"""


def test_importing_all_of_engines_loads_no_qt() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, check=True, timeout=120
    )
    count, qt = out.stdout.strip().split(" ", 1)
    assert int(count) > 100  # the walk really imported the package
    assert qt == "[]", f"engines pulled in Qt/desktop modules: {qt}"


HELPER_CODE = """
import sys
import engines.gpu.helperd
print(" ".join(sorted(m for m in sys.modules if m.startswith("engines."))))
"""


def test_the_root_helper_loads_only_gpu_event_types() -> None:
    """traylm-gpud runs as root: it loads the GPU event types and the shared codec, and none of
    the other features' types (bench, chat, hub, TensorRT, remote) nor the daemon's parts."""
    out = subprocess.run(
        [sys.executable, "-c", HELPER_CODE], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(out.stdout.split())
    assert {"engines.events.gpu", "engines.events.codec", "engines.gpu.helperd"} <= loaded
    others = {f"engines.events.{m}" for m in ("bench", "chat", "hub", "trt", "remote", "registry")}
    assert not loaded & others, f"traylm-gpud loaded {sorted(loaded & others)}"
    assert not loaded & {"engines.daemon", "engines.runtime.supervisor", "engines.gateway.app"}


def _import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module → the project modules it imports (every import, TYPE_CHECKING ones included)."""
    files = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".")
                    keep = len(parts) - node.level + (1 if is_package else 0)
                    base = ".".join(parts[:keep] + ([base] if base else []))
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_graph_of_engines_and_desktop_has_no_cycle() -> None:
    """Each part is built by the daemon and imports only what lies below it, so no chain of
    imports (TYPE_CHECKING ones included) leads back to where it started."""
    graph = _import_graph(ROOT, ("engines", "desktop"))
    assert len(graph) > 150  # the walk found the packages
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
