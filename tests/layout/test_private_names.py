"""No module uses another module's private names: seams between modules are public.

A name with a leading underscore is its module's own business. Another module that
reads ``core._writer`` or imports ``_plan`` is tied to details its owner may change
without notice, and the reader cannot tell the seam from the inside. So the check:
an attribute ``x._name`` (``x`` not ``self`` or ``cls``) or an import of ``_name`` is
allowed only where the same file defines ``_name`` itself (a function, class,
assignment, slot or ``self._name`` attribute of its own), or where a third-party
library publishes the name under an underscore (listed below, each with why).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHECKED = [
    "outbox",
    "checker/outbox_checker",
    "spark_sink",
    "migrations/outbox_migrations",
    "outbox_cli",
    "devtools/outbox_devtools",
    "bench",
    "examples",
    "docs_src",
    "tests",
]

THIRD_PARTY = {
    # py4j's gateway to the JVM: the documented way PySpark code reaches Java classes.
    "_jvm": "pyspark SparkContext",
    "_jsc": "pyspark SparkContext",
    "_jdf": "pyspark DataFrame",
    # PySpark's active context (SparkSession.getActiveSession does not say whether one runs).
    "_active_spark_context": "pyspark SparkContext",
    # pyspark's own way of finding SPARK_HOME, as spark-submit does.
    "_find_spark_home": "pyspark.find_spark_home",
    # namedtuple's public methods carry an underscore so as not to clash with fields.
    "_replace": "collections.namedtuple",
    "_asdict": "collections.namedtuple",
    "_fields": "collections.namedtuple",
    # OpenTelemetry offers no way to reset its global provider between tests but these.
    "_TRACER_PROVIDER": "opentelemetry.trace",
    "_TRACER_PROVIDER_SET_ONCE": "opentelemetry.trace",
    # the interpreter's own frame access (used to name a caller).
    "_getframe": "sys",
}


def _files() -> list[Path]:
    files: list[Path] = []
    for folder in CHECKED:
        files += sorted((ROOT / folder).rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


def _own_private_names(tree: ast.AST) -> set[str]:
    """The private names a file defines itself."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            own.add(node.value)  # __slots__ entries, getattr names
    return {name for name in own if _private(name)}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reach_ins(path: Path) -> list[str]:
    """Each use in ``path`` of a private name that another module defines."""
    tree = ast.parse(path.read_text(), str(path))
    own = _own_private_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name) and alias.name not in THIRD_PARTY:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if node.attr in own or node.attr in THIRD_PARTY:
                continue
            if isinstance(base, ast.Name) and base.id == "KafkaError":
                continue  # librdkafka's own error codes, public in confluent-kafka as _X
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_uses_another_modules_private_names(path: Path):
    found = reach_ins(path)
    assert not found, (
        f"{path.relative_to(ROOT)} uses private names another module defines (give the "
        "owner a public seam instead):\n  " + "\n  ".join(found)
    )


def test_the_check_sees_a_reach_in(tmp_path: Path):
    """The check itself can fail: a private name of another module is reported."""
    module = tmp_path / "user.py"
    module.write_text("from outbox import producer\n\nproducer._core._writer.flush()\n")
    assert reach_ins(module) == ["line 3: producer._core._writer", "line 3: producer._core"]


def test_a_modules_own_private_names_pass(tmp_path: Path):
    module = tmp_path / "own.py"
    module.write_text(
        "class Box:\n    __slots__ = ('_item',)\n\n"
        "def take(box: Box) -> object:\n    return box._item\n"
    )
    assert reach_ins(module) == []
