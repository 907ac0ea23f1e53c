"""Issue 28: the ``[canary]`` table of celeryops.toml: every key, durations as seconds or strings, defaults, and
one sentence per bad value (exit code 2, all problems together, nothing run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from celeryops.core.canary import CANARY_KEYS, CanarySettings
from celeryops.core.configcanary import parse_duration
from celeryops.core.configload import load_config
from celeryops.core.errors import EXIT_USAGE, UserError


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def test_every_canary_key(tmp_path: Path) -> None:
    write(tmp_path / "celeryops.toml", """
[canary]
min_tasks = 200
max_duration = "1h30m"
instances = 2
margin = 0.03
min_effect = 0
alpha = 0.005
confidence = 0.99
new_exception_count = 5
crash_limit = 3
look_interval = "45s"
ignore_exceptions = ["SoftTimeLimitExceeded", " Reject ", "SoftTimeLimitExceeded"]
""")
    canary = load_config(None, tmp_path, {}, {}).canary
    assert canary == CanarySettings(min_tasks=200, max_duration=5400.0, instances=2, margin=0.03, min_effect=0.0,
                                    alpha=0.005, confidence=0.99, new_exception_count=5, crash_limit=3,
                                    look_interval=45.0, ignore_exceptions=("SoftTimeLimitExceeded", "Reject"))
    assert canary.max_looks == 120


def test_defaults_and_pyproject_table(tmp_path: Path) -> None:
    assert load_config(None, tmp_path, {}, {}).canary == CanarySettings()
    write(tmp_path / "pyproject.toml", "[tool.celeryops.canary]\nmin_tasks = 10\nmax_duration = 600\n")
    canary = load_config(None, tmp_path, {}, {}).canary
    assert (canary.min_tasks, canary.max_duration, canary.look_interval) == (10, 600.0, 30.0)
    assert CanarySettings().max_looks == 30


@pytest.mark.parametrize(("text", "seconds"), [
    (600, 600.0), (90.5, 90.5), ("600", 600.0), ("10m", 600.0), ("1h30m", 5400.0), ("1.5h", 5400.0),
    ("45s", 45.0), ("2m 30s", 150.0), ("1H", 3600.0),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10 minutes", "m10", "10mm", "1d", True, None, [], float("inf"),
                                  "nan", "10m5"])
def test_not_durations(text: object) -> None:
    assert parse_duration(text) is None


BAD = [
    ('min_tasks = 0', "canary.min_tasks must be at least 1, not 0."),
    ('min_tasks = "many"', "canary.min_tasks must be a whole number, not a string 'many'."),
    ('max_duration = "soon"', "canary.max_duration must be a number of seconds above 0 or a duration such as "
                              "\"10m\" or \"1h30m\", not 'soon'."),
    ('max_duration = -5', "canary.max_duration must be a number of seconds above 0"),
    ('margin = 1.5', "canary.margin must be in (0, 1) (the tolerated increase of the failure rate, a fraction: "
                     "0.05 is 5 %), not 1.5."),
    ('margin = 0', "canary.margin must be in (0, 1)"),
    ('alpha = "0.01"', "canary.alpha must be a number (the chance of rolling back a release as good as the old "
                       "one: 0.01 is 1 %), not a string '0.01'."),
    ('confidence = 0.3', "canary.confidence must be in (0.5, 1)"),
    ('crash_limit = true', "canary.crash_limit must be a whole number, not a boolean True."),
    ('ignore_exceptions = "Reject"', "canary.ignore_exceptions must be an array of exception type names"),
    ('min_task = 5', "canary.min_task is not a setting (did you mean 'min_tasks'?)."),
    ('max_duration = "1m"\nlook_interval = "2m"', "canary.look_interval (120 s) is longer than canary.max_duration "
                                                  "(60 s): the canary would end before its first look"),
]


@pytest.mark.parametrize(("line", "sentence"), BAD, ids=[b[0].split(" ")[0] + str(i) for i, b in enumerate(BAD)])
def test_bad_canary_values_give_their_sentence(tmp_path: Path, line: str, sentence: str) -> None:
    write(tmp_path / "celeryops.toml", f"[canary]\n{line}\n")
    with pytest.raises(UserError) as info:
        load_config(None, tmp_path, {}, {})
    message = str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    assert sentence in message
    assert message.endswith("Nothing was run; fix the configuration and try again.") and "\n" not in message


def test_canary_must_be_a_table_and_problems_come_together(tmp_path: Path) -> None:
    write(tmp_path / "celeryops.toml", 'canary = 5\n')
    with pytest.raises(UserError, match=r"canary must be a table \(\[canary\]\), not an integer\."):
        load_config(None, tmp_path, {}, {})
    write(tmp_path / "celeryops.toml", '[canary]\nmin_tasks = 0\nalpha = 2\n')
    with pytest.raises(UserError, match=r"has 2 problems: canary\.min_tasks .* canary\.alpha"):
        load_config(None, tmp_path, {}, {})


def test_the_readme_documents_every_key_with_its_default() -> None:
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", readme, flags=re.M))
    defaults = CanarySettings()
    for key in CANARY_KEYS:
        assert key in rows, f"[canary] {key} is not in the README's table"
        value = getattr(defaults, key)
        shown = rows[key].split()[0]
        assert shown == ("`[]`" if value == () else f"{value:g}"), (key, shown, value)
