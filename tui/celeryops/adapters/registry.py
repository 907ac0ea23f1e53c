"""Image registry adapter: does the image for a release exist? (Docker Registry HTTP API v2, read-only).

``ImageRegistry.probe(ref)`` sends ``HEAD /v2/<name>/manifests/<tag|digest>`` and tells apart four outcomes, each
with its own sentence: the manifest exists, the tag is missing (404), access is refused (401/403 after auth), or the
registry cannot be reached. Authentication follows what ``docker pull`` does anonymously: a ``401`` with a
``WWW-Authenticate: Bearer realm=...,service=...,scope=...`` challenge is answered by fetching a token from the realm.
For Google registries (``*-docker.pkg.dev``, ``gcr.io``) a Google access token from application default credentials
is sent; the provider is injectable so tests never need Google. Loopback registries are spoken to over plain HTTP
(as Docker does), every other host over HTTPS. Only the standard library does HTTP here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from celeryops.core.errors import PreflightError
from celeryops.core.masking import mask_text
from celeryops.core.urls import is_loopback

if TYPE_CHECKING:  # urllib.request (and with it http.client, email) is imported by the first request
    import urllib.request
    from email.message import Message

# What we accept, newest first: a multi-arch index is as good as a single-arch manifest.
MANIFEST_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
ACCEPT_HEADER = ", ".join(MANIFEST_MEDIA_TYPES)

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
GOOGLE_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
_DOMAIN_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::[0-9]+)?$")
_CHALLENGE_PARAM = re.compile(r'([A-Za-z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')

ProbeStatus = Literal["exists", "missing", "unauthorized", "unreachable", "error"]
TokenProvider = Callable[[], Awaitable[str]]


class RegistryError(PreflightError):
    """An image could not be confirmed. ``detail`` says what failed, ``remedy`` what to do next."""


class InvalidImageReference(RegistryError):
    pass


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference: ``registry/repository`` plus a tag or a digest (the digest wins if both)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/``."""
        return self.digest or self.tag or "latest"

    @property
    def api_host(self) -> str:
        """``host[:port]`` the v2 API lives on (Docker Hub's API is not on docker.io itself)."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def hostname(self) -> str:
        """The registry host without port or IPv6 brackets."""
        host = self.registry
        if host.startswith("["):
            return host[1 : host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def scheme(self) -> str:
        return "http" if is_loopback(self.hostname) else "https"

    @property
    def manifest_url(self) -> str:
        return f"{self.scheme}://{self.api_host}/v2/{self.repository}/manifests/{self.reference}"

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_image_ref(text: str) -> ImageRef:
    """Parse ``[host[:port]/]path[:tag][@digest]`` the way Docker does (``ubuntu`` -> ``docker.io/library/ubuntu``).

    The first path component is a registry host when it contains ``.`` or ``:``, is ``localhost`` or has an
    uppercase letter. Raises ``InvalidImageReference`` with a sentence naming the problem.
    """
    raw = text.strip()
    remedy = "write it as host/path/name:tag (for example europe-docker.pkg.dev/project/repo/app:TAG)"
    if not raw:
        raise InvalidImageReference("the image reference is empty", remedy)
    rest, digest = raw, None
    if "@" in raw:
        rest, digest = raw.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise InvalidImageReference(f"image reference {raw!r} has an invalid digest {digest!r}", remedy)
    tag = None
    colon, slash = rest.rfind(":"), rest.rfind("/")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG_RE.match(tag):
            raise InvalidImageReference(f"image reference {raw!r} has an invalid tag {tag!r}", remedy)
    first, _, remainder = rest.partition("/")
    if remainder and (any(c in first for c in ".:") or first == "localhost" or first.lower() != first):
        registry, path = first, remainder
    else:
        registry, path = DOCKER_HUB, rest
    if registry == "index.docker.io":
        registry = DOCKER_HUB
    if not _DOMAIN_RE.match(registry):
        raise InvalidImageReference(f"image reference {raw!r} has an invalid registry host {registry!r}", remedy)
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _PATH_RE.match(path):
        raise InvalidImageReference(
            f"image reference {raw!r} has an invalid repository name {path!r} (lowercase letters, digits, . _ -)",
            remedy,
        )
    if tag is None and digest is None:
        tag = "latest"
    return ImageRef(registry=registry, repository=path, tag=tag, digest=digest)


def is_google_registry(hostname: str) -> bool:
    """Artifact Registry (``LOCATION-docker.pkg.dev``) and Container Registry (``gcr.io``, ``eu.gcr.io`` ...)."""
    host = hostname.lower()
    return host.endswith("-docker.pkg.dev") or host == "gcr.io" or host.endswith(".gcr.io")


async def adc_access_token() -> str:
    """A Google access token from application default credentials (``google.auth.default()`` + refresh)."""

    def fetch() -> str:
        import google.auth
        import google.auth.transport.requests

        credentials, _project = google.auth.default(scopes=[GOOGLE_SCOPE])
        credentials.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]
        return str(credentials.token)

    return await asyncio.to_thread(fetch)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="https://x/token",service="reg",scope="repository:a/b:pull"`` -> ("bearer", {...})."""
    scheme, _, params = header.strip().partition(" ")
    values = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in
              _CHALLENGE_PARAM.finditer(params)}
    return scheme.lower(), {k: v.replace('\\"', '"') for k, v in values.items()}


