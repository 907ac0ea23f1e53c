"""``make chaos``: seeded chaos trials of ``celeryops deploy`` with real workers, then the summary tables.

    python tools/chaos.py                  # 100 drain trials (seeds 1..100), then 40 overlap trials (seeds 1..40)
    python tools/chaos.py -n 20 --first 500
    python tools/chaos.py --seed 17 --seed 42 --keep-logs   # replay failing seeds, keep every trial's logs
    python tools/chaos.py --fleet plain    # workers without the celeryops.fence plugin (see README limitations)
    python tools/chaos.py --broker amqp    # RabbitMQ on 127.0.0.1:5672 (a vhost per trial; Redis keeps lease, fence)
    python tools/chaos.py --strategy overlap   # only the 40 overlap trials: a worker pool, --strategy overlap
    python tools/chaos.py --strategy drain     # only the 100 drain trials
    python tools/chaos.py --strategy canary    # 20 canary trials: a worker pool, --strategy canary, the deploy
                                               #   SIGINT/SIGTERM/SIGKILLed at one of its steps, then abort/resume
    python tools/chaos.py --strategy autoscale # 40 autoscale trials: a worker pool sized by `celeryops autoscale`,
                                               #   interrupted at each journal record of its steps, and more
    python tools/chaos.py --strategy all       # drain, overlap, canary, then autoscale

Exit status 1 when any trial lost a task, ran one twice, left a live worker not consuming, or hit an anomaly (an
exit code its faults do not explain, a recovery that leaves a run open or consumers stopped; in overlap trials, an
instance the stand-in took away, SIGTERM or SIGKILL, while a task ran on it; in canary trials, a worker of the new
revision still consuming once the canary was taken away; in autoscale trials, a count lowered while an instance of
that revision ran or held a task, a fence left up).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from celeryops_harness.chaos import BROKERS, FLEET_KINDS, STRATEGIES, ChaosLab, summary

#: Trials per strategy when -n is not given: 100 drain deploys of a service, 40 overlap deploys of a worker pool,
#: 20 canary deploys of a worker pool, 40 autoscaled worker pools.
DEFAULT_TRIALS = {"drain": 100, "overlap": 40, "canary": 20, "autoscale": 40}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--trials", type=int, default=None,
                        help="How many trials per strategy (default 100 drain, 40 overlap, 20 canary, 40 autoscale).")
    parser.add_argument("--first", type=int, default=1, help="The first seed (seeds are consecutive).")
    parser.add_argument("--seed", type=int, action="append", default=[], help="Run exactly these seeds.")
    parser.add_argument("--keep-logs", action="store_true", help="Keep the logs of passing trials too.")
    parser.add_argument("--dir", type=Path, default=None, help="Where trial logs go (default: a temp dir).")
    parser.add_argument("--fleet", choices=FLEET_KINDS, default="fenced",
                        help="What the workers run: the celeryops.fence plugin (default), plain Celery, or both.")
    parser.add_argument("--broker", choices=BROKERS, default="redis",
                        help="The fleet's broker: a private redis-server per trial (default), or RabbitMQ.")
    parser.add_argument("--strategy", choices=(*STRATEGIES, "both", "all"), default=None,
                        help="drain: a service deployed with a drain; overlap: a worker pool deployed with "
                             "--strategy overlap (fence-plugin workers on Redis only); canary: the same with "
                             "--strategy canary; autoscale: a worker pool sized by celeryops autoscale; both: drain "
                             "then overlap (the default; drain only with --fleet or --broker); all: the four.")
    args = parser.parse_args(argv)
    defaults = args.fleet == "fenced" and args.broker == "redis"
    if args.strategy in ("overlap", "canary", "autoscale", "both", "all") and not defaults:
        parser.error(f"--strategy {args.strategy} runs fence-plugin workers on Redis: the overlap, the canary and "
                     "the autoscaler require the plugin on every worker; drop --fleet / --broker.")
    chosen = args.strategy or ("both" if defaults else "drain")
    strategies = {"both": ("drain", "overlap"), "all": STRATEGIES}.get(chosen, (chosen,))
    # SIGTERM (a CI timeout) unwinds like Ctrl-C, so every worker and redis-server of the lab is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    root = args.dir or Path(tempfile.mkdtemp(prefix="celeryops-chaos-"))
    labs: list[ChaosLab] = []
    for strategy in strategies:
        trials = args.trials if args.trials is not None else DEFAULT_TRIALS[strategy]
        seeds = args.seed or list(range(args.first, args.first + trials))
        if len(strategies) > 1:
            print(f"== {strategy} trials", flush=True)
        with ChaosLab(root / strategy, keep_logs=args.keep_logs, fleet=args.fleet, broker=args.broker,
                      strategy=strategy) as lab:
            labs.append(lab)
            for seed in seeds:
                result = lab.run(seed)
                print(result.line(), flush=True)
                if not result.ok or result.anomalies:
                    print(f"  logs kept in {result.log_dir}", flush=True)
    for lab in labs:
        print()
        print(summary(lab.results))
    return 0 if all(r.ok and not r.anomalies for lab in labs for r in lab.results) else 1

if __name__ == "__main__":
    sys.exit(main())
