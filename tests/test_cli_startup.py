"""Start-up: the command line imports a subcommand's module only when that subcommand runs, ``--help`` lists the
subcommands from cli.COMMAND_TABLE exactly as click would from the modules, and ``--version`` / ``--help`` /
``status`` / the worker-side modules load nothing they do not need (checked with ``python -X importtime``)."""

from __future__ import annotations

import copy
import importlib
import pkgutil
import subprocess
import sys

import click
import pytest

from celeryops import cli, commands
from celeryops.demo.standins.redis_server import free_port

CONSOLE_ONLY = ("textual", "grpc", "google", "rich")
HEAVY = ("celery", "kombu", "redis", "humanize", "platformdirs", *CONSOLE_ONLY)


def imported(args: list[str], code: str | None = None) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Top-level names and celeryops modules a fresh process imported (from ``-X importtime``)."""
    cmd = [sys.executable, "-X", "importtime", *(["-c", code] if code else ["-m", "celeryops", *args])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    names: set[str] = set()
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            module = line.rsplit("|", 1)[1].strip()
            names.add(module if module.startswith("celeryops") else module.split(".")[0])
    return names, out


def first_paragraph(command: click.Command) -> str:
    text = command.help or ""
    end = text.find("\n\n")
    return " ".join((text[:end] if end != -1 else text).split())


def real_commands() -> dict[str, tuple[str, click.Command]]:
    found: dict[str, tuple[str, click.Command]] = {}
    for info in pkgutil.iter_modules(commands.__path__):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        for command in getattr(module, "COMMANDS", []):
            found[str(command.name)] = (info.name, command)
    return found


def test_the_command_table_is_the_commands_of_the_modules() -> None:
    real = real_commands()
    table = {name: (module, first_paragraph(command)) for name, (module, command) in real.items()}
    assert table == cli.COMMAND_TABLE, "update cli.COMMAND_TABLE to:\n" + "\n".join(
        f"    {name!r}: {value!r}," for name, value in sorted(table.items()))
    assert all(not command.hidden and not command.short_help for _, command in real.values())


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_help_lists_what_click_lists_from_the_loaded_commands(width: int) -> None:
    lazy = copy.copy(cli.main)
    lazy.commands = {}
    eager = copy.copy(cli.main)
    eager.commands = {}
    for name in cli.COMMAND_TABLE:
        assert eager.get_command(click.Context(eager), name) is not None  # imports and registers the command
    assert set(eager.commands) == set(cli.COMMAND_TABLE)

    def help_text(group: click.Group) -> str:
        ctx = click.Context(group, info_name="celeryops", terminal_width=width, max_content_width=width)
        return group.get_help(ctx)

    text = help_text(lazy)
    assert not lazy.commands  # listing imported nothing
    assert text == help_text(eager)
    assert "Commands:" in text and "status" in text


def test_a_subcommand_is_imported_when_it_runs_and_unknown_ones_are_click_errors() -> None:
    names, out = imported(["runs", "--help"])
    assert out.returncode == 0 and "List the runs recorded" in out.stdout
    # (importlib.import_module is not logged by -X importtime; what the modules import is)
    assert "celeryops.ops.journal" in names  # imported by commands/runs.py
    assert not {"celeryops.ops.run.runner", "celeryops.ops.release", "celeryops.demo.sandbox", "textual"} & names
    _, out = imported(["nosuch"])
    assert out.returncode == 2 and "No such command 'nosuch'" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["-h"]])
def test_version_and_help_load_only_click(args: list[str]) -> None:
    names, out = imported(args)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("celeryops, version" in out.stdout) if args == ["--version"] else ("Commands:" in out.stdout)
    assert not set(HEAVY) & names, sorted(set(HEAVY) & names)
    assert not {n for n in names if n.startswith(("celeryops.ops", "celeryops.adapters", "celeryops.console",
                                                   "celeryops.commands."))} - {"celeryops.commands.common"}


def test_status_loads_neither_the_console_nor_google_cloud_run(tmp_path: object) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    names, out = imported(["status", "--json", "--broker", dead, "--state-dir", str(tmp_path)])
    assert out.returncode == 0 and '"fleet": "default"' in out.stdout, out.stderr[-2000:]
    assert not set(CONSOLE_ONLY) & names, sorted(set(CONSOLE_ONLY) & names)
    assert not {n for n in names if n.startswith(("celeryops.console", "celeryops.adapters.deploy"))}
    assert not {"celery", "kombu"} & names  # a Redis URL given as such needs no Celery app to be read


@pytest.mark.parametrize("module", ["celeryops.fence", "celeryops.slots"])
def test_worker_side_modules_load_no_operator_side_package(module: str) -> None:
    names, out = imported([], code=f"import {module}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert not {"textual", "grpc", "google", "humanize", "platformdirs", "rich"} & names
    assert not {n for n in names if n.startswith(("celeryops.ops", "celeryops.adapters", "celeryops.console",
                                                   "celeryops.commands", "celeryops.core.config"))}


def test_the_console_starts_without_google_cloud_run() -> None:
    """The console's app and backend show rollout events but load google-cloud-run (~0.35 s) only for a deploy."""
    names, out = imported([], code="import celeryops.commands.console, celeryops.console.app, "
                                   "celeryops.ops.backend.console")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "textual" in names and not {"google", "grpc"} & names, sorted({"google", "grpc"} & names)
    assert "celeryops.adapters.deploy.cloudrun" not in names
