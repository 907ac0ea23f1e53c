"""Find the console's Textual CSS: the ``styles/`` folder shipped inside the wheel (``celeryops/styles``),
else the checkout's top-level ``styles/`` (editable installs and tests).

``base.tcss`` is the application's; every other file is its screen's (the screen's ``CSS_PATH``), which Textual
reads when the screen is first shown: the console's start parses only what the home view needs."""

from __future__ import annotations

from pathlib import Path, PurePath

import celeryops

_PACKAGED = Path(celeryops.__file__).resolve().parent / "styles"
_CHECKOUT = Path(__file__).resolve().parents[3] / "styles"


def styles_dir() -> Path:
    """The folder holding ``base.tcss`` and one ``.tcss`` per screen."""
    for candidate in (_PACKAGED, _CHECKOUT):
        if (candidate / "base.tcss").is_file():
            return candidate
    raise FileNotFoundError(f"celeryops styles not found in {_PACKAGED} or {_CHECKOUT}; reinstall celeryops.")


def stylesheets() -> list[Path]:
    """``base.tcss`` first, then every screen's file in name order."""
    folder = styles_dir()
    return [folder / "base.tcss", *sorted(p for p in folder.glob("*.tcss") if p.name != "base.tcss")]


def screen_css(*names: str) -> list[str | PurePath]:
    """The stylesheets of a screen, by name (``screen_css("drain")``: ``styles/drain.tcss``), typed as Textual's
    ``CSS_PATH`` is."""
    folder = styles_dir()
    return [folder / f"{name}.tcss" for name in names]
