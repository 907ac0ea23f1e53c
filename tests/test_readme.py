"""Every command the README documents exists with the flags it documents (their behaviour is tested elsewhere),
the README starts with the two set-up commands, its CI recipes are valid YAML naming only real commands and flags,
and every preflight check id is listed."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def documented_commands() -> list[str]:
    fenced = re.findall(r"^```(\w*)\n(.*?)^```", README, flags=re.S | re.M)  # opening and closing fence pairs
    blocks = [body for lang, body in fenced if lang in ("sh", "console", "")]
    lines = [ln.split("#", 1)[0].strip() for b in blocks for ln in b.splitlines()]
    return sorted({ln for ln in lines if ln.startswith("celeryops ") and not ln.startswith("celeryops --")})


def test_readme_starts_with_the_two_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, flags=re.S)
    assert first_block is not None
    commands = [ln.split("#")[0].strip() for ln in first_block.group(1).splitlines() if ln.strip()]
    assert commands == ["make demo", "make test"]


@pytest.mark.parametrize("line", documented_commands())
def test_documented_command_and_flags_exist(line: str) -> None:
    words = line.split()
    sub = [] if words[1].startswith("[") else [words[1]]  # bare `celeryops [options]`: the console
    result = subprocess.run([sys.executable, "-m", "celeryops", *sub, "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    flags = set(re.findall(r"(--[a-z][a-z-]*|-[A-Za-z])\b", line))
    missing = sorted(f for f in flags if f not in result.stdout)
    assert not missing, f"`celeryops {' '.join(sub)} --help` lacks {missing}"


def test_readme_documents_every_command() -> None:
    result = subprocess.run([sys.executable, "-m", "celeryops", "--help"], capture_output=True, text=True, timeout=60)
    listed = set(re.findall(r"^  ([a-z]+)\s", result.stdout, flags=re.M))
    documented = {line.split()[1] for line in documented_commands() if not line.split()[1].startswith("[")}
    assert listed and listed <= documented, f"undocumented commands: {sorted(listed - documented)}"


def yaml_blocks() -> list[object]:
    return [yaml.safe_load(block) for block in re.findall(r"^```yaml\n(.*?)^```", README, flags=re.S | re.M)]


def _strings(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return []


def ci_invocations() -> list[list[str]]:
    """Every `celeryops SUBCOMMAND ...` in the YAML blocks' strings, as words up to a shell operator."""
    found: list[list[str]] = []
    for block in yaml_blocks():
        for text in _strings(block):
            for line in text.splitlines():
                words = shlex.split(line, comments=True)
                for i, word in enumerate(words):
                    if word == "celeryops" and i + 1 < len(words) and not words[i + 1].startswith("-"):
                        rest = words[i + 1:]
                        stop = next((n for n, w in enumerate(rest) if w in ("|", "||", "&&", ";")), len(rest))
                        found.append(rest[:stop])
    return found


def test_ci_recipes_are_valid_yaml_and_deploy_as_documented() -> None:
    blocks = yaml_blocks()
    assert len(blocks) >= 2 and all(isinstance(b, dict) for b in blocks)
    github, cloudbuild = blocks[0], blocks[1]
    assert isinstance(github, dict) and {"deploy", "recover"} <= set(github["jobs"])
    assert isinstance(cloudbuild, dict) and cloudbuild["steps"]
    calls = ci_invocations()
    assert ["deploy", "$RELEASE", "--yes", "--json"] in calls  # GitHub Actions
    assert ["deploy", "$$RELEASE", "--yes", "--json"] in calls  # Cloud Build ($$: a shell variable there)
    assert {c[0] for c in calls} >= {"deploy", "status", "abort"}


@pytest.mark.parametrize("words", ci_invocations(), ids=lambda w: " ".join(w))
def test_ci_recipes_name_only_real_commands_and_flags(words: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "celeryops", words[0], "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    real = set(re.findall(r"(--[a-z][a-z-]*|-[A-Za-z])\b", result.stdout))
    flags = [w.split("=", 1)[0] for w in words[1:] if w.startswith("-")]
    assert flags and not [f for f in flags if f not in real], f"`celeryops {words[0]}` has no {flags}"


def test_every_check_id_is_documented_and_accept_warning_is_real() -> None:
    from celeryops.core.config import PREFLIGHT_CHECKS, WARNING_CHECKS

    table = re.findall(r"^\| `([a-z0-9_]+)` \|", README, flags=re.M)
    assert set(PREFLIGHT_CHECKS) <= set(table), sorted(set(PREFLIGHT_CHECKS) - set(table))
    assert "`[preflight] accept = [\"fence\"]`" in README and all(f"`{c}`" in README for c in WARNING_CHECKS)
    help_text = subprocess.run([sys.executable, "-m", "celeryops", "deploy", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    assert "--accept-warning ID" in help_text and "--accept-warnings" in help_text
