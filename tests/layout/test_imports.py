"""The import arrows point down: the core library imports nothing built on it.

``outbox`` is what a service imports (protocol, producers, SQL listener, admin,
settings, errors, metrics). The checker and the sink build on it, the command
line joins them, and the developer tooling and benchmarks sit on top. An import
from a lower floor to a higher one would drag the sidecar, Spark or the local
runtimes into every service, so these tests read the sources (every import,
also those inside functions) and import the core in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

# Each installed package and the packages it may import. The Alembic scripts (the folder
# migrations/, installed as outbox_migrations) are the SQL listener's schema: one floor
# with the core, which finds them by that unique name; the checker is outbox_checker
# (checker/outbox_checker/).
# The checker's and the sink's command modules use the command line's helpers (outbox_cli),
# and only those (test_only_command_modules_import_the_command_line); outbox_cli reaches
# the commands above it through entry points alone.
MAY_IMPORT: dict[str, set[str]] = {
    "outbox": {"outbox", "outbox_migrations"},
    "outbox_migrations": {"outbox"},
    "outbox_checker": {"outbox_checker", "outbox", "outbox_cli"},
    "spark_sink": {"spark_sink", "outbox", "outbox_cli"},
    "outbox_cli": {"outbox_cli", "outbox"},
}
ABOVE_THE_CORE = ("outbox_checker", "spark_sink", "outbox_cli", "outbox_devtools", "bench", "tests")
PACKAGE_DIRS = {name: REPO / name for name in MAY_IMPORT} | {
    "outbox_migrations": REPO / "migrations" / "outbox_migrations",
    "outbox_checker": REPO / "checker" / "outbox_checker",
    "outbox_devtools": REPO / "devtools" / "outbox_devtools",
    "bench": REPO / "bench",
}


def _module_name(package: str, path: Path) -> str:
    parts = [package, *path.relative_to(PACKAGE_DIRS[package]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The repository modules ``path`` imports, at any depth (lazy imports and those for
    annotations only too).

    ``from package import submodule`` is an import of the submodule; a module's
    own parent packages, which Python initialises first anyway, are left out.
    """
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.rsplit(".", node.level)[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names} & modules
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(target)
    parents = {module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)}
    return (found & modules) - parents - {module}


def _graph() -> dict[str, set[str]]:
    """Module to the repository modules it imports."""
    modules = {
        _module_name(package, path): path
        for package, root in PACKAGE_DIRS.items()
        for path in root.rglob("*.py")
    }
    return {name: _imports(path, name, set(modules)) for name, path in modules.items()}


def test_each_package_imports_only_the_floors_below_it() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if module.split(".")[0] in MAY_IMPORT
        and target.split(".")[0] not in MAY_IMPORT[module.split(".")[0]]
    ]
    assert not wrong, "imports pointing up or sideways:\n" + "\n".join(sorted(wrong))


def test_only_command_modules_import_the_command_line() -> None:
    """The sidecar and the Spark job run without typer: only their ``*cli`` modules use it."""
    wrong = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if module.split(".")[0] in ("outbox_checker", "spark_sink")
        and target.split(".")[0] == "outbox_cli"
        and not module.endswith("cli")
    ]
    assert not wrong, "command-line helpers outside the command modules:\n" + "\n".join(wrong)


def test_no_import_circles() -> None:
    """Annotation-only imports count too: a bench's result types live beside its table."""
    graph = _graph()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize(
    "statement",
    [
        "import outbox",
        "import outbox.sql, outbox.admin, outbox.metrics, outbox.producer, outbox.protocol",
    ],
)
def test_importing_the_core_loads_nothing_above_it(statement: str) -> None:
    """In a fresh interpreter: what a service gets when it imports the library."""
    loaded = _loaded_by(statement)
    above = [name for name in loaded if name.split(".")[0] in ABOVE_THE_CORE]
    assert "outbox" in loaded
    assert not above, f"`{statement}` imported {above}"


def test_the_core_holds_no_command_line() -> None:
    """The commands' modules live in ``outbox_cli``: a service's import of the library
    gets neither typer nor rich."""
    loaded = _loaded_by("import outbox, outbox.sql, outbox.admin, outbox.settings")
    assert not [name for name in loaded if name.split(".")[0] in ("typer", "click", "rich")]


def test_the_command_line_helpers_build_no_command_tree() -> None:
    """The checker's and the sink's commands import ``outbox_cli``'s helpers: importing
    them must not join the installed commands (which would import those modules halfway)."""
    statement = "import outbox_cli.topics, outbox_cli.db, outbox_cli.settings_flags"
    loaded = _loaded_by(statement)
    above = [name for name in loaded if name.split(".")[0] in ABOVE_THE_CORE[:2]]
    assert "outbox_cli.settings_flags" in loaded
    assert not above, f"`{statement}` imported {above}"


def _loaded_by(statement: str) -> list[str]:
    probe = f"{statement}; import json, sys; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "module",
    ["outbox_devtools.kafka", "outbox_devtools.processes", "outbox_devtools.postgres_binaries"],
)
def test_the_local_runtimes_fetch_without_the_sink(module: str) -> None:
    """Maven resolution and the download cache are the core's (``outbox.maven``), below the
    sink and the tooling alike: a local broker or database needs nothing of the sink."""
    reaching = sorted(target for target in _graph()[module] if target.startswith("spark_sink"))
    assert not reaching, f"{module} imports {reaching}"
