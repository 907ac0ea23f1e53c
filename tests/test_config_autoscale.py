"""Issue 36: the ``[autoscale]`` table of celeryops.toml: every key, durations as seconds or strings, defaults, and
one sentence per bad value (min above max among them: exit code 2, all problems together, nothing run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from celeryops.core.autoscale import AUTOSCALE_KEYS, AutoscaleSettings
from celeryops.core.configload import load_config
from celeryops.core.errors import EXIT_USAGE, UserError


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def test_every_autoscale_key(tmp_path: Path) -> None:
    write(tmp_path / "celeryops.toml", """
[autoscale]
target = "gpu-pool"
min_instances = 0
max_instances = 40
interval = "10s"
idle_after = "5m"
tasks_per_instance = 2
queues = ["gpu", "gpu"]
max_step = 4
drain_timeout = 90
slot_resource = "gpu"
""")
    settings = load_config(None, tmp_path, {}, {}).autoscale
    assert settings == AutoscaleSettings(target="gpu-pool", min_instances=0, max_instances=40, interval=10.0,
                                         idle_after=300.0, tasks_per_instance=2, queues=("gpu",), max_step=4,
                                         drain_timeout=90.0, slot_resource="gpu")
    assert AutoscaleSettings.from_dict(settings.to_dict()) == settings


def test_defaults_and_pyproject(tmp_path: Path) -> None:
    assert load_config(None, tmp_path, {}, {}).autoscale == AutoscaleSettings()
    write(tmp_path / "pyproject.toml", "[tool.celeryops.autoscale]\nmax_instances = 3\nidle_after = 0\n")
    settings = load_config(None, tmp_path, {}, {}).autoscale
    assert (settings.min_instances, settings.max_instances, settings.interval, settings.idle_after) == (1, 3, 5.0, 0.0)


BAD = [
    ("min_instances = 5\nmax_instances = 2", "autoscale.min_instances (5) is more than autoscale.max_instances (2): "
                                            "no instance count satisfies both; lower min_instances or raise "
                                            "max_instances."),
    ("min_instances = 12", "autoscale.min_instances (12) is more than autoscale.max_instances (10)"),
    ("max_instances = 0", "autoscale.max_instances must be at least 1, not 0."),
    ("max_instances = 101", "autoscale.max_instances must be at most 100, not 101"),
    ("min_instances = -1", "autoscale.min_instances must be at least 0, not -1."),
    ('min_instances = "two"', "autoscale.min_instances must be a whole number, not a string 'two'."),
    ("interval = 0", "autoscale.interval must be a number of seconds above 0 or a duration such as \"90s\" or "
                     "\"2m\", not 0."),
    ('idle_after = "soon"', "autoscale.idle_after must be a number of seconds 0 or more"),
    ("drain_timeout = -3", "autoscale.drain_timeout must be a number of seconds above 0"),
    ('queues = "gpu"', "autoscale.queues must be an array of queue names such as [\"gpu\"], not a string 'gpu'."),
    ('target = ""', "autoscale.target must be a non-empty string"),
    ("max_instance = 5", "autoscale.max_instance is not a setting (did you mean 'max_instances'?)."),
]


@pytest.mark.parametrize(("line", "sentence"), BAD, ids=[b[0].split(" ")[0] + str(i) for i, b in enumerate(BAD)])
def test_bad_autoscale_values_give_their_sentence(tmp_path: Path, line: str, sentence: str) -> None:
    write(tmp_path / "celeryops.toml", f"[autoscale]\n{line}\n")
    with pytest.raises(UserError) as info:
        load_config(None, tmp_path, {}, {})
    message = str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    assert sentence in message
    assert message.endswith("Nothing was run; fix the configuration and try again.") and "\n" not in message


def test_autoscale_must_be_a_table(tmp_path: Path) -> None:
    write(tmp_path / "celeryops.toml", "autoscale = 5\n")
    with pytest.raises(UserError, match=r"autoscale must be a table \(\[autoscale\]\), not an integer\."):
        load_config(None, tmp_path, {}, {})


def test_the_readme_documents_every_key_with_its_default() -> None:
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Autoscaling", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", section, flags=re.M))
    defaults = AutoscaleSettings()
    for key in AUTOSCALE_KEYS:
        assert key in rows, f"[autoscale] {key} is not in the README's table"
        value = getattr(defaults, key)
        shown = rows[key].split()[0]
        expected = "`[]`" if value == () else '`""`' if value == "" else f"{value:g}"
        assert shown == expected, (key, shown, value)
