"""Which container instance runs this worker, and a node name of its own for it (worker side: stdlib only).

On Cloud Run every instance's hostname is ``localhost``, so Celery's default node name ``celery@%h`` is the same on
every instance of every revision: nothing could count, address or tell instances apart by node name. Here:

- :func:`instance_id`: on Cloud Run (``CLOUD_RUN_WORKER_POOL`` or ``K_SERVICE`` set) the metadata server's
  ``instance/id`` (``$GCE_METADATA_HOST`` or ``metadata.google.internal``; at most :data:`METADATA_TIMEOUT` in all),
  else a random id made once per container start. The id is kept in ``$CELERYOPS_INSTANCE_ID`` together with the pid
  of the process that made it, so that the worker's pool children (and the slots plugin) read the same id, while a
  process that inherits it from elsewhere (its parent's parent) makes its own.
- :func:`unique_node_name`: ``celery@localhost`` -> ``celery@<revision>.<8 hex of the id>`` when the host part is
  the machine's default hostname; a node name the user made unique (``-n``) stays as it is.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import urllib.request
import uuid
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

ENV_CACHE = "CELERYOPS_INSTANCE_ID"
ENV_METADATA_HOST = "GCE_METADATA_HOST"
DEFAULT_METADATA_HOST = "metadata.google.internal"
METADATA_PATH = "/computeMetadata/v1/instance/id"
METADATA_TIMEOUT = 1.0
DEFAULT_HOSTS = frozenset({"localhost", "localhost.localdomain"})


def on_cloud_run(environ: Mapping[str, str]) -> bool:
    """Whether Cloud Run runs this container (a worker pool's or a service's instance)."""
    return bool(environ.get("CLOUD_RUN_WORKER_POOL") or environ.get("K_SERVICE"))


def revision_of(environ: Mapping[str, str]) -> str:
    """The instance's Cloud Run revision (a worker pool's, else a service's), ``""`` outside Cloud Run."""
    return environ.get("CLOUD_RUN_WORKER_POOL_REVISION") or environ.get("K_REVISION") or ""


@dataclass(frozen=True)
class InstanceId:
    """``value``: the id; ``source``: ``metadata`` (Cloud Run's metadata server), ``random`` (made at this container
    start) or ``inherited`` (read from the process that made it); ``problem``: why the metadata server gave none."""

    value: str
    source: str
    problem: str = ""

    @property
    def short(self) -> str:
        """8 hex characters derived from the id: readable in a node name, distinct between instances."""
        return hashlib.sha1(self.value.encode()).hexdigest()[:8]


def metadata_url(environ: Mapping[str, str]) -> str:
    host = (environ.get(ENV_METADATA_HOST) or DEFAULT_METADATA_HOST).strip().rstrip("/")
    return f"http://{host}{METADATA_PATH}"


