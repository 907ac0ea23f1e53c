"""An image registry in this process for tests and the demo, speaking the Docker Registry HTTP API v2.

``RegistryStandIn`` is a threaded ``http.server`` on ``127.0.0.1:0`` keeping blobs and manifests in memory. It
serves what a push and a lookup need: ``/v2/`` ping, blob uploads (``POST`` + ``PATCH``/``PUT``, or monolithic),
blob ``HEAD``/``GET``, manifest ``HEAD``/``GET``/``PUT`` by tag or digest, honouring ``Accept`` like the real
registry. With ``auth=True`` it answers ``401`` with a ``Bearer`` challenge and hands out tokens at ``/token``;
repositories listed in ``private`` get tokens that grant nothing (so the "still 401 after auth" path is real), and
``static_tokens`` are accepted everywhere (stand-ins for Google access tokens). Every request is recorded
(``requests``) so tests can check what a client sent.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

from celeryops.demo.standins.registry_images import DOCKER_MANIFEST, build_manifest, sha256_digest

_NAME = r"(?P<name>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
_MANIFEST_PATH = re.compile(rf"^/v2/{_NAME}/manifests/(?P<ref>[^/]+)$")
_BLOB_PATH = re.compile(rf"^/v2/{_NAME}/blobs/(?P<digest>sha256:[0-9a-f]{{64}})$")
_UPLOAD_START = re.compile(rf"^/v2/{_NAME}/blobs/uploads/?$")
_UPLOAD_PATH = re.compile(rf"^/v2/{_NAME}/blobs/uploads/(?P<upload>[0-9a-f]+)$")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    accept: str
    authorization: str


@dataclass
class _Store:
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[tuple[str, str], tuple[str, bytes]] = field(default_factory=dict)  # (name, digest) -> (type, body)
    tags: dict[tuple[str, str], str] = field(default_factory=dict)  # (name, tag) -> digest
    uploads: dict[str, bytearray] = field(default_factory=dict)
    tokens: dict[str, str | None] = field(default_factory=dict)  # token -> repository it grants (None: nothing)
    lock: threading.Lock = field(default_factory=threading.Lock)


class LoopbackRegistry:
    """A registry for tests and the demo on a loopback ``port``. Use as a context manager or ``start()``/``stop()``."""

    @property
    def port(self) -> int:
        raise NotImplementedError

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``: the registry part of image references."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class RegistryStandIn(LoopbackRegistry):
    """A v2 registry in this process. Use as a context manager or ``start()``/``stop()``."""

    def __init__(
        self, *, auth: bool = False, private: Iterable[str] = (), static_tokens: Iterable[str] = (),
        service: str = "celeryops-standin",
    ) -> None:
        self.auth = auth
        self.private = frozenset(private)
        self.static_tokens = frozenset(static_tokens)
        self.service = service
        self.requests: list[RecordedRequest] = []
        self._store = _Store()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> Self:
        handler = type("Handler", (_Handler,), {"registry": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="registry-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def port(self) -> int:
        assert self._server is not None, "the stand-in is not running"
        return int(self._server.server_address[1])

    # -- direct seeding (the demo) -------------------------------------------------------------------------------
    def seed(self, name: str, tag: str, media_type: str = DOCKER_MANIFEST) -> str:
        """Store an image without going through HTTP; returns the manifest digest."""
        config = json.dumps({"architecture": "amd64", "os": "linux", "tag": tag}).encode()
        layer = f"{name}:{tag}".encode()
        manifest = build_manifest(config, [layer], media_type)
        digest = sha256_digest(manifest)
        with self._store.lock:
            self._store.blobs[sha256_digest(config)] = config
            self._store.blobs[sha256_digest(layer)] = layer
            self._store.manifests[(name, digest)] = (media_type, manifest)
            self._store.tags[(name, tag)] = digest
        return digest

    def has_tag(self, name: str, tag: str) -> bool:
        with self._store.lock:
            return (name, tag) in self._store.tags


class _Handler(BaseHTTPRequestHandler):
    registry: RegistryStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    # -- plumbing ----------------------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Docker-Distribution-Api-Version", "registry/2.0")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps({"errors": [{"code": code, "message": message}]}).encode(), headers)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _split(self) -> tuple[str, dict[str, str]]:
        parts = urllib.parse.urlsplit(self.path)
        return parts.path, dict(urllib.parse.parse_qsl(parts.query))

    def _record(self, path: str) -> None:
        self.registry.requests.append(RecordedRequest(
            self.command, path, self.headers.get("Accept", ""), self.headers.get("Authorization", "")))

    def _authorized(self, name: str | None, action: str) -> bool:
        reg = self.registry
        if not reg.auth:
            return True
        header = self.headers.get("Authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else None
        if token is not None and token in reg.static_tokens:
            return True
        with reg._store.lock:
            granted = reg._store.tokens.get(token, "") if token is not None else ""
        if token is not None and granted == "*" and name is None:
            return True
        if token is not None and name is not None and granted == name:
            return True
        scope = f'repository:{name}:{action}' if name else ""
        challenge = f'Bearer realm="{reg.url}/token",service="{reg.service}"' + (f',scope="{scope}"' if scope else "")
        if token is not None:
            challenge += ',error="insufficient_scope"'
        self._error(401, "UNAUTHORIZED", "authentication required", {"WWW-Authenticate": challenge})
        return False

    # -- verbs -------------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        path, query = self._split()
        self._record(path)
        if path == "/token" and self.command == "GET":
            return self._token(query)
        if path == "/v2/" or path == "/v2":
            if self._authorized(None, "pull"):
                self._send(200, b"{}")
            return None
        action = "pull" if self.command in ("GET", "HEAD") else "push"
        for pattern, handler in (
            (_MANIFEST_PATH, self._manifest), (_BLOB_PATH, self._blob),
            (_UPLOAD_START, self._upload_start), (_UPLOAD_PATH, self._upload),
        ):
            match = pattern.match(path)
            if match:
                if self._authorized(match["name"], action):
                    handler(match, query)
                return None
        self._error(404, "NAME_UNKNOWN", f"no route for {self.command} {path}")
        return None

    def _token(self, query: dict[str, str]) -> None:
        reg = self.registry
        scope = query.get("scope", "")
        match = re.match(r"^repository:(?P<name>[^:]+):", scope)
        name = match["name"] if match else None
        grants = name if name is not None and name not in reg.private else ("*" if not scope else None)
        token = secrets.token_hex(16)
        with reg._store.lock:
            reg._store.tokens[token] = grants
        self._send(200, json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode())

    def _manifest(self, match: re.Match[str], query: dict[str, str]) -> None:
        store, name, ref = self.registry._store, match["name"], match["ref"]
        if self.command == "PUT":
            media_type = self.headers.get("Content-Type", DOCKER_MANIFEST).split(";")[0].strip()
            body = self._body()
            try:
                doc = json.loads(body)
            except ValueError:
                return self._error(400, "MANIFEST_INVALID", "manifest is not JSON")
            referenced = [doc.get("config", {}).get("digest")]
            referenced += [layer.get("digest") for layer in doc.get("layers", [])]
            digest = sha256_digest(body)
            with store.lock:
                missing = [d for d in referenced if d and d not in store.blobs]
                children = [m.get("digest") for m in doc.get("manifests", [])]
                missing += [d for d in children if (name, d) not in store.manifests]
                if missing:
                    return self._error(400, "MANIFEST_BLOB_UNKNOWN", f"unknown blob {missing[0]}")
                store.manifests[(name, digest)] = (media_type, body)
                if not ref.startswith("sha256:"):
                    store.tags[(name, ref)] = digest
            location = f"/v2/{name}/manifests/{digest}"
            return self._send(201, headers={"Location": location, "Docker-Content-Digest": digest})
        if self.command not in ("GET", "HEAD"):
            return self._error(405, "UNSUPPORTED", "method not allowed")
        with store.lock:
            wanted = ref if ref.startswith("sha256:") else store.tags.get((name, ref))
            found = store.manifests.get((name, wanted)) if wanted else None
        accepted = {part.split(";")[0].strip() for part in ",".join(self.headers.get_all("Accept") or []).split(",")}
        if found is None or wanted is None or (found[0] not in accepted and not ref.startswith("sha256:")):
            return self._error(404, "MANIFEST_UNKNOWN", f"manifest unknown: {name}:{ref}")
        media_type, body = found
        self.send_response(200)
        self.send_header("Docker-Distribution-Api-Version", "registry/2.0")
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Content-Digest", wanted)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)
        return None

    def _blob(self, match: re.Match[str], query: dict[str, str]) -> None:
        store = self.registry._store
        with store.lock:
            data = store.blobs.get(match["digest"])
        if data is None:
            return self._error(404, "BLOB_UNKNOWN", "blob unknown")
        return self._send(200, data, {"Docker-Content-Digest": match["digest"]}, "application/octet-stream")

    def _upload_start(self, match: re.Match[str], query: dict[str, str]) -> None:
        if self.command != "POST":
            return self._error(405, "UNSUPPORTED", "method not allowed")
        store, name = self.registry._store, match["name"]
        body = self._body()
        if "digest" in query:  # monolithic upload
            return self._finish(name, query["digest"], bytearray(body))
        upload = secrets.token_hex(8)
        with store.lock:
            store.uploads[upload] = bytearray(body)
        return self._send(202, headers={"Location": f"/v2/{name}/blobs/uploads/{upload}", "Range": "0-0",
                                        "Docker-Upload-UUID": upload})

    def _upload(self, match: re.Match[str], query: dict[str, str]) -> None:
        store, name, upload = self.registry._store, match["name"], match["upload"]
        body = self._body()
        with store.lock:
            buffer = store.uploads.get(upload)
            if buffer is not None:
                buffer.extend(body)
        if buffer is None:
            return self._error(404, "BLOB_UPLOAD_UNKNOWN", "upload unknown")
        if self.command == "PATCH":
            return self._send(202, headers={"Location": f"/v2/{name}/blobs/uploads/{upload}",
                                            "Range": f"0-{max(len(buffer) - 1, 0)}"})
        if self.command == "PUT" and "digest" in query:
            with store.lock:
                store.uploads.pop(upload, None)
            return self._finish(name, query["digest"], buffer)
        return self._error(400, "DIGEST_INVALID", "PUT needs ?digest=")

    def _finish(self, name: str, digest: str, data: bytearray) -> None:
        if sha256_digest(bytes(data)) != digest:
            return self._error(400, "DIGEST_INVALID", "digest does not match the uploaded content")
        with self.registry._store.lock:
            self.registry._store.blobs[digest] = bytes(data)
        return self._send(201, headers={"Location": f"/v2/{name}/blobs/{digest}", "Docker-Content-Digest": digest})
