"""The package's layout rules: no module over 500 lines, no name with a leading underscore
imported from another module, no import cycle between our modules (in-function imports included)."""

import ast
from pathlib import Path

import w2s_shift

ROOT = Path(w2s_shift.__file__).parent
MAX_LINES = 500


def _modules() -> dict:
    """{dotted module name: path} of every module of the package."""
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(mod: str, path: Path) -> list:
    """[(line, imported module, imported name or None)] of every import of our package in ``path``, at any depth
    (a relative import resolved against ``mod``)."""
    tree = ast.parse(path.read_text())
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.split(".")[0] == ROOT.name:
                out += [(node.lineno, target, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == ROOT.name]
    return out


def _graph(version_apart: bool = False) -> dict:
    """{module: modules it imports}; ``version_apart``: ``from w2s_shift import __version__`` is an import of a
    module of its own (the version string, at the bottom of the layers), not of the package's API."""
    mods = _modules()
    if version_apart:
        mods = {**mods, f"{ROOT.name}.__version__": None}
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for _, target, name in _imports(m, p) if p else []:
            dep = f"{target}.{name}" if name and f"{target}.{name}" in mods else target
            if dep in mods and dep != m:
                graph[m].add(dep)
    return graph


def _cycles(graph: dict) -> list:
    """Cycles of the import graph, ignoring a package and its own submodules (``pkg/__init__`` re-exporting)."""
    related = lambda a, b: a.startswith(b + ".") or b.startswith(a + ".")  # noqa: E731
    found, color, stack = [], {}, []

    def visit(u):
        color[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if color.get(v) == 1:
                cyc = [*stack[stack.index(v) :], v]
                if not all(related(x, cyc[0]) or x == cyc[0] for x in cyc):
                    found.append(" -> ".join(cyc))
            elif v not in color:
                visit(v)
        stack.pop()
        color[u] = 2

    for m in sorted(graph):
        if m not in color:
            visit(m)
    return found


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py") if (n := p.read_text().count("\n")) > MAX_LINES
    }
    assert long == {}


def test_no_private_name_is_imported_from_another_module():
    mods = _modules()
    bad = [
        f"{mods[m].relative_to(ROOT.parent)}:{line}: {target}.{name}"
        for m, p in mods.items()
        for line, target, name in _imports(m, p)
        if name
        and name.startswith("_")
        and not name.startswith("__")
        and target != m
        and f"{target}.{name}" not in mods
    ]
    assert bad == []


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_the_checks_see_a_cycle_and_a_private_import():
    """The checker itself: a made-up graph with a cycle is caught, a package importing its submodule is not."""
    assert _cycles({"a.x": {"a.y"}, "a.y": {"a.x"}}) == ["a.x -> a.y -> a.x"]
    assert _cycles({"a": {"a.b"}, "a.b": {"a"}}) == []
    assert ("w2s_shift.pipeline" in _modules()) and ("w2s_shift.methods" in _modules())


def test_the_habits_lint_first_and_a_short_readme():
    """`make test` runs ruff (lint and format check) before pytest, a pre-commit config runs ruff,
    and the README stays under 15 KB (dated measurements live in docs/ and benchmarks/)."""
    repo = ROOT.parent
    test_rule = (repo / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    steps = [line.strip() for line in test_rule.splitlines()[1:] if line.strip()]
    assert steps[:3] == [
        "$(BIN)/ruff check .",
        "$(BIN)/ruff format --check .",
        "$(BIN)/python -m pytest -q -n auto --maxprocesses 4 $(ARGS)",
    ]
    assert "ruff" in (repo / ".pre-commit-config.yaml").read_text()
    assert (repo / "README.md").stat().st_size < 15_000


#: The layers of the package, lowest first: a module may import from its own layer and the layers below, never
#: from one above (in-function imports included). A new module or package needs a place here.
LAYERS = [
    ("__version__", "io", "progress", "device", "batching"),  # the version; files, progress bars, the device
    ("data", "losses"),  # preference pairs, their formats and rendering; the pure losses
    ("models",),  # loading, splitting and exporting reward models
    ("inference", "distributed"),  # forwards over token sequences, on one process or several
    ("metrics",),  # accuracy, intervals, drift, claims: the science's statistics
    ("methods", "training", "tracking"),  # the student methods and the trainer that runs their hooks
    ("config", "config_io", "configs", "versions"),  # the run's schema (methods' settings included), presets, versions
    ("results", "runlock"),  # a finished run read in one place; the run directory's lock
    ("report", "plan", "power"),  # rendering results; planning runs from configs and pilot results
    ("pipeline", "score", "score_model"),  # orchestration: grid, evaluate, export; scoring with exports
    ("api", "commands", "cli", "__init__", "__main__"),  # the entry points: what each command does, its parser
]


def _unit(mod: str) -> str:
    """The layer unit of a module: its top-level module or package under w2s_shift."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _upward(graph: dict, layers: list) -> list:
    rank = {u: i for i, units in enumerate(layers) for u in units}
    bad = []
    for m, deps in sorted(graph.items()):
        for d in sorted(deps):
            a, b = _unit(m), _unit(d)
            if a != b and rank[b] > rank[a]:
                bad.append(f"{m} -> {d} ({a}: layer {rank[a]}, {b}: layer {rank[b]})")
    return bad


def test_imports_run_from_higher_layers_to_lower_ones_only():
    graph = _graph(version_apart=True)
    units = {_unit(m) for m in graph}
    placed = {u for layer in LAYERS for u in layer}
    assert units <= placed, f"modules without a layer: {sorted(units - placed)}"
    assert _upward(graph, LAYERS) == []
    # the check can fail: a data module importing the config is an upward import
    assert _upward({"w2s_shift.data.resolve": {"w2s_shift.config"}, "w2s_shift.config": set()}, LAYERS) == [
        "w2s_shift.data.resolve -> w2s_shift.config (data: layer 1, config: layer 6)"
    ]
