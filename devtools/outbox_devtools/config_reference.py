"""The configuration reference: one Markdown table per component, from the declarations.

Every knob is declared once: as a field of a pydantic-settings class (its
default, its ``description=``, its environment names) and, where a command runs
the component, as an option of that command. A hand-written reference would
copy all of that into a second place that drifts, so the documentation's reference is
rendered from the declarations themselves (``outbox config-reference``) and a
test fails when the page's copy differs from what this module renders now.

Strict on purpose: a field without a description, a command option that maps
to no field, or a stale name in :data:`COMPONENTS` is an error here, so the
reference cannot silently leave a knob out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from outbox.config import RENAMED_VARIABLES, KafkaSettings, env_names
from outbox.durations import duration_unit, format_duration, in_seconds
from outbox.settings import ProducerSettings
from outbox_checker.settings import CheckerSettings
from outbox_devtools.chaos.settings import ChaosSettings
from spark_sink.settings import SinkSettings

START_MARKER = "<!-- config-reference:start -->"
END_MARKER = "<!-- config-reference:end -->"
REFERENCE_PAGE = "docs/reference/configuration.md"
WRITE_COMMAND = f"outbox config-reference --write {REFERENCE_PAGE}"
GENERATED_NOTICE = (
    f"<!-- Generated from the settings objects; do not edit: run `{WRITE_COMMAND}`. -->"
)


@dataclass(frozen=True)
class Component:
    """A part of the system, and where its knobs are declared.

    ``commands`` are paths under ``outbox`` (``("db", "prune")``) whose options
    are the component's flags. An option fills the settings field of its own
    name unless ``flag_fields`` maps its parameter name to another field.
    Options that fill no field are an error, unless ``other_options`` is set:
    then those with an environment variable (configuration, not per-run
    arguments such as ``--revision``) are listed too.
    """

    title: str
    summary: str
    settings: type[BaseSettings] | None
    commands: tuple[tuple[str, ...], ...] = ()
    flag_fields: Mapping[str, str] = field(default_factory=dict)
    other_options: bool = False


COMPONENTS: tuple[Component, ...] = (
    Component(
        "Producer",
        "`outbox.ProducerSettings`, for the library (no command line): pass one to "
        "`TransactionProducer`, or leave it out and the producer reads the environment.",
        ProducerSettings,
    ),
    Component(
        "Checker: `outbox checker`",
        "`outbox_checker.settings.CheckerSettings`; its flags are generated from the fields.",
        CheckerSettings,
        commands=(("checker",),),
        other_options=True,
    ),
    Component(
        "Spark sink: `outbox sink`",
        "`spark_sink.SinkSettings`; `outbox sink` and `spark-submit spark_sink/submit.py` "
        "take the same flags, generated from the fields. A flag wins over the variables, and "
        "an `OUTBOX_SINK_*` variable over the shared `OUTBOX_BOOTSTRAP_SERVERS` and "
        "`OUTBOX_TOPIC_PREFIX`.",
        SinkSettings,
        commands=(("sink",),),
        other_options=True,
    ),
    Component(
        "Admin commands: `outbox topics`, `outbox status`, `outbox discard`",
        "`outbox.config.KafkaSettings`, the connection every component shares; its flags "
        "are generated from the fields. Without `--bootstrap` these commands use the "
        "broker of `outbox dev kafka start`.",
        KafkaSettings,
        commands=(
            ("topics", "create"),
            ("topics", "describe"),
            ("status",),
            ("discard", "list"),
            ("discard", "resume"),
        ),
        other_options=True,
    ),
    Component(
        "SQL transaction log: `outbox db`",
        "Options of `outbox db upgrade|downgrade|current|prune` (no settings object). "
        "`SqlTransactionListener` takes its table, schema and grace period as arguments.",
        None,
        commands=(("db", "upgrade"), ("db", "downgrade"), ("db", "current"), ("db", "prune")),
        other_options=True,
    ),
    Component(
        "Chaos proof: `outbox chaos`",
        "`outbox_devtools.chaos.settings.ChaosSettings`; `make chaos SEED=N` passes `--seed`.",
        ChaosSettings,
        commands=(("chaos",),),
        other_options=True,
    ),
)


@dataclass(frozen=True)
class Row:
    """One knob, as the table shows it (cells already Markdown)."""

    field: str
    flags: str
    env: str
    default: str
    description: str


_COLUMNS = (
    ("field", "field"),
    ("flags", "flag"),
    ("env", "environment"),
    ("default", "default"),
    ("description", "description"),
)


def render(root: Any, components: Sequence[Component] = COMPONENTS) -> str:
    """The whole reference: a heading, a sentence and a table per component.

    ``root`` is the ``outbox`` command as click sees it (``ctx.find_root().command``).
    """
    sections = [_render_component(component, root) for component in components]
    return "\n\n".join(sections) + "\n"


def _render_component(component: Component, root: Any) -> str:
    commands = {path: _command(root, path) for path in component.commands}
    rows = _rows(component, commands)
    return "\n".join([f"### {component.title}", "", component.summary, "", _table(rows)])


def _command(root: Any, path: tuple[str, ...]) -> Any:
    command = root
    for name in path:
        children = getattr(command, "commands", {})
        if name not in children:
            raise ValueError(f"config reference: no command `outbox {' '.join(path)}`")
        command = children[name]
    return command


def _rows(component: Component, commands: Mapping[tuple[str, ...], Any]) -> list[Row]:
    model = component.settings
    fields = dict(model.model_fields) if model is not None else {}
    by_field: dict[str, list[Any]] = {name: [] for name in fields}
    others: dict[tuple[str, ...], tuple[Any, list[tuple[str, ...]]]] = {}
    seen_params: set[str] = set()
    for path, command in commands.items():
        for param in command.params:
            seen_params.add(param.name)
            target = component.flag_fields.get(param.name, param.name)
            if target in by_field:
                by_field[target].append(param)
            elif not component.other_options:
                raise ValueError(
                    f"config reference: `outbox {' '.join(path)}` option {param.opts[0]} fills "
                    f"no field of {_model_name(model)}; map it in COMPONENTS[].flag_fields"
                )
            elif _envvars(param):
                key = tuple(param.opts)
                others.setdefault(key, (param, []))[1].append(path)
    for parameter, target in component.flag_fields.items():
        if parameter not in seen_params or target not in fields:
            raise ValueError(
                f"config reference: flag_fields maps {parameter!r} to {target!r}, but the "
                f"commands have no such option or {_model_name(model)} no such field"
            )
    rows = [
        _field_row(name, info, env_names(model, name), by_field[name])
        for name, info in fields.items()
    ]
    for param, paths in others.values():
        rows.append(_option_row(param, paths, len(commands)))
    return rows


def _field_row(name: str, info: FieldInfo, variables: list[str], params: list[Any]) -> Row:
    if not info.description:
        raise ValueError(
            f"config reference: field {name!r} has no description; "
            "add description=... to it in its settings class"
        )
    env = _unique([*variables, *(var for param in params for var in _envvars(param))])
    return Row(
        field=_code(name),
        flags=_flags(params),
        env=_env_cell(env),
        default=_field_default(info),
        description=_text(info.description),
    )


def _option_row(param: Any, paths: list[tuple[str, ...]], command_count: int) -> Row:
    description = _text(param.help or "")
    if len(paths) < command_count:
        used_in = ", ".join(_code(f"outbox {' '.join(path)}") for path in paths)
        description = f"{description} ({used_in})".strip()
    default = "required" if param.required else _value(param.default)
    return Row(
        field="",
        flags=_flags([param]),
        env=_env_cell(_envvars(param)),
        default=default,
        description=description,
    )


def _flags(params: list[Any]) -> str:
    """Every spelling of the options, ``--fail-on-data-loss, --no-fail-on-data-loss``."""
    names = _unique(opt for param in params for opt in (*param.opts, *param.secondary_opts))
    return ", ".join(_code(name) for name in names)


def _env_cell(variables: Iterable[str]) -> str:
    """The variables, each with the deprecated name it replaces (still read)."""
    return ", ".join(
        _code(var)
        + (f" (deprecated: {_code(RENAMED_VARIABLES[var])})" if var in RENAMED_VARIABLES else "")
        for var in variables
    )


def _envvars(param: Any) -> list[str]:
    envvar = getattr(param, "envvar", None)
    if not envvar:
        return []
    return [envvar] if isinstance(envvar, str) else list(envvar)


def _field_default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    default = info.get_default(call_default_factory=True)
    if info.repr is False:
        # Secrets (SASL passwords, ...) are never shown, not even a default.
        return "empty" if not default else "set, not shown"
    unit = duration_unit(info.metadata)
    if unit is not None and isinstance(default, int | float):
        return _code(format_duration(in_seconds(default, unit)))
    return _value(default)


def _value(value: Any) -> str:
    """A default as a table cell: code for values, words for absence."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, float) and value.is_integer():
        return _code(str(int(value)))
    if isinstance(value, Mapping | tuple | list) and not value:
        return "empty"
    if isinstance(value, Mapping):
        return _code(json.dumps(dict(value)))
    if isinstance(value, tuple | list):
        return _code(",".join(str(item) for item in value))
    return _code(str(value)) if str(value) else "`''`"


