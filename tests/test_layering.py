"""The packages form a DAG (docs/architecture.md, "Layout"): nothing imports upward, not
between the top-level packages nor between the subpackages of runtime/ and connectors/; no two
modules import each other (through any chain); no module outgrows a file a reader can hold in
their head, imports a private `_name` of another, or shares its file name with another.

Every import counts: module level, inside functions, under `TYPE_CHECKING`, `import streamer.x`
and `from streamer.x import y` alike, and `importlib.import_module("streamer.x")` with a literal
name. A lazy import inside a function still makes the importing module depend on the imported
one; it only hides the cycle from Python's start-up.
"""

from __future__ import annotations

import ast
import re
import tomllib
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
#: imports runtime or cli. The exchange of continuous execution stands on the core alone.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "state": {"core"},
    "savepoint": {"state", "core"},
    "checkpoint": {"savepoint", "state", "core"},
    "operators": {"exchange", "checkpoint", "savepoint", "state", "core"},
    "connectors": {"state", "core"},
    "runtime": {"operators", "connectors", "exchange", "checkpoint", "savepoint", "state",
                "core"},
    "cli": {"runtime", "operators", "connectors", "exchange", "checkpoint", "savepoint", "state",
            "core"},
    #: Continuous execution's exchange between tasks and barrier alignment (issue 36): the
    #: keyed subtasks (operators, in Spark tasks) and the driver (runtime) both use it.
    "exchange": {"core"},
    #: Test scaffolding (fault-injecting storage, the operator harness that runs a keyed
    #: operator's subtasks without Spark): everything below runtime; no package imports it.
    "testing": {"operators", "exchange", "checkpoint", "savepoint", "state", "core"},
}

#: Inside runtime/ and connectors/: which units may import which (besides themselves; what
#: the package may import at all is ALLOWED's). A unit is a subpackage, or the modules at the
#: package's own level. runtime/: the job lifecycle (coordinator, epoch, checkpoints, recovery,
#: savepoints, control, preflight, `streamer test`) on top; where a job runs (cluster) and
#: what it reports (observe) beside it; the planner, the keyed stage's Spark plan and the
#: stages below. connectors/: the contracts and the helpers several connectors share at the
#: bottom, one package per connector, the registry of `type:`s on top.
INNER: dict[str, set[str]] = {
    "runtime.observe": set(),
    #: The Arrow path (expressions compiled to Arrow, the tasks that decode a stage's input):
    #: below the planner and its stages, which plan it.
    "runtime.arrow": set(),
    "runtime": set(),
    #: The physical planner, the stages it builds and the keyed stage's Spark plan.
    "runtime.plan": {"runtime", "runtime.arrow"},
    "runtime.cluster": {"runtime"},
    #: The continuous mode's source subtasks, which the job's gang runs.
    "runtime.continuous": {"runtime", "runtime.arrow", "runtime.plan"},
    "runtime.job": {"runtime", "runtime.arrow", "runtime.cluster", "runtime.continuous",
                    "runtime.observe", "runtime.plan"},
    "connectors": set(),
    "connectors.arrow": set(),
    "connectors.builtin": {"connectors"},
    "connectors.delta": {"connectors"},
    "connectors.postgres": {"connectors"},
    "connectors.files": {"connectors", "connectors.arrow"},
    # The exactly-once Kafka sink's keyed tasks stage records as the files sink's do
    # (`files_sink.TaskTarget`), and a raw Kafka value is parsed with a files schema.
    "connectors.kafka": {"connectors", "connectors.arrow", "connectors.files"},
    "connectors.registry": {"connectors", "connectors.builtin", "connectors.delta",
                            "connectors.files", "connectors.kafka", "connectors.postgres"},
}
#: Units that are one: the planner (runtime/plan/physical.py) builds the stages and a keyed
#: stage calls the keyed plan (runtime/plan/keyed_plan.py, local.py, join_plan.py), so the
#: stages are one unit with the rest of runtime/plan/.
MERGED_UNITS = {"runtime.plan.stages": "runtime.plan"}
#: Modules that are a unit of their own at their package's level.
OWN_UNITS = {"streamer.connectors.registry": "connectors.registry"}

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


def unit_of(module: str) -> str:
    """The unit of runtime/ or connectors/ a module belongs to (INNER), else its package."""
    package = package_of(module)
    if module in OWN_UNITS:
        return OWN_UNITS[module]
    parts = module.split(".")
    if package not in {unit.split(".")[0] for unit in INNER} or len(parts) < 3 or (
            len(parts) == 3 and MODULES[module].name != "__init__.py"):
        return package
    unit = f"{package}.{parts[2]}"
    return MERGED_UNITS.get(unit, unit)


