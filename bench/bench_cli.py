"""Command-line start-up (printed table, not a test): whole processes, in the same venv, taken in turns.

  anchor        ``celery --version``
  --version     ``celeryops --version``;  --help  ``celeryops --help``
  status        ``celeryops status --json --broker URL`` against a live fleet (a private redis-server, 2 real workers)
  worker side   what ``from celeryops.fence import install`` / ``from celeryops.slots import install`` (what a worker
                that installs them imports) adds to a worker's start: a fresh process first imports what a Celery
                worker on a Redis broker imports anyway (celery.worker, celery.apps.worker, the Redis transport,
                redis-py), then the statement runs; its time is what it adds.

Targets: --version and --help <= 0.3x the anchor; status <= 1.0x; fence and slots each add <= 50 ms.

Our modules are byte-compiled first (``compileall``, as ``pip install`` does), so the numbers are those of an
installed copy even where PYTHONDONTWRITEBYTECODE is set.

Usage: .venv/bin/python bench/bench_cli.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import celeryops
from common import bench_fleet, measure_interleaved, ms, ratio, table

TARGET_VERSION = 0.3
TARGET_STATUS = 1.0
TARGET_IMPORT = 0.050
WORKER_IMPORTS = "import celery.worker, celery.apps.worker, celery.worker.control, kombu.transport.redis, redis"


def script(name: str) -> list[str]:
    path = Path(sys.executable).parent / name
    return [str(path)] if path.exists() else [sys.executable, "-m", name]


def run(cmd: list[str], expect: Callable[[str], bool], env: dict[str, str] | None = None) -> Callable[[], None]:
    def call() -> None:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        if out.returncode != 0 or not expect(out.stdout):
            raise RuntimeError(f"{cmd} failed ({out.returncode}): {out.stdout[-300:]} {out.stderr[-500:]}")

    return call


def added_import(statement: str, repeats: int) -> list[float]:
    """Seconds ``statement`` takes in a fresh process that already imported what a Redis-broker worker does."""
    code = (f"import time; {WORKER_IMPORTS}; t0 = time.perf_counter(); {statement}; "
            "print(time.perf_counter() - t0)")
    samples = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
        samples.append(float(out.stdout.strip()))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    package = Path(celeryops.__file__).parent
    compileall.compile_dir(str(package), quiet=1)
    print(f"celeryops from {package}; load average at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")

    rows: list[list[object]] = []
    with bench_fleet() as bench, tempfile.TemporaryDirectory(prefix="celeryops-bench-state-") as state:
        bench.add(2)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_") and k != "CELERY_BROKER_URL"}
        env["CELERYOPS_STATE_DIR"] = state

        def status_ok(out: str) -> bool:
            report = json.loads(out)
            return report.get("fleet") == "default" and not report.get("notes")  # Redis answered: no note

        t = measure_interleaved({
            "anchor": run([*script("celery"), "--version"], lambda out: bool(out.strip())),
            "version": run([*script("celeryops"), "--version"], lambda out: "celeryops, version" in out),
            "help": run([*script("celeryops"), "--help"], lambda out: "Commands:" in out and "status" in out),
            "status": run([*script("celeryops"), "status", "--json", "--broker", bench.broker], status_ok, env),
        }, args.repeats, warmup=1)
    anchor = t["anchor"].median
    for key, label, target in (("version", "celeryops --version", TARGET_VERSION),
                               ("help", "celeryops --help", TARGET_VERSION),
                               ("status", "celeryops status --json (live fleet)", TARGET_STATUS)):
        value = t[key].median
        rows.append([label, f"{ms(value)} / {ms(t[key].p95)}", ratio(value, anchor), f"<= {target:g}x",
                     "met" if value <= target * anchor else "MISSED"])
    rows.insert(0, ["celery --version (anchor)", f"{ms(anchor)} / {ms(t['anchor'].p95)}", "1.000x", "", ""])
    for statement in ("from celeryops.fence import install", "from celeryops.slots import install"):
        samples = added_import(statement, args.repeats)
        value = statistics.median(samples)
        rows.append([f"{statement} (in a worker)", f"{ms(value)} / {ms(max(samples))}", "",
                     f"<= {TARGET_IMPORT * 1000:.0f} ms", "met" if value <= TARGET_IMPORT else "MISSED"])
    print()
    print(table(["process", "ms median / max-or-p95", "vs anchor", "target", ""], rows,
                title=f"Command-line start-up, whole processes in turns ({args.repeats} each)"))
    return 0


if __name__ == "__main__":
    t_start = time.monotonic()
    code = main()
    print(f"\ntotal {time.monotonic() - t_start:.0f} s")
    sys.exit(code)
