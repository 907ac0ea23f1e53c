"""``make chaos``: N seeded chaos trials of ``celeryops deploy`` with real workers, then the summary table.

    python tools/chaos.py                  # 100 trials, seeds 1..100
    python tools/chaos.py -n 20 --first 500
    python tools/chaos.py --seed 17 --seed 42 --keep-logs   # replay failing seeds, keep every trial's logs
    python tools/chaos.py --fleet plain    # workers without the celeryops.fence plugin (see README limitations)
    python tools/chaos.py --broker amqp    # RabbitMQ on 127.0.0.1:5672 (a vhost per trial; Redis keeps lease, fence)
    python tools/chaos.py --strategy overlap -n 40   # a worker pool deployed with --strategy overlap (issue 19)

Exit status 1 when any trial lost a task, ran one twice, left a live worker not consuming, or hit an anomaly (an
exit code its faults do not explain, a recovery that leaves a run open or consumers stopped; in overlap trials, an
instance the stand-in took away, SIGTERM or SIGKILL, while a task ran on it).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from celeryops_harness.chaos import BROKERS, FLEET_KINDS, STRATEGIES, ChaosLab, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--trials", type=int, default=100, help="How many trials (default 100).")
    parser.add_argument("--first", type=int, default=1, help="The first seed (seeds are consecutive).")
    parser.add_argument("--seed", type=int, action="append", default=[], help="Run exactly these seeds.")
    parser.add_argument("--keep-logs", action="store_true", help="Keep the logs of passing trials too.")
    parser.add_argument("--dir", type=Path, default=None, help="Where trial logs go (default: a temp dir).")
    parser.add_argument("--fleet", choices=FLEET_KINDS, default="fenced",
                        help="What the workers run: the celeryops.fence plugin (default), plain Celery, or both.")
    parser.add_argument("--broker", choices=BROKERS, default="redis",
                        help="The fleet's broker: a private redis-server per trial (default), or RabbitMQ.")
    parser.add_argument("--strategy", choices=STRATEGIES, default="drain",
                        help="drain: a service deployed with a drain (default); overlap: a worker pool deployed with "
                             "--strategy overlap (fence-plugin workers on Redis only).")
    args = parser.parse_args(argv)
    if args.strategy == "overlap" and (args.fleet != "fenced" or args.broker != "redis"):
        parser.error("--strategy overlap runs fence-plugin workers on Redis: the overlap requires the plugin on "
                     "every worker; drop --fleet / --broker.")
    # SIGTERM (a CI timeout) unwinds like Ctrl-C, so every worker and redis-server of the lab is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    seeds = args.seed or list(range(args.first, args.first + args.trials))
    root = args.dir or Path(tempfile.mkdtemp(prefix="celeryops-chaos-"))
    with ChaosLab(root, keep_logs=args.keep_logs, fleet=args.fleet, broker=args.broker,
                  strategy=args.strategy) as lab:
        for seed in seeds:
            result = lab.run(seed)
            print(result.line(), flush=True)
            if not result.ok or result.anomalies:
                print(f"  logs kept in {result.log_dir}", flush=True)
    print()
    print(summary(lab.results))
    return 0 if all(r.ok and not r.anomalies for r in lab.results) else 1


if __name__ == "__main__":
    sys.exit(main())
