"""The library's wheel carries the library and its commands, not the developer tooling.

A service installs ``kafka-outbox`` from its wheel: the core, the checker, the
sink, the migrations and the command line that joins them. The local runtimes,
the demo, the chaos proof, the benchmarks and the tests live in the repository
(``devtools/`` is a distribution of its own) and must not ride along by accident.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).parents[2]
# Installed name: the repository folder it comes from, named as it is imported.
SHIPPED = {
    "outbox": "outbox",
    "outbox_cli": "outbox_cli",
    "outbox_checker": "checker/outbox_checker",
    "spark_sink": "spark_sink",
    "outbox_migrations": "migrations/outbox_migrations",
}
NOT_SHIPPED = (
    "outbox_devtools",
    "devtools",
    "bench",
    "tests",
    "examples",
    "migrations",
    "checker",
)
# What only the tooling defines: the local runtimes and the chaos schedule.
TOOLING_DEFINITIONS = ("class LocalKafka", "class LocalPostgres", "def fault_plan")
_LEFT_BEHIND = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", ".*_cache", "results"
)


def _build_wheel(tmp_path: Path) -> Path:
    """``pip wheel`` of a copy of the source tree, with the build backend already installed."""
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=_LEFT_BEHIND)
    out = tmp_path / "wheel"
    built = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--wheel-dir", str(out), str(source)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("kafka_outbox-*.whl")
    return wheel


def test_the_wheel_holds_the_library_and_no_tooling(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        declared = archive.read(entry_points).decode()
        sources = {n: archive.read(n).decode() for n in names if n.endswith(".py")}
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert set(SHIPPED) <= top, f"missing from the wheel: {set(SHIPPED) - top}"
    assert not top & set(NOT_SHIPPED), f"in the wheel by mistake: {top & set(NOT_SHIPPED)}"
    carrying = [
        f"{name}: {definition}"
        for name, text in sources.items()
        for definition in TOOLING_DEFINITIONS
        if definition in text
    ]
    assert not carrying, f"tooling code in the wheel: {carrying}"
    assert "outbox_migrations/script.py.mako" in names
    assert "outbox/py.typed" in names, "type checkers would ignore the library's hints"
    assert any(name.startswith("outbox_migrations/versions/0001_") for name in names)
    # pyproject.toml lists the packages: a package folder left out of it is left out here.
    packages = {
        "/".join((installed, *init.parent.relative_to(REPO / folder).parts))
        for installed, folder in SHIPPED.items()
        for init in (REPO / folder).rglob("__init__.py")
    }
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"packages missing from the wheel (list them in pyproject.toml): {missing}"
    assert "outbox = outbox_cli:main" in declared
    # The library's own sub-commands only: the tooling declares its own elsewhere.
    assert "[kafka_outbox.commands]" in declared
    assert "checker = outbox_checker.cli:register" in declared
    assert "outbox_devtools" not in declared


def test_every_package_lives_in_a_folder_of_its_import_name() -> None:
    """A traceback's ``outbox_checker.relay`` is found at ``checker/outbox_checker/relay.py``:
    no package is installed under a name its folder does not have."""
    with (REPO / "pyproject.toml").open("rb") as file:
        package_dir = tomllib.load(file)["tool"]["setuptools"].get("package-dir", {})
    renamed = {name: folder for name, folder in package_dir.items() if Path(folder).name != name}
    assert not renamed, f"packages installed under another name than their folder's: {renamed}"
