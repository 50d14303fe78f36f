"""Each finalist round of a model's tuning, as the decision saw it: TVM's plan's median in the
round (and how many times its fastest round that is) and every finalist's gain over it, rounds
run in a slow spell of the host (decision.in_slow_spell) marked. Reads a tuning log; nothing is
measured.

    python scripts/finalist_rounds.py LOG_DIR MODEL [MODEL ...]

MODEL is the ONNX file (or built-in model name) that was tuned, e.g. after
`python scripts/benchmark.py --trials 24 --repeat 10`:
`python scripts/finalist_rounds.py benchmarks/logs benchmarks/models/gpt2.onnx`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from autofuse import models
from autofuse.decision import in_slow_spell
from autofuse.tuning_log import TuningLog
from autofuse.workload import prepare


def rounds_of(records: list) -> list[dict[str, list[float]]]:
    """Finalist records in log order, cut into rounds: a round ends where a plan comes again."""
    rounds: list[dict[str, list[float]]] = []
    for rec in records:
        if not rounds or rec.plan_key in rounds[-1]:
            rounds.append({})
        rounds[-1][rec.plan_key] = rec.measurement["latencies_s"]
    return rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log_dir", type=Path)
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    log = TuningLog(args.log_dir)
    for name in args.models:
        source = Path(name)
        if not source.exists() and name in models.BUILTIN:
            source = models.write_builtin(name, tempfile.mkdtemp(prefix="autofuse-"))
        w = prepare(source)
        default = w.tvm_default().key
        finals = [r for r in log.records(w.key) if r.role == "finalist" and r.measurement.get("status") == "ok"]
        for study in dict.fromkeys(r.study for r in finals):
            rounds = [r for r in rounds_of([f for f in finals if f.study == study]) if default in r]
            if not rounds:
                continue
            tvm = [statistics.median(r[default]) for r in rounds]
            fastest = min(tvm)
            print(f"{w.name} ({study}): TVM's plan {default}")
            for t, r in zip(tvm, rounds):
                gains = "  ".join(f"{k[:8]} {(t - statistics.median(v)) / t:+.1%}" for k, v in r.items() if k != default)
                mark = "  slow spell" if in_slow_spell(t, fastest) else ""
                print(f"  TVM's plan {t * 1e6:8.1f} us  x{t / fastest:.2f}   {gains}{mark}")


if __name__ == "__main__":
    main()
