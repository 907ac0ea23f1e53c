"""Deploy by running the target's shell command (``kind = "command"``), e.g. ``kubectl set image ...``.

Placeholders ``{image}``, ``{sha}``, ``{short_sha}`` and ``{release}`` are replaced by shell-quoted values. Output
lines (stdout and stderr together) become progress events as they arrive; a non-zero exit status or the
target's timeout is a DeployError carrying the last lines. On timeout or cancellation the whole process group is
terminated (then killed after a grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
from collections import deque

from celeryops.adapters.deploy.base import (
    CommandOutput,
    DeployError,
    DeployResult,
    Outcome,
    ProgressCallback,
    RolloutReady,
    RolloutStarted,
    RolloutState,
)
from celeryops.core.config import Target, expand
from celeryops.core.errors import EXIT_TIMEOUT
from celeryops.core.masking import mask_text


def render_command(target: Target, image: str, sha: str = "", release: str = "") -> str:
    """The target's command with every placeholder replaced by its shell-quoted value."""
    values = {"image": image, "sha": sha, "short_sha": sha[:7], "release": release}
    return expand(target.command, {k: shlex.quote(v) for k, v in values.items()})


class CommandDeployer:
    """Deployer for ``command`` targets. ``tail_lines``: how many last lines a failure quotes;
    ``kill_grace``: seconds between SIGTERM and SIGKILL of the process group."""

    def __init__(self, *, tail_lines: int = 5, kill_grace: float = 5.0, shell: str = "/bin/sh") -> None:
        self.tail_lines = tail_lines
        self.kill_grace = kill_grace
        self.shell = shell

    async def current(self, target: Target) -> RolloutState:
        """A command has no readable state: only the target name is known."""
        return RolloutState(resource=target.name)

    async def missing_permissions(self, target: Target) -> list[str]:
        """A command's permissions cannot be checked in advance."""
        return []

    async def validate(self, target: Target, image: str) -> None:
        """A command cannot be tried without running it: nothing to validate."""

    async def close(self) -> None:
        """A command holds no connection."""

    async def rollout_outcome(self, target: Target, started: RolloutState, image: str) -> Outcome:
        """A command's effect cannot be verified: always ``unknown``."""
        return "unknown"

    async def deploy(self, target: Target, image: str, on_progress: ProgressCallback, *, sha: str = "",
                     release: str = "") -> DeployResult:
        command = render_command(target, image, sha, release)
        proc = await asyncio.create_subprocess_exec(
            self.shell, "-c", command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, limit=1 << 20)
        on_progress(RolloutStarted(target.name, image))
        tail: deque[str] = deque(maxlen=self.tail_lines)

        async def pump() -> None:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = mask_text(raw.decode(errors="replace").rstrip("\r\n"))
                tail.append(line)
                on_progress(CommandOutput(target.name, line))

        try:
            await asyncio.wait_for(asyncio.gather(pump(), proc.wait()), timeout=target.timeout)
        except TimeoutError:
            await self._terminate(proc)
            raise DeployError(f"The deploy command of target {target.name!r} did not finish within "
                              f"{target.timeout:g} s and was stopped{_last(tail)}: the deploy may be half done; check "
                              "the target before deploying again.", code="TIMEOUT", exit_code=EXIT_TIMEOUT) from None
        except BaseException:
            await self._terminate(proc)
            raise
        if proc.returncode != 0:
            raise DeployError(f"The deploy command of target {target.name!r} failed with exit status "
                              f"{proc.returncode}{_last(tail)}: fix the command or the target and deploy again.",
                              code="EXIT_STATUS")
        on_progress(RolloutReady(target.name, ""))
        return DeployResult(target.name, image=image)

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=self.kill_grace)
                return
            except TimeoutError:
                continue


def _last(tail: deque[str]) -> str:
    lines = [line for line in tail if line.strip()]
    return f" (last output: {' | '.join(lines)})" if lines else " (no output)"
