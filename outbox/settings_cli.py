"""A command whose flags are the fields of a settings object, one flag per field.

Every knob of a long-running component must be both a flag and an
environment variable. Writing the flags by hand would copy each field's name,
type, default and help into a second place that drifts; instead the command's
signature is generated from the pydantic model, so a new field is a new flag.
"""

from __future__ import annotations

import inspect
import logging
import os
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from outbox.config import parse_properties, settings_error

SettingsT = TypeVar("SettingsT", bound=BaseSettings)

_PROPERTIES_FIELD = "kafka_properties"


def _flag_type(annotation: Any) -> type:
    """The scalar type a flag parses to (``X | None`` becomes ``X``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else str
    return annotation if annotation in (str, int, float, bool) else str


def _parameters(model: type[BaseSettings]) -> list[inspect.Parameter]:
    params = []
    for name, field in model.model_fields.items():
        flag = f"--{name.replace('_', '-')}"
        env = f"{model.model_config.get('env_prefix', '')}{name}".upper()
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        if name == _PROPERTIES_FIELD:
            option = typer.Option(
                "--kafka-property",
                "-X",
                help="Extra librdkafka property KEY=VALUE (repeatable); env "
                f"{env} takes a JSON object.",
                show_default=False,
            )
            annotation: Any = Annotated[list[str] | None, option]
        else:
            kind = _flag_type(field.annotation)
            option = typer.Option(
                flag,
                envvar=env,
                help=field.description or "",
                show_default=str(default) if default is not None else False,
            )
            annotation = Annotated[kind | None, option]  # type: ignore[valid-type]
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
            )
        )
    return params


def settings_from_flags(model: type[SettingsT], values: dict[str, Any]) -> SettingsT:
    """The settings object: given flags first, then ``OUTBOX_*`` variables, then defaults."""
    explicit = {k: v for k, v in values.items() if v is not None}
    if "bootstrap_servers" in model.model_fields and not _bootstrap_in_env(model):
        dev_broker = _dev_broker()
        if dev_broker is not None:
            explicit.setdefault("bootstrap_servers", dev_broker)
    if explicit.get(_PROPERTIES_FIELD):
        explicit[_PROPERTIES_FIELD] = parse_properties(explicit[_PROPERTIES_FIELD])
    else:
        explicit.pop(_PROPERTIES_FIELD, None)
    try:
        return model(**explicit)
    except ValidationError as exc:
        raise settings_error(exc) from None


def _bootstrap_in_env(model: type[BaseSettings]) -> bool:
    return f"{model.model_config.get('env_prefix', '')}BOOTSTRAP_SERVERS".upper() in os.environ


def _dev_broker() -> str | None:
    """The broker of ``outbox dev kafka start``, the embedded default."""
    from outbox.dev.kafka import running_bootstrap

    return running_bootstrap()


def settings_command(
    app: typer.Typer,
    name: str,
    model: type[SettingsT],
    run: Callable[[SettingsT], None],
    *,
    help: str,
    log_level: str = "INFO",
) -> None:
    """Register ``name`` on ``app``: flags from ``model``'s fields (plus
    ``--log-level``), then ``run(settings)``."""

    def command(**values: Any) -> None:
        level = values.pop("log_level", None) or log_level
        logging.basicConfig(
            level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        run(settings_from_flags(model, values))

    params = _parameters(model)
    params.append(
        inspect.Parameter(
            "log_level",
            inspect.Parameter.KEYWORD_ONLY,
            default=log_level,
            annotation=Annotated[
                str, typer.Option("--log-level", envvar="OUTBOX_LOG_LEVEL", help="Log level.")
            ],
        )
    )
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = help
    app.command(name, help=help)(command)
