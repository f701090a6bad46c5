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


def _graph() -> dict:
    mods = _modules()
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for _, target, name in _imports(m, p):
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
    assert steps[:3] == ["$(BIN)/ruff check .", "$(BIN)/ruff format --check .", "$(BIN)/python -m pytest -q $(ARGS)"]
    assert "ruff" in (repo / ".pre-commit-config.yaml").read_text()
    assert (repo / "README.md").stat().st_size < 15_000