def read_metadata_id(environ: Mapping[str, str], timeout: float = METADATA_TIMEOUT) -> tuple[str, str]:
    """Ask the metadata server for the instance id, in at most ``timeout`` seconds in all (name lookup included: the
    request runs on a daemon thread that is abandoned at the deadline). Returns ``(id, "")`` or ``("", why)``."""
    url = metadata_url(environ)
    result: dict[str, str] = {}

    def ask() -> None:
        try:
            request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
            # the join below is the deadline; the socket's own timeout only ends an abandoned thread
            with urllib.request.urlopen(request, timeout=timeout + 2) as reply:
                result["id"] = reply.read(4096).decode("utf-8", "replace").strip()
        except Exception as exc:  # any failure means: no id from there
            result["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=ask, name="celeryops-metadata", daemon=True)
    thread.start()
    thread.join(timeout)
    if result.get("id"):
        return result["id"], ""
    why = result.get("error") or f"no answer within {timeout:g} s"
    return "", f"the metadata server at {url} gave no instance id ({why})"


_lock = threading.Lock()
_cached: InstanceId | None = None


def _from_cache(environ: Mapping[str, str]) -> InstanceId | None:
    pid, _, value = (environ.get(ENV_CACHE) or "").partition(":")
    if value and pid in (str(os.getpid()), str(os.getppid())):
        return InstanceId(value, "inherited")
    return None


def instance_id(environ: MutableMapping[str, str] | None = None, *, timeout: float = METADATA_TIMEOUT) -> InstanceId:
    """This container instance's id (see the module), made once per process tree and cached in ``environ``
    (``os.environ`` by default) for the child processes."""
    global _cached
    env = os.environ if environ is None else environ
    with _lock:
        if environ is None and _cached is not None:
            return _cached
        found = _from_cache(env)
        if found is None:
            value, problem = read_metadata_id(env, timeout) if on_cloud_run(env) else ("", "")
            found = InstanceId(value, "metadata") if value else InstanceId(uuid.uuid4().hex, "random", problem)
            env[ENV_CACHE] = f"{os.getpid()}:{found.value}"
        if environ is None:
            _cached = found
        return found


def forget_cached() -> None:
    """Drop this process's memory of its id (the next :func:`instance_id` reads the environment again)."""
    global _cached
    with _lock:
        _cached = None


def is_default_host(host: str) -> bool:
    """Whether ``host`` (a node name's host part) is the machine's default hostname, which every Cloud Run instance
    shares."""
    names = {socket.gethostname()} | DEFAULT_HOSTS
    return host in names or host.split(".")[0] in {n.split(".")[0] for n in names if n}


def instance_host(environ: Mapping[str, str], ident: InstanceId) -> str:
    """The instance as a host name: ``<revision>.<short id>`` (``<short id>`` outside Cloud Run revisions)."""
    revision = revision_of(environ)
    return f"{revision}.{ident.short}" if revision else ident.short


def unique_node_name(nodename: str, revision: str, ident: InstanceId) -> str:
    """``name@<revision>.<short id>`` for a node name whose host part is the default hostname; else unchanged."""
    name, sep, host = nodename.partition("@")
    if not sep:
        name, host = "celery", nodename
    if not is_default_host(host):
        return nodename
    return f"{name}@{revision + '.' if revision else ''}{ident.short}"


RENAME_UID = "celeryops.core.instance.rename"
_renamed: dict[str, str] = {}


def connect_rename() -> None:
    """Make every worker started in this process take a node name of its own on Cloud Run (idempotent: the fence and
    the slots plugins both call it). A ``celeryd_init`` handler: Celery sends it from ``WorkController.__init__``
    (``celery/apps/worker.py``, ``on_before_init``) after the node name is set and before the pool, the consumer,
    its pidbox and its event dispatcher read it, so a name set there is the name everywhere."""
    from celery.signals import celeryd_init

    celeryd_init.connect(_on_celeryd_init, dispatch_uid=RENAME_UID, weak=False)


def _on_celeryd_init(sender: object = None, instance: object = None, **_: object) -> None:
    import logging

    if instance is None or not on_cloud_run(os.environ):
        return
    old = str(getattr(instance, "hostname", "") or sender or "")
    ident = instance_id()
    new = unique_node_name(old, revision_of(os.environ), ident)
    if new == old:
        return
    instance.hostname = new  # type: ignore[attr-defined]
    app = getattr(instance, "app", None)
    if app is not None:  # the tracer keeps the name it was set up with (task.request.hostname): set it up again
        from celery.app.trace import setup_worker_optimizations

        setup_worker_optimizations(app, new)
    if _renamed.get(old) != new:
        _renamed[old] = new
        note = f"; {ident.problem}, so a random id made at this start names it" if ident.problem else ""
        logging.getLogger("celeryops").warning(
            "celeryops: node name %s is the same on every Cloud Run instance (their hostname is the default): this "
            "instance runs as %s (instance id from %s%s)", old, new, ident.source, note)
