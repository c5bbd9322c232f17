"""payloadrun.settings: one way to declare a setting, flag over variable over default."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from payloadrun import settings
from payloadrun.settings import SettingsError, parse_int, setting


@dataclass(frozen=True)
class Example:
    name: str = setting(help="a name", flag="--name", env="EXAMPLE_NAME", missing="no name given")
    workers: int = setting(
        4, help="threads", flag="--workers", env="EXAMPLE_WORKERS", parse=parse_int, minimum=1
    )
    fast: bool = setting(False, help="hurry", flag="--fast", env="EXAMPLE_FAST", boolean=True)
    tags: dict = setting({"a": 1}, help="JSON", env="EXAMPLE_TAGS", parse=eval)

    def __post_init__(self) -> None:
        settings.validate(self)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, Example)
    return parser.parse_args(argv)


def test_flag_wins_over_variable_which_wins_over_default():
    env = {"EXAMPLE_NAME": "env", "EXAMPLE_WORKERS": "2", "EXAMPLE_FAST": "yes"}
    assert settings.from_args(Example, parse(["--name", "flag"]), env) == Example("flag", 2, True)
    assert settings.from_args(Example, parse(["--workers", "3", "--no-fast"]), env) == Example(
        "env", 3, False
    )
    assert settings.from_args(Example, parse([]), {"EXAMPLE_NAME": "x"}).workers == 4


def test_errors_name_the_flag_and_the_variable():
    with pytest.raises(SettingsError, match="no name given"):
        settings.from_args(Example, parse([]), {})
    with pytest.raises(SettingsError, match=r"EXAMPLE_WORKERS='many': not an integer"):
        settings.from_args(Example, None, {"EXAMPLE_NAME": "x", "EXAMPLE_WORKERS": "many"})
    with pytest.raises(SettingsError, match=r"workers \(--workers / EXAMPLE_WORKERS\) must be at"):
        settings.from_args(Example, parse(["--workers", "0"]), {"EXAMPLE_NAME": "x"})
    with pytest.raises(SettingsError, match="must be at least 1"):
        Example("x", workers=0)  # built in code: the same check
    with pytest.raises(SystemExit):
        parse(["--workers", "many"])  # argparse's own usage error


def test_mutable_defaults_are_fresh_and_help_names_default_and_variable():
    assert Example("x").tags == {"a": 1} and Example("x").tags is not Example("x").tags
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser, Example)
    text = parser.format_help()
    assert "(default: 4) [env EXAMPLE_WORKERS]" in text.replace("\n", " ").replace("  ", " ")
    assert settings.env_of(Example, "workers") == "EXAMPLE_WORKERS"


def test_the_operator_imports_the_names_without_numpy():
    import subprocess
    import sys

    code = "import sys, payloadrun.settings; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