def _table(rows: list[Row]) -> str:
    """A Markdown table, leaving out columns that are empty in every row."""
    columns = [(attr, title) for attr, title in _COLUMNS if any(getattr(r, attr) for r in rows)]
    lines = [
        "| " + " | ".join(title for _, title in columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
    ]
    lines += ["| " + " | ".join(getattr(row, attr) for attr, _ in columns) + " |" for row in rows]
    return "\n".join(lines)


def _code(text: str) -> str:
    return f"`{text}`"


def _text(text: str) -> str:
    """Prose for a table cell: one line, no final stop, no table or HTML syntax."""
    flat = " ".join(text.split()).removesuffix(".")
    return flat.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _model_name(model: type[BaseSettings] | None) -> str:
    return model.__name__ if model is not None else "the component"


# ------------------------------------------------------------- the reference page's section


def replace_section(document: str, reference: str) -> str:
    """``document`` with the text between the markers replaced by ``reference``."""
    if document.count(START_MARKER) != 1 or document.count(END_MARKER) != 1:
        raise ValueError(
            f"expected one {START_MARKER} and one {END_MARKER} line to mark the "
            "configuration reference"
        )
    head, rest = document.split(START_MARKER)
    _, tail = rest.split(END_MARKER)
    if END_MARKER in head:
        raise ValueError(f"{END_MARKER} comes before {START_MARKER}")
    body = f"\n{GENERATED_NOTICE}\n\n{reference.strip()}\n\n"
    return f"{head}{START_MARKER}{body}{END_MARKER}{tail}"


def write_section(path: Path, reference: str) -> bool:
    """Rewrite the marked section of ``path``; True when that changed the file."""
    document = path.read_text(encoding="utf-8")
    updated = replace_section(document, reference)
    if updated == document:
        return False
    path.write_text(updated, encoding="utf-8")
    return True
