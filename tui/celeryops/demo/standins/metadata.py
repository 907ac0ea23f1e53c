"""Cloud Run's metadata server, as far as the worker side reads it: ``/computeMetadata/v1/instance/id``.

One HTTP server per process (:func:`shared`) answers for every instance the stand-in's launchers start: each
instance gets ``GCE_METADATA_HOST=<address>/i/<its id>`` (:func:`instance_env`), so its worker reads an id of its
own, as on Cloud Run, and the launcher knows the node name the fence plugin will give it. Like the real server it
answers only requests that carry ``Metadata-Flavor: Google``.
"""

from __future__ import annotations

import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from celeryops.core.instance import ENV_METADATA_HOST, METADATA_PATH, InstanceId, unique_node_name


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        head, _, rest = self.path.lstrip("/").partition("/")
        ident, _, path = rest.partition("/")
        if head != "i" or not ident or "/" + path != METADATA_PATH:
            self.send_error(404)
            return
        if self.headers.get("Metadata-Flavor") != "Google":
            self.send_error(403, "Missing Metadata-Flavor:Google header")
            return
        body = ident.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/text")
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class MetadataStandIn:
    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="metadata-standin", daemon=True)
        self._thread.start()

    def host_for(self, instance: str) -> str:
        """What ``GCE_METADATA_HOST`` is set to in the instance ``instance``."""
        return f"{self.address}/i/{instance}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


_lock = threading.Lock()
_shared: MetadataStandIn | None = None


def shared() -> MetadataStandIn:
    """This process's metadata stand-in, started on first use (a daemon thread)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = MetadataStandIn()
        return _shared


def instance_env(revision: str) -> tuple[dict[str, str], str]:
    """A new instance's metadata environment and the node name a worker with the default name (``celery@%h``) and
    the fence plugin takes on it."""
    ident = uuid.uuid4().hex + uuid.uuid4().hex
    env = {ENV_METADATA_HOST: shared().host_for(ident)}
    return env, unique_node_name(f"celery@{socket.gethostname()}", revision, InstanceId(ident, "metadata"))
