"""Guards that keep the package layout as docs/architecture.md draws it.

- Packages import only the packages below them (``LAYERS``): the record format, storage and the wire
  formats at the bottom, the sans-IO cores above them, the server and the client beside each other, the CLI on top.
- No import circle between modules, counting imports inside functions and under TYPE_CHECKING:
  a circle hidden from the interpreter is still two modules that cannot be read apart.
- No function longer than 80 lines outside generated code, but for the listed ones.

Each list of exceptions names why; an exception that is no longer needed fails the test too, so
the lists only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "liftlog"

#: What each package may import, besides itself. ``(root)`` is ``units``, ``histogram`` and ``jsontypes``.
BASE = {"(root)"}
WIRE = BASE | {"recordformat", "storage", "api"}
LAYERS: dict[str, set[str]] = {
    "(root)": set(),
    "recordformat": BASE,
    "storage": BASE | {"recordformat"},
    "api": BASE | {"recordformat", "storage"},
    "raft": BASE,
    "rpc": BASE,
    "natswire": BASE,
    "security": BASE | {"storage"},
    "metadata": WIRE,
    "replication": WIRE | {"metadata"},
    "server": WIRE | {"raft", "rpc", "natswire", "security", "metadata", "replication"},
    "client": WIRE | {"rpc"},
    "spark": WIRE | {"client"},
    "pipeline": WIRE | {"client", "spark"},
    "cli": WIRE | {"client", "spark", "pipeline", "security", "server", "metadata", "rpc"},
}

#: The server's subpackages, and what each may import besides itself and the shared modules beside them
#: (``SERVER_SHARED``); ``server.server`` and ``server.runner``, the composition root, may import them all.
SERVER_LAYERS: dict[str, set[str]] = {
    "nats": set(),
    "partitions": {"nats"},
    "control": {"partitions", "nats"},
    "ops": {"control", "partitions", "nats"},
    "api": {"ops", "control", "partitions", "nats"},
}
SERVER_SHARED = {"config", "config_reference", "errors", "changes", "clock", "ratelimit", "throttle", "rlimits", "spin"}
SERVER_ROOT = {"server", "runner"}

#: Import circles not yet broken: each is a set of modules, with the reason it still stands.
KNOWN_CIRCLES: dict[frozenset[str], str] = {
    frozenset({"client.client", "client.consumer", "client.merged", "client.subscription"}): (
        "consumers and subscriptions are typed against the Client that makes them"
    ),
}

#: Functions over 80 lines, with their length today (they may shrink, not grow) and why.
LONG_FUNCTIONS: dict[str, tuple[int, str]] = {
    "cli/bench.py:bench": (202, "one click command whose options fan out to every scenario"),
    "metadata/model.py:Metadata.apply": (177, "one match over the replicated operations, case by case"),
    "spark/writing.py:write_batches": (122, "to split: grouping, encoding and publishing in one loop"),
    "spark/writing.py:_plain_groups": (86, "to split with write_batches"),
    "server/config.py:load_config": (103, "the sources in order (file, env, flags), then checks across keys"),
    "pipeline/runner.py:Pipeline.run": (112, "to split into the job's phases"),
    "pipeline/generator.py:publish_events": (111, "to split: pacing, publishing and progress in one loop"),
    "cli/bench_cluster.py:_failover": (111, "one scenario's script, step by step"),
    "client/batches.py:_decode_records": (99, "per-record hot loop, inlined on purpose (docs/performance.md)"),
    "server/partitions/messages.py:encode_messages": (
        84,
        "per-record hot loop, inlined on purpose (docs/performance.md)",
    ),
    "server/partitions/partition.py:Partition.append": (83, "intake, duplicate screening, admission, writing and acks"),
    "server/partitions/partition.py:Partition.__init__": (89, "wiring of a partition's collaborators"),
    "cli/encryption.py:rewrap": (89, "one command's steps with their progress display"),
    "rpc/connection.py:Connection._receive": (88, "the HTTP/2 frame loop, one branch per frame type"),
    "client/client.py:Client.publish_many": (86, "batching, pipelining and retries of one call"),
}


@dataclass(frozen=True)
class Module:
    name: str  # relative to liftlog, e.g. "server.streams"
    path: Path
    package: bool


def modules() -> dict[str, Module]:
    found = {}
    for path in SRC.rglob("*.py"):
        if "_gen" in path.parts:
            continue
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        name = ".".join(parts) or "(root)"
        found[name] = Module(name, path, package)
    return found


def imports(module: Module, known: dict[str, Module]) -> Iterator[str]:
    """The liftlog modules ``module`` imports anywhere in its body, as names relative to liftlog."""
    for node in ast.walk(ast.parse(module.path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.name.split(".") if module.name != "(root)" else []
                if not module.package:
                    base = base[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(["liftlog", *base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names] + [source]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            if target != "liftlog" and not target.startswith("liftlog."):
                continue
            name = target.removeprefix("liftlog").removeprefix(".")
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module.name:
                yield name
                break


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports(module, known)) for name, module in known.items()}


def package_of(module: str) -> str:
    first = module.split(".")[0]
    return "(root)" if first in ("units", "histogram", "jsontypes", "(root)") else first


def test_packages_import_only_the_layers_below_them() -> None:
    upward = []
    for module, targets in graph().items():
        if module.endswith("__main__"):
            continue  # entry points (python -m liftlog.pipeline) stand above everything
        own = package_of(module)
        assert own in LAYERS, f"package {own} has no place in LAYERS"
        upward += [f"{module} -> {t}" for t in sorted(targets) if package_of(t) not in LAYERS[own] | {own}]
    assert upward == [], "imports against the layering:\n" + "\n".join(upward)


def server_part(module: str) -> str | None:
    """``api`` for ``server.api.publisher``, the module's own name for the server's top-level modules."""
    parts = module.split(".")
    return parts[1] if parts[0] == "server" and len(parts) > 1 else None


def test_the_servers_subpackages_import_only_the_layers_below_them() -> None:
    top = {p.stem for p in (SRC / "server").glob("*.py")} - {"__init__"}
    subpackages = {p.name for p in (SRC / "server").iterdir() if (p / "__init__.py").exists()}
    assert subpackages == SERVER_LAYERS.keys(), "every subpackage has its place in SERVER_LAYERS"
    assert top == SERVER_SHARED | SERVER_ROOT, "every top-level server module is shared or the composition root"
    upward = []
    for module, targets in graph().items():
        own = server_part(module)
        if own is None or own in SERVER_ROOT:
            continue
        allowed = SERVER_LAYERS.get(own, set()) | {own} | SERVER_SHARED
        for target in sorted(targets):
            other = server_part(target)
            if other is not None and other not in allowed:
                upward.append(f"{module} -> {target}")
    assert upward == [], "imports against the server's layering:\n" + "\n".join(upward)


def test_each_server_subpackage_says_what_lives_there_and_what_it_may_import() -> None:
    for name in SERVER_LAYERS:
        doc = ast.get_docstring(ast.parse((SRC / "server" / name / "__init__.py").read_text())) or ""
        assert "May import:" in doc, f"server/{name}/__init__.py: its docstring names what it may import"


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == [frozenset({"a", "b", "c"})]


def test_no_module_imports_itself_back() -> None:
    found = set(circles(graph()))
    new = [sorted(c) for c in found - KNOWN_CIRCLES.keys()]
    assert new == [], f"import circles: {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES.keys() - found]
    assert gone == [], f"broken since, remove from KNOWN_CIRCLES: {gone}"


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            yield prefix + node.name, node.end_lineno - node.lineno + 1
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")


def test_no_function_is_longer_than_80_lines() -> None:
    long = {}
    for module in modules().values():
        rel = module.path.relative_to(SRC).as_posix()
        for name, length in functions(ast.parse(module.path.read_text())):
            if length > 80:
                long[f"{rel}:{name}"] = length
    grown = {name: n for name, n in long.items() if n > LONG_FUNCTIONS.get(name, (80, ""))[0]}
    assert grown == {}, f"functions over 80 lines (or longer than their listed length): {grown}"
    gone = sorted(LONG_FUNCTIONS.keys() - long.keys())
    assert gone == [], f"no longer over 80 lines, remove from LONG_FUNCTIONS: {gone}"
