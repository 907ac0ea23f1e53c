"""Textual's parsed stylesheets, kept from one console start to the next.

Textual parses every stylesheet the console uses (its widgets' default CSS, ``styles/*.tcss``) at each start:
~30 ms of the ~90 ms from Textual's start to the first frame (about a tenth of the whole start, imports
included). What a parse gives depends on the CSS text, where it was read from, and the theme's variables only,
so the rules parsed at one start are kept in the user's cache folder (``textual-css-<installation>.pickle``, 0600) and
handed to the next start's stylesheet, as Python keeps compiled modules: it then parses only what changed (a
different text is a different key) and unpickles the rest (~3 ms).

Safe by construction: the file is read only when it was written by this very Textual installation (its parser's
files, by size and modification time: ``textual.__version__`` would cost ~25 ms of ``importlib.metadata``) and for
the same theme variables, and only as a mapping of parse keys to lists of rules; anything else (a file another
version wrote, a truncated or unreadable one, no cache folder) is ignored and the CSS is parsed as it always was.
Writing is best-effort (an atomic replace): a read-only home only costs the parse. The pickle is the user's own,
in a folder only they can write, as their shell's start-up files are.

Uses Textual's private ``Stylesheet._parse_cache`` and ``Stylesheet._variables`` (textual==8.2.8 is pinned;
``tests/console/test_textual_private.py`` checks both are there)."""

from __future__ import annotations

import contextlib
import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import platformdirs
import textual
from textual.css.model import RuleSet
from textual.css.stylesheet import Stylesheet

from celeryops.console.stylesheets import styles_dir

_kept: dict[Path, frozenset[Any]] = {}  # cache file -> the parse keys it holds (as read or written here)
_PARSER = ("__init__.py", "css/model.py", "css/parse.py", "css/styles.py", "css/_styles_builder.py")


def cache_file() -> Path:
    """Where the parsed stylesheets are kept: the user's cache folder (``$XDG_CACHE_HOME/celeryops`` on Linux), a
    file per installation of celeryops (by where its ``styles/`` are: two checkouts or virtualenvs never take turns
    rewriting one file, nor load each other's rules)."""
    where = zlib.crc32(str(styles_dir()).encode())
    return Path(platformdirs.user_cache_dir("celeryops", appauthor=False)) / f"textual-css-{where:08x}.pickle"


def textual_build() -> tuple[object, ...]:
    """This Textual installation: where it is, and its parser's files by size and modification time (an upgrade or
    a reinstall changes them)."""
    root = Path(textual.__file__).parent
    return str(root), *((name, (st := os.stat(root / name)).st_size, st.st_mtime_ns) for name in _PARSER)


def load_parsed_css(stylesheet: Stylesheet) -> int:
    """Hand ``stylesheet`` the rules kept by an earlier start (for its theme variables); returns how many sources'
    rules it got (0: none kept, or not usable here)."""
    path = cache_file()
    try:
        with open(path, "rb") as fh:
            kept = pickle.load(fh)
    except Exception:  # no file yet, unreadable, truncated, or written by something else: parse as always
        return 0
    if not (isinstance(kept, dict) and kept.get("textual") == textual_build()
            and kept.get("variables") == stylesheet._variables and isinstance(kept.get("rules"), dict)):
        return 0
    rules: dict[Any, Any] = kept["rules"]
    usable = {key: value for key, value in rules.items()
              if isinstance(key, tuple) and isinstance(value, list) and all(isinstance(r, RuleSet) for r in value)}
    for key, value in usable.items():
        stylesheet._parse_cache[key] = value
    _kept[path] = frozenset(usable)
    return len(usable)


def keep_parsed_css(stylesheet: Stylesheet) -> bool:
    """Write what ``stylesheet`` has parsed, when it holds rules the file does not (a first start, a screen's CSS
    seen for the first time, a changed text); returns whether it wrote. Best-effort: a folder that cannot be written
    leaves the next start to parse."""
    path = cache_file()
    keys = frozenset(stylesheet._parse_cache.keys())
    if keys <= _kept.get(path, frozenset()):
        return False
    payload = {"textual": textual_build(), "variables": dict(stylesheet._variables),
               "rules": {key: stylesheet._parse_cache[key] for key in keys}}
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        import tempfile

        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".css-", suffix=".tmp")  # created 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
    except Exception:  # an unwritable folder, a full disk, rules that would not pickle: parsed next time
        return False
    _kept[path] = keys
    return True


__all__ = ["cache_file", "keep_parsed_css", "load_parsed_css", "textual_build"]
