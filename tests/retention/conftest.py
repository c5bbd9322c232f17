"""Fixtures for the retention tests: a payload root on a tmp dir, file makers, services."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from payloadrun.retention.config import RetentionConfig
from payloadrun.retention.service import RetentionService


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "payloads"
    path.mkdir()
    return path


@pytest.fixture
def service_factory(root: Path) -> Iterator[Callable[..., RetentionService]]:
    """Build and start services on ``root``; every one is closed at teardown."""
    made: list[RetentionService] = []

    def make(*, start: bool = True, scan: bool = False, unlink=None, **overrides):
        options = {"root": root, "run_id": "run-a", "max_off_policy_steps": 2, "workers": 4}
        options.update(overrides)
        kwargs = {"unlink": unlink} if unlink is not None else {}
        service = RetentionService(RetentionConfig(**options), **kwargs)
        made.append(service)
        if start:
            service.start(scan=scan)
        return service

    yield make
    for service in made:
        if service.mode is not None:
            service.close()
