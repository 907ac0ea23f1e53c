"""celeryops.core.config: sources, precedence, every valid key, and one sentence per bad configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from celeryops.core.config import Config, DrainSettings, ReleaseSettings, Target, is_loopback_endpoint
from celeryops.core.configload import load_config
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.findings import SETTING_FINDINGS

FULL_PYPROJECT = """
[project]
name = "someapp"

[tool.celeryops]
broker = "redis://:s3cret@redis:6379/0"
app = "proj.celery:app"
state_dir = "state"

[tool.celeryops.drain]
interval = 5
streak = 3
max_wait = 600.5

[tool.celeryops.release]
remote = "upstream"
max_age_days = 7

[[tool.celeryops.targets]]
name = "worker"
kind = "cloudrun-service"
project = "my-project"
region = "europe-west1"
resource = "celery-worker"
container = "worker"
image = "europe-west1-docker.pkg.dev/my-project/app/worker:{sha}"
timeout = 900

[[tool.celeryops.targets]]
name = "gpu"
kind = "cloudrun-worker-pool"
project = "my-project"
region = "us-central1"
resource = "gpu-pool"
image = "img/gpu:{short_sha}-{branch}-{release}"
api_endpoint = "127.0.0.1:8089"
insecure = true

[[tool.celeryops.targets]]
name = "k8s"
kind = "command"
image = "img/worker:{sha}"
command = "kubectl set image deploy/worker worker={image} # {release} {short_sha}"
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_every_valid_key_from_pyproject(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", FULL_PYPROJECT)
    config = load_config(None, tmp_path, {}, {})
    assert config.broker == "redis://:s3cret@redis:6379/0"
    assert config.app == "proj.celery:app"
    assert config.state_dir == str(tmp_path / "state")
    assert config.drain == DrainSettings(interval=5.0, streak=3, max_wait=600.5)
    assert config.release == ReleaseSettings(remote="upstream", max_age_days=7)
    assert config.source == str(tmp_path / "pyproject.toml")
    worker, gpu, k8s = config.targets
    assert worker == Target(name="worker", kind="cloudrun-service", project="my-project", region="europe-west1",
                            resource="celery-worker", container="worker",
                            image="europe-west1-docker.pkg.dev/my-project/app/worker:{sha}", timeout=900.0)
    assert worker.resource_path == "projects/my-project/locations/europe-west1/services/celery-worker"
    assert gpu.kind == "cloudrun-worker-pool" and gpu.insecure and gpu.api_endpoint == "127.0.0.1:8089"
    assert gpu.resource_path == "projects/my-project/locations/us-central1/workerPools/gpu-pool"
    assert gpu.container == "" and gpu.timeout == 1800.0
    assert k8s.kind == "command" and k8s.command.startswith("kubectl set image")
    assert config.target("gpu") is gpu


def test_preflight_accept_and_traffic(tmp_path: Path) -> None:
    section = '[tool.celeryops.preflight]\naccept = ["fence", "branch", "fence"]\n\n[[tool.celeryops.targets]]'
    text = FULL_PYPROJECT.replace("[[tool.celeryops.targets]]", section, 1)
    write(tmp_path / "pyproject.toml", text.replace("timeout = 900", 'timeout = 900\ntraffic = "latest"'))
    config = load_config(None, tmp_path, {}, {})
    assert config.preflight.accept == ("fence", "branch")
    assert config.targets[0].traffic == "latest" and config.targets[1].traffic == ""
    assert config.targets[0].console_url == ("https://console.cloud.google.com/run/detail/europe-west1/celery-worker"
                                             "/revisions?project=my-project")
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    assert load_config(None, empty, {}, {}).preflight.accept == ()


def test_image_placeholders_expand() -> None:
    target = Target(name="t", kind="cloudrun-service", image="reg/app:{sha}|{short_sha}|{branch}|{release}|{{x}}")
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert target.image_for(sha, "feature/new thing", "2024.05.1") == \
        f"reg/app:{sha}|0123456|feature-new-thing|2024.05.1|{{x}}"


def test_celeryops_toml_wins_over_pyproject_and_keys_sit_at_top_level(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", FULL_PYPROJECT)
    write(tmp_path / "celeryops.toml", 'broker = "redis://own:6379/1"\n[drain]\nstreak = 4\n')
    config = load_config(None, tmp_path, {}, {})
    assert config.broker == "redis://own:6379/1"
    assert config.drain.streak == 4 and config.drain.interval == 15.0
    assert config.targets == ()
    assert config.source == str(tmp_path / "celeryops.toml")


def test_explicit_config_path_and_pyproject_by_name(tmp_path: Path) -> None:
    sub = tmp_path / "conf"
    sub.mkdir()
    write(sub / "ops.toml", 'app = "x:app"\nstate_dir = "st"\n')
    config = load_config("conf/ops.toml", tmp_path, {}, {})
    assert config.app == "x:app"
    assert config.state_dir == str(sub / "st")
    write(sub / "pyproject.toml", FULL_PYPROJECT)
    assert load_config(str(sub / "pyproject.toml"), tmp_path, {}, {}).release.remote == "upstream"


def test_defaults_without_any_file(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n')
    assert load_config(None, tmp_path, {}, {}) == Config()


def test_env_overrides_file_and_flags_override_env(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", FULL_PYPROJECT)
    env = {
        "CELERYOPS_BROKER": "redis://env:6379/0",
        "CELERYOPS_APP": "env.celery:app",
        "CELERYOPS_STATE_DIR": "/var/lib/celeryops",
        "CELERYOPS_DRAIN_INTERVAL": "2.5",
        "CELERYOPS_DRAIN_STREAK": "5",
        "CELERYOPS_DRAIN_MAX_WAIT": "60",
        "CELERYOPS_RELEASE_REMOTE": "env-remote",
        "CELERYOPS_RELEASE_MAX_AGE_DAYS": "30",
        "CELERYOPS_TEST_BROKER": "not a setting: ignored",
    }
    config = load_config(None, tmp_path, env, {})
    assert (config.broker, config.app, config.state_dir) == ("redis://env:6379/0", "env.celery:app",
                                                             "/var/lib/celeryops")
    assert config.drain == DrainSettings(interval=2.5, streak=5, max_wait=60.0)
    assert config.release == ReleaseSettings(remote="env-remote", max_age_days=30)

    flags = {"broker": "redis://flag:6379/0", "drain_interval": 1, "drain.streak": None, "release.max_age_days": 1,
             "state_dir": "rel"}
    config = load_config(None, tmp_path, env, flags)
    assert config.broker == "redis://flag:6379/0"
    assert config.drain.interval == 1.0
    assert config.drain.streak == 5  # None = flag not given: the environment's value stays
    assert config.release.max_age_days == 1
    assert config.state_dir == str(tmp_path / "rel")


def test_is_loopback_endpoint() -> None:
    for ok in ("127.0.0.1:8089", "127.1.2.3", "localhost:1", "[::1]:8089", "::1"):
        assert is_loopback_endpoint(ok), ok
    for bad in ("run.googleapis.com:443", "10.0.0.1:8089", "[2001:db8::1]:1", "localhost.evil.com:1"):
        assert not is_loopback_endpoint(bad), bad


TARGET = """
[[targets]]
name = "worker"
kind = "cloudrun-service"
project = "p"
region = "r"
resource = "svc"
image = "img:{sha}"
"""

BAD_CONFIGS = [
    ("top-level typo", 'brokr = "redis://x"', "brokr is not a setting (did you mean 'broker'?)."),
    ("drain typo", "[drain]\nintervall = 3", "drain.intervall is not a setting (did you mean 'interval'?)."),
    ("wrong type", '[drain]\nstreak = "two"', "drain.streak must be a whole number, not a string 'two'."),
    ("float streak", "[drain]\nstreak = 1.5", "drain.streak must be a whole number, not a float 1.5."),
    ("zero interval", "[drain]\ninterval = 0", "drain.interval must be more than 0 seconds, not 0."),
    ("bool max_wait", "[drain]\nmax_wait = true", "drain.max_wait must be a number of seconds, not a boolean True."),
    ("negative age", "[release]\nmax_age_days = -1", "release.max_age_days must be at least 0, not -1."),
    ("remote type", "[release]\nremote = 3", "release.remote must be a string, not an integer 3."),
    ("drain not a table", "drain = 3", "drain must be a table ([drain]), not an integer."),
    ("targets not array", 'targets = "x"', "targets must be an array of tables ([[targets]])."),
    ("empty broker", 'broker = ""', "broker is empty; remove it or give a value."),
    ("missing field", TARGET.replace('region = "r"\n', ""),
     "target 'worker' has no region; a cloudrun-service target needs project, region, resource and image."),
    ("missing name", TARGET.replace('name = "worker"\n', ""), "targets[1] has no name"),
    ("duplicate names", TARGET + TARGET, "The target name 'worker' is used twice; target names must be unique."),
    ("bad kind", TARGET.replace("cloudrun-service", "cloudrun-servise"),
     "target 'worker': kind 'cloudrun-servise' is not a target kind (did you mean 'cloudrun-service'?); use one of "
     '"cloudrun-service", "cloudrun-worker-pool", "command".'),
    ("no kind", TARGET.replace('kind = "cloudrun-service"\n', ""), "target 'worker' has no kind"),
    ("target key typo", TARGET + 'regoin = "x"\n',
     "target 'worker': regoin is not a setting (did you mean 'region'?)."),
    ("unknown placeholder", TARGET.replace("{sha}", "{commit}"),
     "target 'worker': image uses the unknown placeholder {commit}; the placeholders are {sha}, {short_sha}, "
     "{branch}, {release}."),
    ("placeholder typo", TARGET.replace("{sha}", "{shortsha}"), "(did you mean {short_sha}?)"),
    ("format spec", TARGET.replace("{sha}", "{sha:.7}"), "target 'worker': image has the field {sha:.7}, which is not "
     "a placeholder"),
    ("unbalanced brace", TARGET.replace("{sha}", "{sha"), "target 'worker': image has unbalanced braces"),
    ("insecure remote", TARGET + 'api_endpoint = "run.example.com:443"\ninsecure = true\n',
     "target 'worker': insecure = true is refused for api_endpoint 'run.example.com:443', which is not a loopback "
     "address"),
    ("insecure without endpoint", TARGET + "insecure = true\n",
     "target 'worker': insecure = true needs an api_endpoint on the loopback interface"),
    ("insecure type", TARGET + 'insecure = "yes"\n', "target 'worker': insecure must be true or false, not a string"),
    ("timeout zero", TARGET + "timeout = 0\n", "target 'worker': timeout must be more than 0 seconds, not 0."),
    ("command on cloudrun", TARGET + 'command = "x"\n', 'target \'worker\': command only applies to kind = "command"'),
    ("command missing", '[[targets]]\nname = "c"\nkind = "command"\n',
     "target 'c' has no command; a command target needs command = \"...\"."),
    ("command stray keys", '[[targets]]\nname = "c"\nkind = "command"\ncommand = "true"\nproject = "p"\n',
     "target 'c': project only apply to Cloud Run targets"),
    ("command placeholder", '[[targets]]\nname = "c"\nkind = "command"\ncommand = "deploy {img}"\n',
     "target 'c': command uses the unknown placeholder {img} (did you mean {image}?)"),
    ("command image without template", '[[targets]]\nname = "c"\nkind = "command"\ncommand = "deploy {image}"\n',
     "target 'c': command uses {image} but the target has no image template"),
    ("accept unknown check", '[preflight]\naccept = ["fense"]',
     "preflight.accept names the check 'fense', which does not exist (did you mean 'fence'?); the checks whose "
     "warnings can be accepted are branch, freshness, traffic, workers, lease, fence, mixed_versions, broker_safety, "
     f"{', '.join(SETTING_FINDINGS)}."),
    ("accept never-warning check", '[preflight]\naccept = ["validate"]',
     "preflight.accept names the check 'validate', which passes or fails but never warns;"),
    ("accept not a list", '[preflight]\naccept = "fence"',
     "preflight.accept must be an array of check ids such as [\"fence\"], not a string 'fence'."),
    ("preflight typo", '[preflight]\naccepts = ["fence"]',
     "preflight.accepts is not a setting (did you mean 'accept'?)."),
    ("traffic mode", TARGET + 'traffic = "all"\n',
     "target 'worker': traffic 'all' is not a traffic mode; use traffic = \"latest\""),
    ("traffic on a command", '[[targets]]\nname = "c"\nkind = "command"\ncommand = "true"\ntraffic = "latest"\n',
     "target 'c': traffic only apply to Cloud Run targets"),
]


@pytest.mark.parametrize(("text", "sentence"), [(t, s) for _, t, s in BAD_CONFIGS], ids=[i for i, _, _ in BAD_CONFIGS])
def test_bad_config_gives_its_sentence(tmp_path: Path, text: str, sentence: str) -> None:
    write(tmp_path / "celeryops.toml", text)
    with pytest.raises(UserError) as info:
        load_config(None, tmp_path, {}, {})
    message = str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    assert sentence in message
    assert message.startswith(str(tmp_path / "celeryops.toml") + " has a problem: ")
    assert message.endswith("Nothing was run; fix the configuration and try again.")
    assert "\n" not in message


def test_all_problems_are_listed_together(tmp_path: Path) -> None:
    write(tmp_path / "celeryops.toml", 'brokr = 1\n[drain]\nstreak = 0\n' + TARGET + TARGET)
    with pytest.raises(UserError) as info:
        load_config(None, tmp_path, {}, {})
    message = str(info.value)
    assert "has 3 problems:" in message
    assert "brokr is not a setting" in message and "drain.streak must be at least 1, not 0." in message
    assert "used twice" in message


@pytest.mark.parametrize(("env", "sentence"), [
    ({"CELERYOPS_DRAIN_STREAK": "two"}, "$CELERYOPS_DRAIN_STREAK must be a whole number, not 'two'."),
    ({"CELERYOPS_DRAIN_INTERVAL": "soon"}, "$CELERYOPS_DRAIN_INTERVAL must be a number of seconds, not 'soon'."),
    ({"CELERYOPS_DRAIN_MAX_WAIT": "nan"}, "$CELERYOPS_DRAIN_MAX_WAIT must be a finite number of seconds"),
    ({"CELERYOPS_RELEASE_MAX_AGE_DAYS": "-3"}, "$CELERYOPS_RELEASE_MAX_AGE_DAYS must be at least 0, not -3."),
])
def test_bad_environment_value(tmp_path: Path, env: dict[str, str], sentence: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, tmp_path, env, {})
    assert sentence in str(info.value)
    assert info.value.exit_code == EXIT_USAGE


def test_bad_override_key_and_value(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, tmp_path, {}, {"drain_intervl": 3, "drain.streak": "x"})
    message = str(info.value)
    assert "The setting 'drain_intervl' does not exist (did you mean 'drain_interval'?)." in message or \
        "The setting 'drain_intervl' does not exist" in message
    assert "the option for drain.streak must be a whole number, not 'x'." in message


def test_missing_config_file_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        load_config("nope.toml", tmp_path, {}, {})
    assert f"The configuration file {tmp_path / 'nope.toml'} does not exist" in str(info.value)
    assert info.value.exit_code == EXIT_USAGE
    write(tmp_path / "celeryops.toml", "broker = \n")
    with pytest.raises(UserError) as info:
        load_config(None, tmp_path, {}, {})
    assert "is not valid TOML (" in str(info.value) and "line 1" in str(info.value)


def test_unknown_target_name_suggests(tmp_path: Path) -> None:
    write(tmp_path / "celeryops.toml", TARGET)
    config = load_config(None, tmp_path, {}, {})
    with pytest.raises(UserError) as info:
        config.target("wroker")
    assert "There is no deploy target 'wroker' (did you mean 'worker'?) (targets: worker)" in str(info.value)
    assert info.value.exit_code == EXIT_USAGE


def test_passwords_never_reach_the_error(tmp_path: Path) -> None:
    write(tmp_path / "celeryops.toml", 'broker = ["redis://:hunter2@redis:6379/0"]\n')
    with pytest.raises(UserError) as info:
        load_config(None, tmp_path, {}, {})
    assert "broker must be a string" in str(info.value)
    assert "hunter2" not in str(info.value)
