"""What a worker image pays for celeryops: site-packages size and package count of a fresh venv with
``celery[redis]`` alone (the anchor), with the ``celeryops`` wheel (no extra: what ``celeryops.fence`` and
``celeryops.slots`` need), and with ``celeryops[console]`` (the operator's install), all installed from the package
index in the same run. Prints a table; asserts only that every install succeeded and the worker side imports.

    .venv/bin/python bench/bench_install.py        # ~1-2 min (downloads are cached by pip)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from common import table

ROOT = Path(__file__).resolve().parent.parent


def site_packages(env: Path) -> Path:
    out = subprocess.check_output([str(env / "bin" / "python"), "-c",
                                   "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True)
    return Path(out.strip())


def measure(env: Path) -> tuple[float, int]:
    """(MB on disk, distributions installed) of the venv's site-packages, pip/setuptools excluded."""
    site = site_packages(env)
    skip = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth")
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file()
               and not any(part.startswith(skip) for part in p.relative_to(site).parts[:1]))
    dists = [p for p in site.glob("*.dist-info") if not p.name.startswith(("pip-", "setuptools-"))]
    return size / 1e6, len(dists)


def install(env: Path, *requirements: str) -> None:
    venv.create(env, with_pip=True)
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-c", str(ROOT / "constraints.txt"), *requirements], check=True, timeout=900)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        root = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(root / "dist"), str(ROOT)], check=True, timeout=600)
        (wheel,) = (root / "dist").glob("celeryops-*.whl")
        cases = [("celery[redis] alone (anchor)", ("celery[redis]",)),
                 ("celeryops (worker install)", (str(wheel),)),
                 ("celeryops[console] (operator)", (f"celeryops[console] @ {wheel.as_uri()}",))]
        rows = []
        anchor = 0.0
        for name, reqs in cases:
            env = root / name.split()[0].replace("[", "-").replace("]", "")
            install(env, *reqs)
            check = "import celeryops.fence, celeryops.slots" if "celeryops" in name else "import celery, redis"
            subprocess.run([str(env / "bin" / "python"), "-c", check], check=True, timeout=120)
            mb, count = measure(env)
            anchor = anchor or mb
            rows.append((name, f"{mb:.1f} MB", str(count), f"{mb / anchor:.2f}x"))
        print(table(("install", "site-packages", "packages", "size vs anchor"), rows))


if __name__ == "__main__":
    main()
