"""A command whose flags are the fields of a settings object, one flag per field.

Every knob of a long-running component must be both a flag and an
environment variable. Writing the flags by hand would copy each field's name,
type, default and help into a second place that drifts; instead the command's
signature is generated from the pydantic model, so a new field is a new flag.

A field's flag reads the variables pydantic-settings would read for it, in the
same order (:func:`outbox.config.env_names`), so a value has one precedence
whoever reads it: the flag, then the first variable that is set, then the
later ones (``OUTBOX_SINK_BOOTSTRAP_SERVERS`` before ``OUTBOX_BOOTSTRAP_SERVERS``),
then the default. A flag left out passes nothing, so the model's own default
(and its own reading of the environment) applies, never a copy of it here.
"""

from __future__ import annotations

import inspect
import logging
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings
from rich.markup import escape

from outbox.config import KafkaSettings, env_names, parse_properties, settings_error
from outbox.durations import UNIT_WORDS, DurationError, Unit, duration_unit, parse_duration
from outbox.errors import ConfigurationError
from outbox.security import SECURITY_FIELD_NAMES
from outbox_cli.options import local_bootstrap, no_kafka_error

SettingsT = TypeVar("SettingsT", bound=BaseSettings)
ResultT = TypeVar("ResultT")

FlagNames = Mapping[str, Sequence[str]]
"""Field name to the names of its flag, where ``--field-name`` is not what users type."""

KAFKA_PROPERTY_FLAGS = ("--kafka-property", "-X")
"""The spelling of a Kafka client properties field in every ``outbox`` command."""

_BOOTSTRAP = "bootstrap_servers"

CONNECTION_FLAGS: FlagNames = {
    _BOOTSTRAP: ("--bootstrap-servers", "--bootstrap"),
    "topic_prefix": ("--topic-prefix", "--prefix"),
}
"""The connection's flags, spelled alike in every command: the field's own name first,
the short spelling the admin commands had before kept as an alias."""

_CONNECTION_FIELDS = (*CONNECTION_FLAGS, "kafka_properties", "kafka_options")

PanelOf = Callable[[str], str | None]
"""A field's help panel in ``--help`` (None: typer's "Options")."""


def _panel(name: str, panel_of: PanelOf | None) -> str | None:
    """The same panels in every command for the connection and its security block."""
    if name in _CONNECTION_FIELDS:
        return "Kafka"
    if name in SECURITY_FIELD_NAMES:
        return "Kafka security"
    return panel_of(name) if panel_of else None


KAFKA_FLAGS: FlagNames = {**CONNECTION_FLAGS, "kafka_properties": KAFKA_PROPERTY_FLAGS}
"""Spellings of the connection's flags in the admin commands (:func:`kafka_options`)."""


def _unwrap_optional(annotation: Any) -> Any:
    """``X | None`` as ``X``; other unions as they are."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _is_mapping(info: FieldInfo) -> bool:
    return typing.get_origin(_unwrap_optional(info.annotation)) is dict


def _parses_text(model: type[BaseSettings], name: str) -> bool:
    """Whether the model turns text into the field's value itself (a non-``after``
    validator: durations such as ``10s``, comma-separated lists)."""
    return any(
        decorator.info.mode != "after"
        and (name in decorator.info.fields or "*" in decorator.info.fields)
        for decorator in model.__pydantic_decorators__.field_validators.values()
    )


def _flag_type(model: type[BaseSettings], name: str, info: FieldInfo) -> type:
    """What click turns a flag's text into before pydantic validates it.

    Plain numbers and booleans are click's (typed metavars, ``--x/--no-x``);
    anything else (``Literal`` choices, tuples, a float the model parses from
    ``"10s"``) is handed over as text, for pydantic to parse and check with the
    model's own rules and an error that names the field's variable.
    """
    kind = _unwrap_optional(info.annotation)
    if kind is bool or (kind in (int, float) and not _parses_text(model, name)):
        return typing.cast(type, kind)
    return str


_UNIT_SUFFIXES = ("_seconds", "_ms", "_hours")


def _names(name: str, flags: FlagNames, model: type[BaseSettings] | None = None) -> tuple[str, ...]:
    """A field's flags: ``--field-name``, unless ``flags`` names them; a duration field's
    flag drops the unit (``--check-interval 10s``), its old ``--*-seconds`` spelling kept."""
    if name in flags:
        return tuple(flags[name])
    flag = f"--{name.replace('_', '-')}"
    if model is not None and duration_unit(model.model_fields[name].metadata):
        for suffix in _UNIT_SUFFIXES:
            if name.endswith(suffix):
                return (f"--{name.removesuffix(suffix).replace('_', '-')}", flag)
    return (flag,)


def duration_parser(unit: Unit | None) -> Callable[[str], float]:
    """A click parser of a duration flag: the amount in ``unit``; a bad value is a usage
    error naming the flag (and its variable), as any refused flag value is."""

    def parse(text: str) -> float:
        if not isinstance(text, str):  # a default click passes on as it is
            return text
        try:
            return parse_duration(text, unit)
        except DurationError as exc:
            raise typer.BadParameter(str(exc)) from None

    return parse


def duration_option(*names: str, help: str, unit: Unit | None = "s", **options: Any) -> Any:
    """A ``typer.Option`` of a duration for a command's own flag (not a settings field)."""
    return typer.Option(
        *names,
        help=help + duration_help(unit),
        metavar="DURATION",
        parser=duration_parser(unit),
        **options,
    )


