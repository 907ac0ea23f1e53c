"""The ``celeryops_fence`` remote-control command (worker side) and ``fence_status`` (operator side).

Plugin workers answer ``{"plugin": True, version, revision, cloudrun_kind, cloudrun_name, state, queues, held_queues,
fence_run_id, features, ...}``;
workers without the plugin answer Celery's unknown-command error (or nothing), so preflight and the console can
tell which workers run the plugin. Only celery/kombu are used here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from celeryops.core.errors import BrokerUnreachable
from celeryops.core.masking import mask_url
from celeryops.core.namespace import OBSERVE_COMMAND

if TYPE_CHECKING:  # celery.worker.control is imported where the commands are registered (it is a worker's)
    from celery import Celery

COMMAND = "celeryops_fence"
# The attribute of the Celery consumer where the plugin keeps its guard (see celeryops.fence.plugin).
CONSUMER_ATTR = "celeryops_fence"


class StatusSource(Protocol):
    def status(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class FenceReply:
    """One worker's answer. ``plugin`` False: it answered, but does not run the plugin (``error`` says why)."""

    worker: str
    plugin: bool
    fleet: str = ""  # the fleet whose fence it follows ($CELERYOPS_FLEET on the worker); "" from older plugins
    version: str = ""
    revision: str = ""
    cloudrun_kind: str = ""  # "worker-pool" | "service" | "" (outside Cloud Run, or an older plugin)
    cloudrun_name: str = ""
    state: str = ""
    queues: tuple[str, ...] = ()
    held_queues: tuple[str, ...] = ()
    fence_run_id: str = ""
    fence_readable: bool = True
    beats: int = 0
    consumer_starts: int = 0
    features: tuple[str, ...] = ()  # what the plugin understands beyond the first fence record ("" from older ones)
    error: str = ""
    instance_id: str = ""  # the container instance it runs in ("" from older plugins)

    @classmethod
    def parse(cls, worker: str, reply: object) -> FenceReply:
        if not isinstance(reply, Mapping) or reply.get("plugin") is not True:
            error = str(reply.get("error", "")) if isinstance(reply, Mapping) else repr(reply)
            return cls(worker=worker, plugin=False, error=error)
        return cls(
            worker=worker,
            plugin=True,
            fleet=str(reply.get("fleet") or ""),
            version=str(reply.get("version") or ""),
            revision=str(reply.get("revision") or ""),
            cloudrun_kind=str(reply.get("cloudrun_kind") or ""),
            cloudrun_name=str(reply.get("cloudrun_name") or ""),
            state=str(reply.get("state") or ""),
            queues=tuple(str(q) for q in reply.get("queues") or ()),
            held_queues=tuple(str(q) for q in reply.get("held_queues") or ()),
            fence_run_id=str(reply.get("fence_run_id") or ""),
            fence_readable=bool(reply.get("fence_readable", True)),
            beats=int(reply.get("beats") or 0),
            consumer_starts=int(reply.get("consumer_starts") or 0),
            features=tuple(str(f) for f in reply.get("features") or ()),
            instance_id=str(reply.get("instance_id") or ""),
        )


def _celeryops_fence(state: Any, **_: Any) -> dict[str, Any]:
    """Drain fence plugin status of this worker (celeryops)."""
    guard: StatusSource | None = getattr(state.consumer, CONSUMER_ATTR, None)
    if guard is None:
        return {"plugin": False, "error": "the celeryops fence plugin is installed but its consumer step has not run"}
    return guard.status()


def _celeryops_observe(state: Any, **_: Any) -> dict[str, Any]:
    """Active, reserved and scheduled tasks and the consumed queues of this worker in one reply (celeryops): one
    drain observation costs one round trip instead of four."""
    from celery.worker import control

    return {"active": control.active(state), "reserved": control.reserved(state),
            "scheduled": control.scheduled(state), "active_queues": control.active_queues(state)}


def register_command() -> None:
    """Add the commands to Celery's (process-global) control panel; idempotent."""
    from celery.worker.control import Panel, inspect_command

    for name, handler in ((COMMAND, _celeryops_fence), (OBSERVE_COMMAND, _celeryops_observe)):
        if name not in Panel.data:
            decorate: Callable[[Callable[..., dict[str, Any]]], object] = inspect_command(name=name)
            decorate(handler)


def fence_status(app: Celery, destination: Sequence[str] | None = None, timeout: float = 1.0) -> dict[str, FenceReply]:
    """Ask workers (all, or ``destination``) for their fence plugin status; every worker that answered is in the
    result, with ``plugin`` False when it runs without the plugin. Returns as soon as every addressed worker replied.
    Raises BrokerUnreachable (nothing changed) when the broker cannot be reached."""
    dest = list(destination) if destination else None
    replies = _ask(app, destination=dest, timeout=timeout, limit=len(dest) if dest else None)
    return {reply.worker: reply for reply in _parse(replies)}


def every_reply(app: Celery, timeout: float = 1.0) -> list[FenceReply]:
    """Ask every worker for its fence status and wait the whole ``timeout``: one reply per worker *process*, also
    when several share a node name (on Cloud Run every default name is ``celery@localhost``), which
    :func:`fence_status` folds into one. Raises BrokerUnreachable (nothing changed)."""
    return _parse(_ask(app, timeout=timeout))


def _ask(app: Celery, *, timeout: float, destination: list[str] | None = None, limit: int | None = None) -> Any:
    """The fence command's broadcast and its replies; BrokerUnreachable (nothing changed) when the broker cannot be
    reached."""
    from kombu.exceptions import OperationalError

    try:
        return app.control.broadcast(COMMAND, destination=destination, reply=True, timeout=timeout, limit=limit)
    except (OSError, OperationalError) as exc:
        url = mask_url(str(app.conf.broker_url or ""))
        raise BrokerUnreachable(
            f"could not reach the broker {url} to ask workers for their fence status ({exc.__class__.__name__}); "
            "nothing was changed; check that the broker is running and the URL is right"
        ) from exc


def _parse(replies: object) -> list[FenceReply]:
    out: list[FenceReply] = []
    for item in replies if isinstance(replies, list) else []:
        if isinstance(item, Mapping):
            for worker, reply in item.items():
                out.append(FenceReply.parse(str(worker), reply))
    return out
