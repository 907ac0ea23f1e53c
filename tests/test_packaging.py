"""The built wheel: it carries the styles, and installed into a fresh venv it runs (issue 2, issue 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STYLES = sorted(p.name for p in (ROOT / "styles").glob("*.tcss"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("celeryops-*.whl")
    return built


@pytest.mark.xdist_group("wheel")  # one worker builds the wheel for all three
def test_wheel_contains_every_stylesheet(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(Path(n).name for n in names if n.startswith("celeryops/styles/") and n.endswith(".tcss"))
    assert STYLES and shipped == STYLES


@pytest.mark.xdist_group("wheel")  # one worker builds the wheel for all three
def test_installed_wheel_runs_version_headless_demo_and_finds_styles(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv with only the wheel installed (its dependencies are borrowed from this venv's site-packages
    through a path entry, so the test needs no network; the checkout itself is not importable there)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([str(env_dir / "bin" / "python"), "-c", probe], text=True).strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_")}
    env["CELERYOPS_STATE_DIR"] = str(tmp_path / "state")
    cli = str(env_dir / "bin" / "celeryops")
    python = str(env_dir / "bin" / "python")

    where = subprocess.run([python, "-c", "import celeryops, sys; print(celeryops.__file__)"], env=env,
                           capture_output=True, text=True, cwd=tmp_path, check=True).stdout.strip()
    assert where.startswith(str(site)), f"celeryops was imported from {where}, not from the installed wheel"

    version = subprocess.run([cli, "--version"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert version.returncode == 0 and "celeryops, version" in version.stdout

    styles = subprocess.run([python, "-c", "from celeryops.console.stylesheets import stylesheets, styles_dir; "
                             "print(styles_dir()); print(','.join(sorted(p.name for p in stylesheets())))"],
                            env=env, capture_output=True, text=True, cwd=tmp_path)
    assert styles.returncode == 0, styles.stderr
    folder, names = styles.stdout.strip().splitlines()
    assert folder.startswith(str(site)) and names.split(",") == STYLES

    demo = subprocess.run([cli, "demo", "--headless", "--json", "--speed", "20"], env=env, capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    last = json.loads(demo.stdout.strip().splitlines()[-1])
    assert last["event"] == "deployed"


@pytest.mark.xdist_group("wheel")  # one worker builds the wheel for all three
def test_plain_install_requires_only_celery_and_redis(wheel: Path) -> None:
    """A worker image installs plain `celeryops` for celeryops.fence / celeryops.slots: no Textual, no Google."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    required = sorted(line.split(":", 1)[1].strip().split(";")[0].replace(" ", "")
                      for line in lines if line.startswith("Requires-Dist:") and "extra ==" not in line)
    assert [r.split(">")[0].split("=")[0].split("<")[0] for r in required] == ["celery[redis]", "redis"], required
    console = [line for line in lines if (line.startswith("Requires-Dist:") and "extra == 'console'" in line)
               or 'extra == "console"' in line]
    assert any("textual" in line for line in console) and any("google-cloud-run" in line for line in console)


HIDE = "import sys\nfor name in ('textual', 'google', 'grpc', 'humanize', 'platformdirs', 'fakeredis'):\n" \
       "    sys.modules[name] = None  # as if not installed\n"


def test_worker_side_imports_and_installs_without_the_console_extra() -> None:
    code = HIDE + ("from celery import Celery\nfrom celeryops import fence, slots\n"
                   "app = Celery('w', broker='redis://127.0.0.1:1/0')\nfence.install(app)\n"
                   "slots.install(app, totals={'cpu': 2}, detect=False)\nprint('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_cli_without_the_console_extra_exits_2_naming_the_install() -> None:
    code = HIDE + "sys.argv = ['celeryops', 'status']\nfrom celeryops.cli import main\nmain()\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("celeryops: ") and "pip install 'celeryops[console]'" in line and "nothing was run" in line
