"""The documentation's configuration reference is what the settings objects say now.

The reference is generated (``outbox config-reference``), so the only way it
can be wrong is by not being regenerated after a settings change; this test
catches that, and says how to fix it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from typer.testing import CliRunner

from outbox_cli import app
from outbox_devtools import config_reference
from outbox_devtools.config_reference import END_MARKER, START_MARKER, WRITE_COMMAND, Component

ROOT = typer.main.get_command(app)
REFERENCE = Path(__file__).parents[2] / config_reference.REFERENCE_PAGE


def test_the_configuration_reference_page_is_current() -> None:
    page = REFERENCE.read_text(encoding="utf-8")
    current = config_reference.replace_section(page, config_reference.render(ROOT))
    assert page == current, (
        f"{config_reference.REFERENCE_PAGE} differs from the settings objects: "
        f"run `{WRITE_COMMAND}` and commit the result"
    )


def test_every_settings_field_and_variable_is_listed() -> None:
    reference = config_reference.render(ROOT)
    for component in config_reference.COMPONENTS:
        if component.settings is None:
            continue
        for name in component.settings.model_fields:
            assert f"| `{name}` |" in reference, f"{component.title}: {name} missing"
    for variable in ("OUTBOX_SINK_BOOTSTRAP_SERVERS", "OUTBOX_LOG_LEVEL", "OUTBOX_DATABASE_URL"):
        assert f"`{variable}`" in reference


def test_every_field_of_a_component_with_commands_has_a_flag() -> None:
    for component in config_reference.COMPONENTS:
        if component.settings is None or not component.commands:
            continue
        section = config_reference.render(ROOT, [component])
        for name in component.settings.model_fields:
            (row,) = [line for line in section.splitlines() if line.startswith(f"| `{name}` |")]
            assert row.split(" | ")[1].startswith("`--"), f"{component.title}: {name} has no flag"


class _Secretive(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DEMO_")

    password: dict[str, str] = Field(
        default_factory=lambda: {"sasl.password": "hunter2"},
        repr=False,
        description="client properties",
    )


class _Undocumented(BaseSettings):
    retries: int = 1


def test_secret_defaults_are_never_shown() -> None:
    reference = config_reference.render(ROOT, [Component("Secretive", "A test.", _Secretive)])
    assert "hunter2" not in reference
    assert "| `password` | `DEMO_PASSWORD` | set, not shown | client properties |" in reference


def test_a_field_without_description_is_an_error() -> None:
    with pytest.raises(ValueError, match="'retries' has no description"):
        config_reference.render(ROOT, [Component("Undocumented", "A test.", _Undocumented)])


def test_options_that_fill_no_field_are_an_error() -> None:
    component = Component("Sink", "x", _Secretive, commands=(("sink",),))
    with pytest.raises(ValueError, match="fills no field"):
        config_reference.render(ROOT, [component])


def test_write_rewrites_only_the_marked_section(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{START_MARKER}\nstale\n{END_MARKER}\n\n## After\n")
    runner = CliRunner()

    first = runner.invoke(app, ["config-reference", "--write", str(readme)])
    second = runner.invoke(app, ["config-reference", "--write", str(readme)])

    assert first.exit_code == 0 and "updated" in first.output
    assert second.exit_code == 0 and "already current" in second.output
    text = readme.read_text()
    assert text.startswith(f"# Title\n\n{START_MARKER}\n")
    assert text.endswith(f"{END_MARKER}\n\n## After\n")
    assert "stale" not in text and "### Checker: `outbox checker`" in text


def test_write_refuses_a_file_without_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n")
    with pytest.raises(ValueError, match="config-reference:start"):
        config_reference.write_section(readme, "x")
    assert readme.read_text() == "# Title\n"


def test_write_to_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "NOPE.md"
    result = CliRunner().invoke(app, ["config-reference", "--write", str(missing)])
    assert result.exit_code == 2
    assert "NOPE.md" in result.output and "does not exist" in result.output
    assert not missing.exists()
