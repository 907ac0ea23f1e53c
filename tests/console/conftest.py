"""Console test helpers: SVG snapshots stored in the top-level ``snapshots/`` folder, and apps over a
StaticBackend (fixed rendering data, a fixed clock, no animations)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pytest_textual_snapshot import SVGImageExtension

from celeryops.console import sample
from celeryops.console.app import ConsoleApp, make_app
from celeryops.console.static import StaticBackend

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots"


class TopLevelSVGExtension(SVGImageExtension):
    """pytest-textual-snapshot's SVG files, kept in ``snapshots/<test module>/`` at the repository root."""

    @classmethod
    def dirname(cls, *, test_location: Any) -> str:
        return str(SNAPSHOTS / Path(test_location.filepath).stem)


class _PinnedExtension:
    """Hands ``snap_compare`` our extension whatever extension it asks for."""

    def __init__(self, snapshot: Any) -> None:
        self._snapshot = snapshot

    def use_extension(self, _extension: Any = None) -> Any:
        return self._snapshot.use_extension(TopLevelSVGExtension)


@pytest.fixture
def snapshot(snapshot: Any) -> Any:
    return _PinnedExtension(snapshot)


def build_app(backend: StaticBackend | None = None, **kwargs: Any) -> ConsoleApp:
    """The console over ``backend`` (the sample fleet by default), deterministic."""
    if backend is None:
        backend = StaticBackend(fleet=sample.fleet(), slots=sample.slots())
    kwargs.setdefault("clock", lambda: sample.NOW)
    kwargs.setdefault("animate", False)
    kwargs.setdefault("poll_interval", 3600.0)
    return make_app(backend, **kwargs)


@pytest.fixture
def app_factory() -> Callable[..., ConsoleApp]:
    return build_app
