"""A tuning log's fastest finalist other than TVM's plan, measured against TVM's plan in more
decision rounds (decision.measure_rounds: each round a fresh worker, the two plans timed in
turns; rounds in a slow spell of the host left out and run again, as the tuner does): whether a
gain the decision did or did not take holds up. Prints each batch's per-round gains, sorted,
their standard deviation and mean, and how many rounds ran in a slow spell.

    python scripts/finalist_more_rounds.py MODEL LOG_DIR [--rounds 8] [--batches 4]

e.g. after `autofuse tune mobilenetv2.onnx --log-dir L --trials 12`:
`python scripts/finalist_more_rounds.py mobilenetv2.onnx L`.
"""

from __future__ import annotations

import argparse
import statistics

from autofuse.build import MeasureConfig
from autofuse.decision import measure_rounds
from autofuse.measure import IsolatedMeasurer
from autofuse.plan import FusionPlan
from autofuse.tuning_log import TuningLog
from autofuse.workload import prepare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("log_dir")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per batch")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="samples per plan a round (the tuner's finals: 3)")
    args = ap.parse_args()
    w = prepare(args.model)
    default = w.tvm_default()
    finals = [r for r in TuningLog(args.log_dir).records(w.key, "llvm")
              if r.role == "finalist" and r.plan_key != default.key and r.measurement.get("median_s")]
    if not finals:
        raise SystemExit(f"no finalist other than TVM's plan for {args.model} in {args.log_dir}")
    plan = FusionPlan.from_dict(min(finals, key=lambda r: r.measurement["median_s"]).plan)
    print(f"{args.model}: finalist {plan.key} ({plan.num_kernels} kernels) vs TVM's plan {default.key}")
    cfg = MeasureConfig(repeat=args.repeat)
    with IsolatedMeasurer(w, config=cfg) as m:
        for b in range(args.batches):
            rounds = measure_rounds(lambda ps, c: m.measure_together(ps, config=c), [plan, default], args.rounds,
                                    cfg, between=m.restart, reference=default.key)
            if plan.key not in rounds.per_round or default.key not in rounds.per_round:
                print(f"batch {b + 1}: a plan failed: {sorted(rounds.failed)}")
                continue
            gains = sorted(1 - a / d for a, d in zip(rounds.per_round[plan.key], rounds.per_round[default.key]))
            print(f"batch {b + 1}: gains {' '.join(f'{g:+.1%}' for g in gains)}; "
                  f"std {statistics.stdev(gains):.1%}, mean {statistics.fmean(gains):+.1%}; "
                  f"{rounds.slow_rounds} rounds in a slow spell")


if __name__ == "__main__":
    main()
