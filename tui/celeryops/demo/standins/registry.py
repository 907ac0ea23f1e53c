"""Image registries for tests and the demo: an in-process stand-in, a push client, and the real registry.

The stand-in speaking the Docker Registry HTTP API v2 is :mod:`celeryops.demo.standins.registry_standin`; media
types, manifests and the push client (:func:`push_image`, :func:`push_index`) are
:mod:`celeryops.demo.standins.registry_images`; both are importable from here. This module runs the real
``docker-registry`` binary (Debian package) on a free loopback port when it is installed
(:class:`DockerRegistryProcess`), so the same pushes and lookups can be checked against it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

from celeryops.demo.standins.redis_server import free_port
from celeryops.demo.standins.registry_images import (
    DOCKER_CONFIG,
    DOCKER_LAYER,
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
    OCI_INDEX,
    OCI_MANIFEST,
    PushError,
    build_manifest,
    http_request,
    push_image,
    push_index,
    sha256_digest,
)
from celeryops.demo.standins.registry_standin import LoopbackRegistry, RecordedRequest, RegistryStandIn

__all__ = [
    "DOCKER_CONFIG",
    "DOCKER_LAYER",
    "DOCKER_MANIFEST",
    "DOCKER_MANIFEST_LIST",
    "OCI_INDEX",
    "OCI_MANIFEST",
    "DockerRegistryProcess",
    "PushError",
    "RecordedRequest",
    "RegistryStandIn",
    "build_manifest",
    "push_image",
    "push_index",
    "sha256_digest",
]


class DockerRegistryProcess(LoopbackRegistry):
    """The real registry (``docker-registry serve CONFIG``, Debian package) on a free loopback port."""

    def __init__(self, binary: str | None = None) -> None:
        found = binary or shutil.which("docker-registry")
        if not found:
            raise RuntimeError("docker-registry is not installed: apt-get install -y docker-registry")
        self.binary = found
        self._port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="celeryops-registry-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return self._port

    def start(self, timeout: float = 30.0) -> Self:
        config = self._dir / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self._dir / 'data'}\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n  secret: celeryops-test\n",
            encoding="utf-8",
        )
        log = (self._dir / "registry.log").open("wb")
        self._proc = subprocess.Popen([self.binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(self._dir / 'registry.log').read_text()[-500:]}")
            try:
                http_request("GET", f"{self.url}/v2/")
                return self
            except (OSError, PushError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"docker-registry did not answer on {self.url} within {timeout}s") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)