def private_imports(name: str, path: Path) -> set[tuple[str, str]]:
    """The (module, name) pairs of private names of other streamer modules that module `name`
    uses: `from streamer.x import _y`, and `x._y` where `x` is a streamer module it imported."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found: set[tuple[str, str]] = set()
    modules: dict[str, str] = {}  # local name -> streamer module
    private = re.compile(r"_(?!_)\w*")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            if module != "streamer" and not module.startswith("streamer."):
                continue
            for alias in node.names:
                if f"{module}.{alias.name}" in MODULES:
                    modules[alias.asname or alias.name] = f"{module}.{alias.name}"
                elif private.fullmatch(alias.name) and module != name:
                    found.add((module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and private.fullmatch(node.attr)
                and modules[node.value.id] != name):
            found.add((modules[node.value.id], node.attr))
    return found


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


def test_every_unit_of_runtime_and_connectors_has_a_place_in_the_dag() -> None:
    units = {unit_of(m) for m in MODULES if package_of(m) in {"runtime", "connectors"}}
    assert sorted(units - set(INNER)) == [], "add these subpackages to INNER"


def test_no_unit_of_runtime_or_connectors_imports_upward() -> None:
    wrong: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, targets in GRAPH.items():
        source = unit_of(module)
        if source not in INNER:
            continue
        for target in targets:
            dest = unit_of(target)
            same_package = dest.split(".")[0] == source.split(".")[0]
            if dest != source and same_package and dest not in INNER[source]:
                wrong[(source, dest)].append(f"{module} -> {target}")
    assert not wrong, "imports against the subpackage DAG (INNER):\n" + "\n".join(
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


#: Private names still imported across modules (none left).
PRIVATE_IMPORTS_LEFT: dict[str, set[str]] = {}


def test_no_module_uses_a_private_name_of_another() -> None:
    """A `_name` is its module's business. A module that needs another's makes it public in
    the module named for its concept (state/memory_values.py, cli/output.py)."""
    found = defaultdict(list)
    for module, path in MODULES.items():
        for owner, attr in sorted(private_imports(module, path)):
            if owner not in PRIVATE_IMPORTS_LEFT.get(module, set()):
                found[module].append(f"{owner}.{attr}")
    assert not found, "private names used across modules:\n" + "\n".join(
        f"  {module}: {', '.join(names)}" for module, names in sorted(found.items()))


#: File names every package may have its own of: the package, its contract, its errors.
SHARED_FILE_NAMES = {"__init__.py", "base.py", "exceptions.py"}
#: Names still shared (none left).
SHARED_NAMES_LEFT: dict[str, set[str]] = {}


def test_no_two_modules_share_a_file_name() -> None:
    """Three modules named keyed.py read as `stage.stage.kind`; a name says which one."""
    by_name: dict[str, set[str]] = defaultdict(set)
    for path in MODULES.values():
        by_name[path.name].add(path.relative_to(REPO).as_posix())
    shared = {name: paths for name, paths in by_name.items()
              if len(paths) > 1 and name not in SHARED_FILE_NAMES
              and paths != SHARED_NAMES_LEFT.get(name)}
    assert not shared, "modules that share a file name: " + "; ".join(
        f"{name} ({', '.join(sorted(paths))})" for name, paths in sorted(shared.items()))


def test_every_package_is_installed() -> None:
    """pyproject.toml lists the packages a wheel holds; a subpackage missing there works in
    the editable install and is absent from a built one."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    packages = {m for m, path in MODULES.items() if path.name == "__init__.py"}
    assert sorted(packages - listed) == [] and sorted(listed - packages) == []


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
    assert unit_of("streamer.runtime.job.coordinator") == "runtime.job"
    assert unit_of("streamer.runtime.plan.stages.keyed_stage") == "runtime.plan"  # MERGED_UNITS
    assert unit_of("streamer.runtime.plan.physical") == "runtime.plan"
    assert unit_of("streamer.runtime.watermarks") == "runtime"
    assert unit_of("streamer.connectors.registry") == "connectors.registry"
    assert unit_of("streamer.connectors.files") == "connectors.files"
    assert unit_of("streamer.state.memory_files") == "state"


def test_private_imports_sees_both_forms(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("from streamer.state.memory_files import _read_record, load\n"
                    "from streamer.state import rocksdb_parking as parking\n"
                    "import streamer.state.memory_files as files\n"
                    "def f():\n"
                    "    return parking._PARKED, files._PROCESS_CACHE, parking.parked_paths\n")
    assert private_imports("streamer.state.x", path) == {
        ("streamer.state.memory_files", "_read_record"),
        ("streamer.state.rocksdb_parking", "_PARKED"),
        ("streamer.state.memory_files", "_PROCESS_CACHE")}


def test_runtime_declares_what_it_asks_and_ignores_no_type() -> None:
    """The runtime asks sources, sinks, stages and keyed kinds what they declare
    (`Source.task_reads`, `WritesTaskFiles`, `Stage.node_ids`, `KeyedKind.capabilities`):
    no `getattr(x, "name")` probe of a capability, and no `type: ignore`."""
    probe = re.compile(r"getattr\([^,()]+,\s*['\"]")
    found = []
    for path in sorted((REPO / "runtime").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in line or probe.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
