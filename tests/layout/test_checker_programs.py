"""The checker's programs stand side by side, tied only through the modules they share.

``outbox_checker`` holds three programs: the check rounds, the relay that publishes
committed halves, and the operator commands (``outbox status``, ``outbox discard``). A
replica (``outbox checker``) runs the rounds and the relay side by side in one process.
What two programs must agree on (group ids, transactional ids, the checkpoint's commit
metadata, whether a real record can be published) is written once, in a shared module,
never read out of the other program: a command that imported the relay to learn its
group's name would load the relay's machinery to run a status query, and a change to
the relay's internals would reach the commands unseen.

Every module has exactly one role below. A program imports its own modules and the
shared ones; a shared module imports only shared modules, so nothing reaches a program
through them; the replica (its service, its command and its probes) may import both
programs it runs. Imports are read from the sources (inside functions and for
annotations only too).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "outbox_checker"
FOLDER = Path(__file__).parents[2] / "checker" / PACKAGE

ROLES: dict[str, set[str]] = {
    # What any program may import: names and formats agreed on, settings, errors,
    # group membership, reading committed records, metrics, the parked sends (drained by
    # the rounds, counted by `outbox status --db`), Kafka transactions' settings.
    "shared": {
        "__init__",
        "names",
        "publishable",
        "settings",
        "errors",
        "membership",
        "silence",
        "kafka_reader",
        "entries",
        "metrics",
        "parked",
        "transactional",
        "watchdog",
    },
    "rounds": {
        "rounds",
        "rules",
        "round_writer",
        "checkpoints",
        "ownership",
        "ended",
        "check_topics",
        "db_resolver",
    },
    "relay": {
        "relay",
        "relay_batch",
        "relay_lookups",
        "relay_partitions",
        "relay_records",
        "relay_transaction",
        "decision_memory",
        "half_lookup",
    },
    "commands": {"status", "status_cli", "discard", "discard_cli", "display"},
    "replica": {"service", "cli", "http"},
}
MAY_IMPORT: dict[str, set[str]] = {
    "shared": {"shared"},
    "rounds": {"rounds", "shared"},
    "relay": {"relay", "shared"},
    "commands": {"commands", "shared"},
    "replica": {"replica", "rounds", "relay", "shared"},
}


def _role_of() -> dict[str, str]:
    return {module: role for role, modules in ROLES.items() for module in modules}


def _modules() -> list[str]:
    return sorted(path.stem for path in FOLDER.glob("*.py"))


def checker_imports(source: str) -> list[tuple[int, str]]:
    """(line, module of the package) for each import of one of the package's modules.

    ``from outbox_checker import metrics`` imports the module ``metrics``; a name that
    is no module (``from outbox_checker.rules import HalfEntry``) counts as its module.
    """
    modules = set(_modules())
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # The package's modules sit at its top: ``from . import x`` is ``outbox_checker``'s.
            base = PACKAGE if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            if module == PACKAGE:
                names = [f"{PACKAGE}.{alias.name}" for alias in node.names]
            else:
                names = [module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in modules:
                found.append((node.lineno, parts[1]))
    return found


def test_every_checker_module_has_one_role() -> None:
    listed = [module for modules in ROLES.values() for module in modules]
    twice = sorted({module for module in listed if listed.count(module) > 1})
    assert not twice, f"modules with more than one role: {twice}"
    unlisted = sorted(set(_modules()) - set(listed))
    assert not unlisted, f"give these modules a role in ROLES: {unlisted}"
    gone = sorted(set(listed) - set(_modules()))
    assert not gone, f"ROLES names modules that are gone: {gone}"


def test_each_program_imports_only_itself_and_the_shared_modules() -> None:
    role_of = _role_of()
    wrong = []
    for module in _modules():
        role = role_of.get(module)
        if role is None:
            continue  # test_every_checker_module_has_one_role says so
        source = (FOLDER / f"{module}.py").read_text(encoding="utf-8")
        for line, target in checker_imports(source):
            if role_of.get(target) not in MAY_IMPORT[role]:
                wrong.append(
                    f"{PACKAGE}/{module}.py:{line} ({role}) imports {PACKAGE}.{target}"
                    f" ({role_of.get(target, 'no role')})"
                )
    assert not wrong, "imports across the checker's programs:\n" + "\n".join(wrong)


def test_the_check_names_an_import_across_programs() -> None:
    """The check itself can fail: a command importing the relay is found, with its line."""
    source = (
        "from outbox_checker.relay import Relay\n"
        "from outbox_checker import status\n"
        "import outbox_checker.rules\n"
        "from .round_writer import RoundWriter\n"
        "from outbox.protocol import TopicNames\n"
    )
    found = checker_imports(source)
    assert found == [(1, "relay"), (2, "status"), (3, "rules"), (4, "round_writer")]