def duration_help(unit: Unit | None) -> str:
    """What a duration flag's help adds: the syntax, and the unit of a plain number."""
    plain = f"; a plain number is {UNIT_WORDS[unit]}" if unit else ""
    return f" (duration: 500ms, 10s, 5m, 1d12h{plain})"


def _help_default(info: FieldInfo) -> Any:
    """The model's default as ``--help`` shows it; None when there is none to show.

    It is the click parameter's default, but only ever displayed: a value
    click took from its default is dropped (:func:`_given`), so the model's
    own default and its own reading of the environment apply. Text, so a
    float shows as ``10``, not ``10.0``; defaults of fields kept out of reprs
    (secrets) are never shown.
    """
    if info.is_required() or info.repr is False:
        return None
    default = info.get_default(call_default_factory=True)
    if isinstance(default, bool):
        return default  # typer shows it as the flag's name: fail-on-data-loss, no-once
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    if isinstance(default, tuple | list):
        default = ",".join(str(item) for item in default)
    return None if default is None or default == "" else str(default)


def _help(info: FieldInfo) -> str:
    """The field's description, escaped: typer reads help as rich markup, which
    would swallow a ``[word]`` in it."""
    return escape(info.description or "")


def _parameter(
    model: type[BaseSettings], name: str, flags: FlagNames, panel_of: PanelOf | None = None
) -> inspect.Parameter:
    info = model.model_fields[name]
    panel = _panel(name, panel_of)
    names = _names(name, flags, model)
    variables = env_names(model, name)
    unit = duration_unit(info.metadata)
    default = None
    if _is_mapping(info):
        # Repeatable KEY=VALUE pairs; the variable, a JSON object, is pydantic's to read.
        option = typer.Option(
            *names,
            help=f"{_help(info)}; one KEY=VALUE per flag, or one JSON object (as env "
            f"{' or '.join(variables)} takes).",
            metavar="KEY=VALUE",
            show_default=False,
            rich_help_panel=panel,
        )
        annotation: Any = Annotated[list[str] | None, option]
    else:
        kind = _unwrap_optional(info.annotation)
        choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else ()
        default = _help_default(info)
        metavar = f"[{'|'.join(str(c) for c in choices)}]" if choices else None
        if unit:
            metavar = "DURATION"
        if kind is bool:  # --x/--no-x: a flag whose default is on must be able to turn it off
            names = (f"{names[0]}/--no-{names[0].removeprefix('--')}", *names[1:])
        option = typer.Option(
            *names,
            # One name as a string: click shows a list as its repr in error messages.
            envvar=variables[0] if len(variables) == 1 else list(variables),
            help=_help(info) + (duration_help(unit) if unit else ""),
            metavar=metavar,
            rich_help_panel=panel,
            parser=duration_parser(unit) if unit else None,
        )
        annotation = Annotated[float if unit else _flag_type(model, name, info), option]
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether a value came from the command line or a variable click read, not
    from the parameter's default (which is there for ``--help`` only)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def settings_from_flags(
    model: type[SettingsT], values: Mapping[str, Any], flags: FlagNames | None = None
) -> SettingsT:
    """The settings object from a command's values by field name (None: not given).

    What a flag (or a variable click read for it) gave wins; the rest is
    pydantic-settings' to read from the environment, then the defaults apply.
    With no bootstrap servers anywhere, the broker of ``outbox dev kafka start``.
    """
    flags = flags or {}
    given: dict[str, Any] = {}
    for name, value in values.items():
        mapping = _is_mapping(model.model_fields[name])
        if value is None or (mapping and not value):
            continue
        if mapping:
            try:
                value = parse_properties(value)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{_names(name, flags)[0]}: {exc}") from None
        given[name] = value
    if _BOOTSTRAP in model.model_fields and _BOOTSTRAP not in given:
        found = _bootstrap_fallback(model, flags)
        if found is not None:
            given[_BOOTSTRAP] = found
    try:
        return model(**{_init_key(model, name): value for name, value in given.items()})
    except ValidationError as exc:
        raise settings_error(exc, model) from None