@dataclass(frozen=True)
class ManifestProbe:
    """The outcome of one manifest lookup; ``detail`` and ``remedy`` are one sentence each."""

    ref: str
    status: ProbeStatus
    detail: str
    remedy: str = ""
    digest: str | None = None

    @property
    def exists(self) -> bool:
        return self.status == "exists"


@dataclass(frozen=True)
class _Response:
    status: int
    headers: Message


class _Unreachable(Exception):
    pass


class ImageRegistry:
    """Looks manifests up in v2 registries. Injectable parts: the Google token provider and the host rule."""

    def __init__(
        self,
        *,
        google_token: TokenProvider | None = None,
        is_google_host: Callable[[str], bool] = is_google_registry,
        timeout: float = 10.0,
    ) -> None:
        self._google_token = google_token or adc_access_token
        self._is_google_host = is_google_host
        self._timeout = timeout

    async def manifest_exists(self, image_ref: str) -> bool:
        """True if the manifest exists, False if the tag/digest is missing; raises ``RegistryError`` otherwise."""
        probe = await self.probe(image_ref)
        if probe.status == "exists":
            return True
        if probe.status == "missing":
            return False
        raise RegistryError(probe.detail, probe.remedy)

    async def probe(self, image_ref: str) -> ManifestProbe:
        """Look the manifest up and classify the answer; never raises for registry trouble."""
        try:
            ref = parse_image_ref(image_ref)
        except InvalidImageReference as exc:
            return ManifestProbe(image_ref, "error", exc.detail, exc.remedy)
        try:
            return await self._probe(ref)
        except _Unreachable as exc:
            return ManifestProbe(
                str(ref), "unreachable",
                f"registry {ref.registry} could not be reached ({exc})",
                "check the registry host name and the network, then run preflight again",
            )

    async def _probe(self, ref: ImageRef) -> ManifestProbe:
        google = self._is_google_host(ref.hostname)
        headers = {"Accept": ACCEPT_HEADER}
        google_token: str | None = None
        if google:
            try:
                google_token = await self._google_token()
            except Exception as exc:  # google.auth raises several unrelated types
                return self._unauthorized(ref, google, f"no Google access token ({_one_line(exc)})")
            headers["Authorization"] = f"Bearer {google_token}"
        resp = await self._request("HEAD", ref.manifest_url, headers)
        if resp.status == 401:
            scheme, params = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
            if scheme != "bearer" or "realm" not in params:
                return self._unauthorized(ref, google, "HTTP 401 with a login challenge this tool cannot answer")
            token = await self._fetch_token(ref, params, google_token)
            if token is None:
                return self._unauthorized(ref, google, "its token service refused an access token")
            headers["Authorization"] = f"Bearer {token}"
            resp = await self._request("HEAD", ref.manifest_url, headers)
        if resp.status == 200:
            digest = resp.headers.get("Docker-Content-Digest")
            return ManifestProbe(str(ref), "exists", f"image {ref} exists in {ref.registry}", "", digest)
        if resp.status == 404:
            what = f"digest {ref.digest}" if ref.digest else f"tag {ref.tag}"
            return ManifestProbe(
                str(ref), "missing",
                f"image {ref} was not found: {ref.registry} has no manifest for {what} of {ref.repository}",
                "build and push the image for this commit (or correct the image name), then run preflight again",
            )
        if resp.status in (401, 403):
            return self._unauthorized(ref, google, f"HTTP {resp.status} after authenticating")
        return ManifestProbe(
            str(ref), "error",
            f"registry {ref.registry} answered HTTP {resp.status} for {ref.repository}:{ref.reference}",
            "try again in a minute; if it persists, check the registry's status",
        )

    def _unauthorized(self, ref: ImageRef, google: bool, why: str) -> ManifestProbe:
        if google:
            remedy = ("run `gcloud auth application-default login` and make sure the account can read the "
                      "repository (roles/artifactregistry.reader), then run preflight again")
        else:
            remedy = "grant this machine read access to the repository (or check its name), then run preflight again"
        return ManifestProbe(
            str(ref), "unauthorized", f"registry {ref.registry} refused access to {ref.repository}: {why}", remedy
        )

    async def _fetch_token(self, ref: ImageRef, params: Mapping[str, str], google_token: str | None) -> str | None:
        query = {"scope": params.get("scope") or f"repository:{ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        realm = params["realm"]
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
        headers: dict[str, str] = {}
        if google_token is not None:
            basic = base64.b64encode(f"oauth2accesstoken:{google_token}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        status, body = await asyncio.to_thread(self._get_json, url, headers)
        if status != 200 or not isinstance(body, dict):
            return None
        token = body.get("token") or body.get("access_token")
        return str(token) if token else None

    async def _request(self, method: str, url: str, headers: Mapping[str, str]) -> _Response:
        return await asyncio.to_thread(self._request_sync, method, url, headers)

    def _opener(self, url: str) -> urllib.request.OpenerDirector:
        import urllib.request

        host = urllib.parse.urlsplit(url).hostname or ""
        if is_loopback(host):  # never send loopback traffic through an HTTP proxy
            return urllib.request.build_opener(urllib.request.ProxyHandler({}))
        return urllib.request.build_opener()

    def _request_sync(self, method: str, url: str, headers: Mapping[str, str]) -> _Response:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, method=method, headers=dict(headers))
        try:
            with self._opener(url).open(request, timeout=self._timeout) as resp:
                return _Response(resp.status, resp.headers)
        except urllib.error.HTTPError as exc:
            exc.close()
            return _Response(exc.code, exc.headers)
        except urllib.error.URLError as exc:
            raise _Unreachable(_one_line(exc.reason)) from exc
        except (OSError, ValueError) as exc:  # timeouts, resets, malformed responses
            raise _Unreachable(_one_line(exc)) from exc

    def _get_json(self, url: str, headers: Mapping[str, str]) -> tuple[int, object]:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, headers=dict(headers))
        try:
            with self._opener(url).open(request, timeout=self._timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code, None
        except urllib.error.URLError as exc:
            raise _Unreachable(f"token service: {_one_line(exc.reason)}") from exc
        except (OSError, ValueError) as exc:
            raise _Unreachable(f"token service: {_one_line(exc)}") from exc


def _one_line(value: object) -> str:
    text = " ".join(str(value).split()) or type(value).__name__
    return mask_text(text)
