"""The packages form a DAG (ARCHITECTURE.md §2b): nothing imports upward, no two modules import
each other (through any chain), and no module outgrows a file a reader can hold in their head.

Every import counts: module level, inside functions, under `TYPE_CHECKING`, `import streamer.x`
and `from streamer.x import y` alike, and `importlib.import_module("streamer.x")` with a literal
name. A lazy import inside a function still makes the importing module depend on the imported
one; it only hides the cycle from Python's start-up.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Folders of the repository root that hold packages but are not part of `streamer`.
NOT_PACKAGES = {"tests", "bench", "scripts", "build", "dist"}

#: The core: `streamer`'s top-level modules (exceptions, columns, storage, failpoints, ...)
#: and these packages. Every package may import the core; the core imports only itself.
CORE_PACKAGES = {"pipeline"}

#: Which packages each package may import (besides itself). The middle tier is ordered
#: state < savepoint < checkpoint < operators, with connectors beside them: checkpoint's task
#: side writes and restores savepoints, a keyed operator's task takes checkpoints; none of them
#: imports runtime or cli.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "state": {"core"},
    "savepoint": {"state", "core"},
    "checkpoint": {"savepoint", "state", "core"},
    "operators": {"checkpoint", "savepoint", "state", "core"},
    "connectors": {"state", "core"},
    "runtime": {"operators", "connectors", "checkpoint", "savepoint", "state", "core"},
    "cli": {"runtime", "operators", "connectors", "checkpoint", "savepoint", "state", "core"},
    #: Test scaffolding (fault-injecting storage): it may use the core; no package imports it.
    "testing": {"core"},
}

MAX_LINES = 600
#: The runtime sequences epochs; a function longer than this there is two functions.
MAX_RUNTIME_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    found = {"streamer": REPO / "__init__.py"}
    for path in sorted(REPO.glob("*.py")):
        if path.name != "__init__.py":
            found[f"streamer.{path.stem}"] = path
    for init in sorted(REPO.rglob("__init__.py")):
        folder = init.parent.relative_to(REPO)
        if not folder.parts or folder.parts[0] in NOT_PACKAGES \
                or any(part.startswith(".") for part in folder.parts):
            continue
        package = ".".join(("streamer", *folder.parts))
        found[package] = init
        for path in sorted(init.parent.glob("*.py")):
            if path.name != "__init__.py":
                found[f"{package}.{path.stem}"] = path
    return found


MODULES = _modules()


def _imported(name: str, path: Path) -> set[str]:
    """The streamer modules that module `name` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def add(module: str, names: list[str]) -> None:
        if module != "streamer" and not module.startswith("streamer."):
            return
        for item in names:  # `from streamer.state import memory` imports a module
            if f"{module}.{item}" in MODULES:
                targets.add(f"{module}.{item}")
            else:
                targets.add(module)
        if not names:
            targets.add(module)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, [])
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            add(module, [alias.name for alias in node.names])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, [])
    # An import of a module not in the package (a typo, a removed module) is another test's
    # business; here only edges between known modules count.
    return {t for t in targets if t in MODULES and t != name}


GRAPH = {name: _imported(name, path) for name, path in MODULES.items()}


def package_of(module: str) -> str:
    """The package a module belongs to, with the core as one package."""
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and MODULES[module].name != "__init__.py"):
        return "core"
    return "core" if parts[1] in CORE_PACKAGES else parts[1]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
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


def _one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A concrete import cycle through the first module of `component`."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    return component


def test_every_package_has_a_place_in_the_dag() -> None:
    unplaced = sorted({package_of(m) for m in MODULES} - set(ALLOWED))
    assert not unplaced, (f"packages {unplaced} are not in ALLOWED; add them with the packages "
                          "they may import")


def test_no_package_imports_upward() -> None:
    wrong: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, targets in GRAPH.items():
        source = package_of(module)
        for target in targets:
            dest = package_of(target)
            if dest != source and dest not in ALLOWED.get(source, set()):
                wrong[(source, dest)].append(f"{module} -> {target}")
    assert not wrong, "imports against the package DAG (ALLOWED):\n" + "\n".join(
        f"  {source} -> {dest}: {', '.join(sorted(edges))}"
        for (source, dest), edges in sorted(wrong.items()))


def test_no_module_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "modules that import each other (through any chain):\n" + "\n".join(
        f"  {' -> '.join(_one_cycle(GRAPH, c))}  (cycle among {', '.join(c)})" for c in cycles)


def test_no_module_is_over_the_line_limit() -> None:
    long = {}
    for path in MODULES.values():
        rel = path.relative_to(REPO).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            long[rel] = lines
    assert not long, (f"modules over {MAX_LINES} lines (split them where the code has a seam): "
                      + ", ".join(f"{rel} ({n})" for rel, n in sorted(long.items())))


def test_no_runtime_function_is_over_the_line_limit() -> None:
    long = []
    for path in MODULES.values():
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith("runtime/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_RUNTIME_FUNCTION_LINES:
                    long.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, (f"runtime functions over {MAX_RUNTIME_FUNCTION_LINES} lines: "
                      + ", ".join(long))


def test_the_walk_sees_the_graph(tmp_path: Path) -> None:
    """The test itself: it finds the packages and sees imports of every form."""
    assert {"streamer.columns", "streamer.state.snapshot", "streamer.cli.main"} <= set(MODULES)
    assert "streamer.storage" in GRAPH["streamer.state.snapshot"]  # module level
    assert "streamer.failpoints" in GRAPH["streamer.state.snapshot"]  # `from streamer import`
    probe = tmp_path / "probe.py"
    probe.write_text('import importlib\nimportlib.import_module("streamer.storage")\n')
    assert _imported("streamer.probe", probe) == {"streamer.storage"}  # import_module("...")
    assert "streamer.state.memory_backend" in GRAPH["streamer.state"]  # inside a function
    assert package_of("streamer.pipeline.spec") == "core"
    assert package_of("streamer.columns") == "core"
    assert package_of("streamer.runtime.analyze") == "runtime"
    cyclic = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(cyclic) == [["a", "b", "c"]]
    assert _one_cycle(cyclic, ["a", "b", "c"]) == ["a", "b", "c", "a"]
