"""Images as the Docker Registry HTTP API v2 carries them, and a client that pushes tiny ones.

Media types (Docker v2 schema 2, OCI), digests and manifests are shared by the registry stand-in
(:mod:`celeryops.demo.standins.registry_standin`) and the push client here. :func:`push_image` uploads a tiny
image (config + layers + manifest) through the HTTP API, :func:`push_index` an OCI image index over pushed
manifests; both work against the stand-in and the real registry. :func:`http_request` is the one HTTP call they
(and the wait for the real registry) make, without proxies.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"


def sha256_digest(data: bytes) -> str:
    """The content digest of ``data`` (``sha256:<hex>``)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def build_manifest(config: bytes, layers: Sequence[bytes], media_type: str = DOCKER_MANIFEST) -> bytes:
    """An image manifest (Docker v2 schema 2 or OCI) referencing ``config`` and ``layers`` by digest."""
    oci = media_type == OCI_MANIFEST
    body = {
        "schemaVersion": 2,
        "mediaType": media_type,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json" if oci else DOCKER_CONFIG,
                   "size": len(config), "digest": sha256_digest(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip" if oci else DOCKER_LAYER,
                    "size": len(layer), "digest": sha256_digest(layer)} for layer in layers],
    }
    return json.dumps(body, indent=2).encode()


class PushError(RuntimeError):
    """A registry refused a request of the push client (the message names the request and the answer)."""


def http_request(
    method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    """One request without proxies: ``(status, headers)``; an HTTP error status raises PushError."""
    request = urllib.request.Request(url, data=body if method in ("POST", "PUT", "PATCH") else None,
                                     method=method, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as resp:
            resp.read()
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise PushError(f"{method} {url} answered HTTP {exc.code}: {detail}") from exc


def push_image(
    base_url: str, name: str, tag: str, *, layers: Sequence[bytes] = (b"layer",), media_type: str = DOCKER_MANIFEST,
    token: str | None = None,
) -> str:
    """Push a tiny image (config + ``layers`` + manifest) over HTTP; returns the manifest digest.

    Blobs go through a two-step upload (``POST`` then ``PUT ?digest=``), as ``docker push`` does.
    """
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"tag": tag}}}).encode()
    for blob in (config, *layers):
        status, headers = http_request("POST", f"{base_url}/v2/{name}/blobs/uploads/", headers=auth)
        location = headers.get("Location", "")
        if status != 202 or not location:
            raise PushError(f"upload of a blob to {name} did not start (HTTP {status})")
        location = urllib.parse.urljoin(base_url + "/", location)
        sep = "&" if "?" in location else "?"
        http_request("PUT", f"{location}{sep}digest={urllib.parse.quote(sha256_digest(blob))}", blob,
              {**auth, "Content-Type": "application/octet-stream"})
    manifest = build_manifest(config, layers, media_type)
    manifest_url = f"{base_url}/v2/{name}/manifests/{tag}"
    _status, headers = http_request("PUT", manifest_url, manifest, {**auth, "Content-Type": media_type})
    return headers.get("Docker-Content-Digest", sha256_digest(manifest))


def push_index(base_url: str, name: str, tag: str, children: Sequence[str], token: str | None = None) -> str:
    """Push an OCI image index pointing at already pushed manifests (by digest); returns the index digest."""
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    index = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": DOCKER_MANIFEST, "digest": d, "size": 1,
                       "platform": {"architecture": "amd64", "os": "linux"}} for d in children],
    }).encode()
    _status, headers = http_request("PUT", f"{base_url}/v2/{name}/manifests/{tag}", index,
                                    {**auth, "Content-Type": OCI_INDEX})
    return headers.get("Docker-Content-Digest", sha256_digest(index))
