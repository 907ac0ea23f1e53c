"""The registry adapter: image references, and manifest lookups against the in-package v2 stand-in and the real
``docker-registry`` (Debian package; started from a fixture)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from celeryops.adapters.registry import (
    ACCEPT_HEADER,
    MANIFEST_MEDIA_TYPES,
    ImageRef,
    ImageRegistry,
    InvalidImageReference,
    RegistryError,
    is_google_registry,
    parse_challenge,
    parse_image_ref,
)
from celeryops.core.errors import EXIT_PREFLIGHT
from celeryops.demo.standins.redis_server import free_port
from celeryops.demo.standins.registry import (
    OCI_INDEX,
    OCI_MANIFEST,
    DockerRegistryProcess,
    RegistryStandIn,
    push_image,
    push_index,
)

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ubuntu", ImageRef("docker.io", "library/ubuntu", "latest")),
        ("team/app:1.2", ImageRef("docker.io", "team/app", "1.2")),
        ("index.docker.io/library/redis:7", ImageRef("docker.io", "library/redis", "7")),
        ("localhost/app", ImageRef("localhost", "app", "latest")),
        ("localhost:5000/a/b:t", ImageRef("localhost:5000", "a/b", "t")),
        ("127.0.0.1:5000/app:sha-1", ImageRef("127.0.0.1:5000", "app", "sha-1")),
        ("[::1]:5000/app:v1", ImageRef("[::1]:5000", "app", "v1")),
        ("europe-docker.pkg.dev/proj/repo/api:abc", ImageRef("europe-docker.pkg.dev", "proj/repo/api", "abc")),
        (f"gcr.io/proj/api@{DIGEST}", ImageRef("gcr.io", "proj/api", None, DIGEST)),
        (f"gcr.io/proj/api:v1@{DIGEST}", ImageRef("gcr.io", "proj/api", "v1", DIGEST)),
        ("Registry/app", ImageRef("Registry", "app", "latest")),
    ],
)
def test_parse_image_ref(text: str, expected: ImageRef) -> None:
    assert parse_image_ref(text) == expected


@pytest.mark.parametrize("text", ["", "team/App:1", "app:bad tag", "app@sha256:xyz", "a//b", "host:99x/app"])
def test_parse_rejects_invalid_references_with_a_sentence(text: str) -> None:
    with pytest.raises(InvalidImageReference) as err:
        parse_image_ref(text)
    assert err.value.exit_code == EXIT_PREFLIGHT
    assert "host/path/name:tag" in err.value.remedy


def test_scheme_api_host_and_url() -> None:
    assert parse_image_ref("localhost:5000/app").scheme == "http"
    assert parse_image_ref("127.8.9.10:5000/app").scheme == "http"
    assert parse_image_ref("[::1]:5000/app").scheme == "http"
    assert parse_image_ref("[::1]:5000/app").hostname == "::1"
    assert parse_image_ref("registry.example.com/app").scheme == "https"
    assert parse_image_ref("127.example.com/app").scheme == "https"
    hub = parse_image_ref("redis:7")
    assert hub.manifest_url == "https://registry-1.docker.io/v2/library/redis/manifests/7"
    assert str(hub) == "docker.io/library/redis:7"
    assert parse_image_ref(f"gcr.io/p/a:v1@{DIGEST}").reference == DIGEST


def test_google_hosts() -> None:
    assert is_google_registry("europe-west1-docker.pkg.dev")
    assert is_google_registry("gcr.io") and is_google_registry("eu.gcr.io")
    assert not is_google_registry("registry.example.com")
    assert not is_google_registry("docker.pkg.dev.example.com")


def test_parse_challenge() -> None:
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push"'
    )
    assert scheme == "bearer"
    assert params == {"realm": "https://auth.example/token", "service": "registry.example",
                      "scope": "repository:a/b:pull,push"}
    assert parse_challenge('Basic realm="x"') == ("basic", {"realm": "x"})


def test_accept_header_names_index_and_manifest_types() -> None:
    for media_type in (OCI_INDEX, OCI_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json",
                       "application/vnd.docker.distribution.manifest.list.v2+json"):
        assert media_type in MANIFEST_MEDIA_TYPES


# -- against the stand-in -------------------------------------------------------------------------------------------
@pytest.fixture
def standin() -> Iterator[RegistryStandIn]:
    with RegistryStandIn() as registry:
        yield registry


async def test_exists_and_missing_tag(standin: RegistryStandIn) -> None:
    digest = push_image(standin.url, "team/api", "abc123")
    registry = ImageRegistry()
    assert await registry.manifest_exists(f"{standin.host}/team/api:abc123")
    assert not await registry.manifest_exists(f"{standin.host}/team/api:def456")
    assert not await registry.manifest_exists(f"{standin.host}/team/other:abc123")
    assert await registry.manifest_exists(f"{standin.host}/team/api@{digest}")

    probe = await registry.probe(f"{standin.host}/team/api:def456")
    assert probe.status == "missing"
    assert probe.detail == (f"image {standin.host}/team/api:def456 was not found: "
                            f"{standin.host} has no manifest for tag def456 of team/api")
    assert "push the image" in probe.remedy
    found = await registry.probe(f"{standin.host}/team/api:abc123")
    assert found.exists and found.digest == digest


async def test_head_sends_the_accept_headers_and_finds_an_oci_index(standin: RegistryStandIn) -> None:
    child = push_image(standin.url, "team/api", "amd64", media_type=OCI_MANIFEST)
    push_index(standin.url, "team/api", "multi", [child])
    assert await ImageRegistry().manifest_exists(f"{standin.host}/team/api:multi")
    heads = [r for r in standin.requests if r.method == "HEAD"]
    assert heads and heads[-1].accept == ACCEPT_HEADER


async def test_standin_hides_a_manifest_type_the_client_does_not_accept(standin: RegistryStandIn) -> None:
    """What makes the Accept test meaningful: like the real registry, no matching Accept -> not found."""
    import urllib.error
    import urllib.request

    child = push_image(standin.url, "team/api", "amd64")
    push_index(standin.url, "team/api", "multi", [child])
    request = urllib.request.Request(f"{standin.url}/v2/team/api/manifests/multi", method="HEAD",
                                     headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(request, timeout=10)
    assert err.value.code == 404


async def test_anonymous_bearer_token_is_fetched_after_a_401() -> None:
    with RegistryStandIn(auth=True) as standin:
        standin.seed("team/api", "v1")
        assert await ImageRegistry().manifest_exists(f"{standin.host}/team/api:v1")
        assert not await ImageRegistry().manifest_exists(f"{standin.host}/team/api:v2")
        paths = [(r.method, r.path, r.authorization.split(" ")[0]) for r in standin.requests]
        assert paths[:3] == [("HEAD", "/v2/team/api/manifests/v1", ""), ("GET", "/token", ""),
                             ("HEAD", "/v2/team/api/manifests/v1", "Bearer")]


async def test_unauthorized_after_auth() -> None:
    with RegistryStandIn(auth=True, private=["team/secret"]) as standin:
        standin.seed("team/secret", "v1")
        ref = f"{standin.host}/team/secret:v1"
        probe = await ImageRegistry().probe(ref)
        assert probe.status == "unauthorized"
        assert probe.detail == f"registry {standin.host} refused access to team/secret: HTTP 401 after authenticating"
        with pytest.raises(RegistryError) as err:
            await ImageRegistry().manifest_exists(ref)
        assert err.value.exit_code == EXIT_PREFLIGHT and "read access" in err.value.remedy


async def test_unreachable_registry() -> None:
    port = free_port()  # nothing listens there
    probe = await ImageRegistry(timeout=5).probe(f"127.0.0.1:{port}/team/api:v1")
    assert probe.status == "unreachable"
    assert probe.detail.startswith(f"registry 127.0.0.1:{port} could not be reached (")
    with pytest.raises(RegistryError, match="could not be reached"):
        await ImageRegistry(timeout=5).manifest_exists(f"127.0.0.1:{port}/team/api:v1")


async def test_invalid_reference_is_an_error_probe() -> None:
    probe = await ImageRegistry().probe("team/App:1")
    assert probe.status == "error" and "invalid repository name" in probe.detail


async def test_google_access_token_is_sent_to_google_hosts() -> None:
    calls: list[int] = []

    async def token() -> str:
        calls.append(1)
        return "ya29.test-token"

    with RegistryStandIn(auth=True, private=["proj/repo/api"], static_tokens=["ya29.test-token"]) as standin:
        standin.seed("proj/repo/api", "v1")
        registry = ImageRegistry(google_token=token, is_google_host=lambda host: True)
        assert await registry.manifest_exists(f"{standin.host}/proj/repo/api:v1")
        assert calls == [1]
        assert standin.requests[0].authorization == "Bearer ya29.test-token"
        # non-Google hosts never see the Google token
        plain = ImageRegistry(google_token=token, is_google_host=lambda host: False)
        assert (await plain.probe(f"{standin.host}/proj/repo/api:v1")).status == "unauthorized"
        assert calls == [1]


async def test_google_token_is_exchanged_at_the_token_endpoint_when_refused_directly() -> None:
    async def token() -> str:
        return "ya29.other"

    with RegistryStandIn(auth=True) as standin:
        standin.seed("proj/repo/api", "v1")
        registry = ImageRegistry(google_token=token, is_google_host=lambda host: True)
        assert await registry.manifest_exists(f"{standin.host}/proj/repo/api:v1")
        token_requests = [r for r in standin.requests if r.path == "/token"]
        basic = base64.b64encode(b"oauth2accesstoken:ya29.other").decode()
        assert token_requests[0].authorization == f"Basic {basic}"


async def test_missing_google_credentials_is_unauthorized_with_gcloud_remedy() -> None:
    async def no_credentials() -> str:
        raise RuntimeError("Your default credentials were not found.\nTo set up ADC, see the docs")

    with RegistryStandIn(auth=True) as standin:
        registry = ImageRegistry(google_token=no_credentials, is_google_host=lambda host: True)
        probe = await registry.probe(f"{standin.host}/proj/repo/api:v1")
        assert probe.status == "unauthorized"
        assert "no Google access token (Your default credentials were not found. To set up ADC" in probe.detail
        assert "gcloud auth application-default login" in probe.remedy
        assert standin.requests == []  # nothing was sent without a token


# -- against the real registry (docker-registry, Debian package) ---------------------------------------------------
@pytest.fixture(scope="module")
def real_registry() -> Iterator[DockerRegistryProcess]:
    with DockerRegistryProcess() as registry:
        yield registry


async def test_real_registry_exists_missing_digest_and_index(real_registry: DockerRegistryProcess) -> None:
    host = real_registry.host
    child = push_image(real_registry.url, "celeryops/api", "amd64", layers=[b"one", b"two"])
    push_index(real_registry.url, "celeryops/api", "release-1", [child])
    oci = push_image(real_registry.url, "celeryops/worker", "v1", media_type=OCI_MANIFEST)
    registry = ImageRegistry()
    assert await registry.manifest_exists(f"{host}/celeryops/api:amd64")
    assert await registry.manifest_exists(f"{host}/celeryops/api:release-1")
    assert await registry.manifest_exists(f"{host}/celeryops/api@{child}")
    assert await registry.manifest_exists(f"{host}/celeryops/worker:v1")
    assert (await registry.probe(f"{host}/celeryops/worker:v1")).digest == oci
    assert not await registry.manifest_exists(f"{host}/celeryops/api:release-2")
    assert not await registry.manifest_exists(f"{host}/celeryops/nothing:v1")
