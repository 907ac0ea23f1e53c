"""Every command the README documents exists with the flags it documents (their behaviour is tested elsewhere),
and the README starts with the two set-up commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def documented_commands() -> list[str]:
    blocks = re.findall(r"```(?:sh|console|)\n(.*?)```", README, flags=re.S)
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