def _init_key(model: type[BaseSettings], name: str) -> str:
    """The keyword a value is passed by: a field with aliases takes its first
    variable's name whether or not the model also accepts the field's name."""
    return env_names(model, name)[0] if model.model_fields[name].validation_alias else name


def _bootstrap_fallback(model: type[BaseSettings], flags: FlagNames) -> str | None:
    """No bootstrap flag: None when the environment has one (pydantic reads it),
    else the dev broker's, else an error saying how to give one."""
    variables = env_names(model, _BOOTSTRAP)
    if any(variable in os.environ for variable in variables):
        return None
    found = local_bootstrap()
    if found is None:
        raise no_kafka_error(_names(_BOOTSTRAP, flags)[0], variables)
    return found


def settings_command(
    app: typer.Typer,
    name: str,
    model: type[SettingsT],
    run: Callable[[SettingsT], None],
    *,
    help: str,
    log_level: str = "INFO",
    flags: FlagNames | None = None,
    panel_of: PanelOf | None = None,
) -> None:
    """Register ``name`` on ``app``: flags from ``model``'s fields (plus
    ``--log-level``), then ``run(settings)``.

    ``flags`` names a field's flag where ``--field-name`` is not what users
    type: an older spelling a command keeps, a short alias, the singular of a
    repeatable ``KEY=VALUE`` flag (:data:`KAFKA_PROPERTY_FLAGS`). ``panel_of`` groups
    the component's own flags in ``--help``; the connection's are grouped alike everywhere.
    """
    flags = flags or {}
    unknown = set(flags) - set(model.model_fields)
    flags = {
        **{name: names for name, names in CONNECTION_FLAGS.items() if name in model.model_fields},
        **flags,
    }
    if unknown:
        raise ValueError(f"flags for fields {model.__name__} does not have: {sorted(unknown)}")

    def command(ctx: typer.Context, **values: Any) -> None:
        level = values.pop("log_level")
        logging.basicConfig(
            level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        given = {name: value for name, value in values.items() if _given(ctx, name)}
        run(settings_from_flags(model, given, flags))

    params = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        *(_parameter(model, field, flags, panel_of) for field in model.model_fields),
        inspect.Parameter(
            "log_level",
            inspect.Parameter.KEYWORD_ONLY,
            default=log_level,
            annotation=Annotated[
                str,
                typer.Option(
                    "--log-level",
                    envvar="OUTBOX_LOG_LEVEL",
                    help="Log level.",
                    rich_help_panel=panel_of("log_level") if panel_of else None,
                ),
            ],
        ),
    ]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = help
    app.command(name, help=help)(command)


def kafka_options(command: Callable[..., ResultT]) -> Callable[..., ResultT]:
    """``command``'s keyword-only ``settings: KafkaSettings`` parameter as one flag per field of
    :class:`~outbox.config.KafkaSettings`: the same flags, variables and precedence as
    the commands :func:`settings_command` makes, for a command with options of its own.

    The security block (``--security-protocol``, ``--sasl-username``, ...) comes
    with the fields, so an admin command logs in like the component it inspects.
    """
    own = inspect.signature(command, eval_str=True).parameters
    fields = list(KafkaSettings.model_fields)

    def with_kafka(ctx: typer.Context, **values: Any) -> ResultT:
        given = {name: values.pop(name) for name in fields}
        given = {name: value for name, value in given.items() if _given(ctx, name)}
        return command(**values, settings=settings_from_flags(KafkaSettings, given, KAFKA_FLAGS))

    params = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        *(p for name, p in own.items() if name != "settings"),
        *(_parameter(KafkaSettings, name, KAFKA_FLAGS) for name in fields),
    ]
    with_kafka.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    with_kafka.__doc__ = command.__doc__
    with_kafka.__name__ = command.__name__
    return with_kafka
