"""Batches of compiled plans measured elsewhere: export here, run with `runner.py` on the device
host (TVM runtime only) or through TVM RPC, ingest the results into the tuning log.

This is how GPU tuning works when the tuning host has no GPU: it compiles (CUDA code generation
and ptxas need no device), a remote device measures, and the search continues from the log
with real numbers. A batch directory holds:

    manifest.json        model key, target, inputs/expected outputs, one entry per plan
    runner.py            the self-contained runner (copied from autofuse/runner.py)
    input_*.npy, expected_*.npy
    plans/<plan key>.so  one exported Relax executable per plan
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from autofuse.features import group_rows
from autofuse.measure import IsolatedMeasurer
from autofuse.measure import Measurement
from autofuse.metrics import plan_metrics
from autofuse.plan import FusionPlan
from autofuse.space import SearchSpace
from autofuse.tuning_log import TuningLog
from autofuse.tuning_log import TuningRecord
from autofuse.workload import Workload

BATCH_SCHEMA = 1


class BatchError(ValueError):
    """A batch or results file that cannot be used (one line, for the CLI)."""


def candidate_plans(
    w: Workload, space: SearchSpace, count: int, target: str, log: TuningLog | None = None, seed: int = 0
) -> list[tuple[str, FusionPlan]]:
    """Up to `count` distinct plans worth measuring on the device, in this order:

    1. the references: unfused, TVM's default, and the fastest plan the log has timed on this
       target (re-timed in every batch, so a batch's decision compares plans of one run);
    2. the seeds the tuner starts from (TVM's plan plus every horizontal fusion — what GPUs
       gain most from, fewer launches —, reduction->broadcast, anchors, epilogues), then the
       plans of each fusion kind;
    3. plans the log has built for this target but not timed, best predicted first: what a
       `tune` run on the compiling host proposed from the cost model trained on earlier batches;
    4. random points of the plan space.

    Plans the log already timed on this target are left out of 2-4: a second batch measures
    new plans instead of the first batch's again."""
    mine = [r for r in log.records() if r.model_key == w.key and r.target == target
            and r.role != "best"] if log is not None else []
    timed = sorted((r for r in mine if r.status == "ok" and r.measurement.get("median_s")),
                   key=lambda r: r.measurement["median_s"])
    done = {r.plan_key for r in timed}
    out: dict[str, tuple[str, FusionPlan]] = {}

    def add(label: str, plan: FusionPlan, again: bool = False) -> None:
        if plan.key not in out and len(out) < count and (again or plan.key not in done):
            out[plan.key] = (label, plan)

    default = w.tvm_default()
    add("unfused", w.unfused(), again=True)
    add("tvm_default", default, again=True)
    if timed:
        add(f"log:{timed[0].plan_key[:8]}", FusionPlan.from_dict(timed[0].plan), again=True)
    for plan in space.plus_kinds(default):
        add(plan.name, plan)
    for kinds in (("vertical",), ("vertical", "horizontal"), ("vertical", "reduction"),
                  ("vertical", "horizontal", "reduction")):
        add("+".join(kinds), space.plan_of_kinds(set(kinds)))
    built = sorted((r for r in mine if r.status == "built"), key=lambda r: r.predicted_s or float("inf"))
    for r in built:
        add(f"log:{r.plan_key[:8]}", FusionPlan.from_dict(r.plan))
    rng = random.Random(seed)
    for _ in range(20 * count):
        if len(out) >= count:
            break
        add(f"random:{len(out)}", space.decode(space.random_params(rng.random)))
    return list(out.values())


def export_batch(
    measurer: IsolatedMeasurer,
    plans: list[tuple[str, FusionPlan]],
    out_dir: str | Path,
    scheduler: str,
    progress: Any = None,
) -> dict[str, Any]:
    """Build and export `plans` (in the measurer's worker) with the inputs, the expected outputs
    and the runner; returns the manifest. Plans that do not build, or exceed the GPU resource
    limits, are listed under "rejected" with their status: they are measured here already."""
    w = measurer.workload
    out = Path(out_dir)
    (out / "plans").mkdir(parents=True, exist_ok=True)
    ref = measurer.write_reference(str(out))
    if ref.get("status") != "ok":
        raise BatchError(f"could not compute the reference outputs: {ref.get('error')}")
    target_kind = "cuda" if measurer.target.startswith("cuda") else "llvm"
    manifest: dict[str, Any] = {
        "schema": BATCH_SCHEMA,
        "batch": uuid.uuid4().hex[:12],
        "model_key": w.key,
        "model_name": w.name,
        "target": measurer.target,
        "scheduler": scheduler,
        "inputs": ref["inputs"],
        "expected": ref["expected"],
        "tolerance": ref["tolerance"],
        "entries": [],
        "rejected": [],
    }
    for label, plan in plans:
        library = f"plans/{plan.key}.so"
        res = measurer.export(plan, str(out / library))
        resources = res.get("resources") or {}
        kernels = res.get("kernels") or []
        groups = group_rows(w.graph, plan.groups, kernels, target_kind, resources)
        entry = {"label": label, "plan_key": plan.key, "plan": plan.to_dict(), "groups": groups,
                 "kernels": kernels, "resources": resources, "metrics": plan_metrics(w.graph, plan).to_dict(),
                 "compile_s": res.get("compile_s")}
        if res.get("status") == "built":
            entry.update(library=library, kernel_params=res.get("kernel_params", {}),
                         kernel_names=res.get("kernel_names", {}))
            manifest["entries"].append(entry)
        else:
            entry.update(status=res.get("status"), error=res.get("error"), rule=res.get("rule"))
            manifest["rejected"].append(entry)
        if progress is not None:
            progress(label, res.get("status"))
    shutil.copy(Path(__file__).with_name("runner.py"), out / "runner.py")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def ingest(log: TuningLog, batch_dir: str | Path, results_path: str | Path, min_gain: float = 0.02) -> int:
    """Append the runner's results (and the batch's rejected plans) to `log` as measurements,
    then the batch's decision (see `_decision`); returns how many measurements were written.
    The tuner reads them like its own."""
    manifest = _read_json(Path(batch_dir) / "manifest.json", "batch manifest")
    results = _read_json(Path(results_path), "runner results")
    if results.get("batch") != manifest.get("batch"):
        raise BatchError(f"{results_path} is for batch {results.get('batch')}, not {manifest.get('batch')}")
    entries = {e["plan_key"]: e for e in manifest["entries"]}
    records = []
    for row in results.get("results", []):
        entry = entries.get(row.get("plan_key"))
        if entry is None:
            raise BatchError(f"{results_path}: plan {row.get('plan_key')} is not in the batch")
        status, error = row.get("status", "runtime_error"), row.get("error")
        if status == "checked":  # the run was cut off after checking this plan, before timing it
            status, error = "timeout", "the runner stopped before timing this plan"
        m = Measurement(
            entry["plan_key"], status, latencies_s=tuple(row.get("latencies_s") or ()),
            compile_s=entry.get("compile_s"), max_abs_err=row.get("max_abs_err"), error=error,
            kernels=tuple(entry["kernels"]), resources=entry.get("resources") or {},
            kernel_latencies_s=row.get("kernel_latencies_s") or {},
        )
        records.append(_record(manifest, entry, m, results.get("device", ""), results.get("protocol") or {}))
    for entry in manifest.get("rejected", []):
        m = Measurement(entry["plan_key"], entry.get("status") or "build_error", error=entry.get("error"),
                        rule=entry.get("rule"), kernels=tuple(entry.get("kernels") or ()),
                        resources=entry.get("resources") or {})
        records.append(_record(manifest, entry, m, "", {}))
    in_turns = bool((results.get("protocol") or {}).get("in_turns"))
    best = _decision(manifest, records, min_gain, in_turns)
    for rec in records + ([best] if best else []):
        log.append(rec)
    return len(records)


ROUNDS = 5  # a batch's samples, taken in turns, are judged as this many consecutive rounds


def _decision(manifest: dict[str, Any], records: list[TuningRecord], min_gain: float,
              in_turns: bool) -> TuningRecord | None:
    """The batch's deployable plan, by the tuner's rule: the fastest correct plan, unless it
    beats tvm_default (timed in the same run, on the same device) by no more than the noise and
    `min_gain`. When the runner took the samples in turns, the gain is judged paired, as the
    tuner's finalist rounds are: the samples in ROUNDS consecutive chunks, each chunk's median
    a round. Logged as a 'best' record, which deployment reads first."""
    from autofuse.decision import decide_over_default

    timed = {r.plan_key: r for r in records if r.status == "ok" and r.median_s}
    default = next((e["plan_key"] for e in manifest["entries"] if e["label"] == "tvm_default"), None)
    if not timed or default not in timed:
        return None
    medians = {k: r.median_s for k, r in timed.items()}
    noise = {k: r.measurement.get("spread") or 0.0 for k, r in timed.items()}
    per_round = {k: _chunk_medians(r.measurement.get("latencies_s") or []) for k, r in timed.items()}
    n = len(per_round[default])
    paired = {k: v for k, v in per_round.items() if len(v) == n} if in_turns and n >= 2 else None
    key, _ = decide_over_default(medians, noise, default, min_gain, paired)  # type: ignore[arg-type]
    chosen = timed[key]
    return replace(chosen, role="best", id=uuid.uuid4().hex)


def _chunk_medians(samples: list[float]) -> list[float]:
    size = len(samples) // ROUNDS
    if size == 0:
        return []
    return [statistics.median(samples[i * size:(i + 1) * size]) for i in range(ROUNDS)]


def _record(manifest: dict[str, Any], entry: dict[str, Any], m: Measurement, device: str,
            protocol: dict[str, Any]) -> TuningRecord:
    return TuningRecord(
        model_key=manifest["model_key"], model_name=manifest["model_name"], target=manifest["target"],
        scheduler=manifest["scheduler"], plan=entry["plan"], measurement=m.to_dict(),
        metrics=entry.get("metrics") or {}, groups=entry.get("groups") or [], protocol=protocol,
        role="remote", device=device, study=f"batch:{manifest['batch']}",
    )


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BatchError(f"{what} not found: {path}") from None
    except (OSError, ValueError) as err:
        raise BatchError(f"{path} is not a valid {what}: {err}") from None
    if not isinstance(data, dict):
        raise BatchError(f"{path} is not a valid {what}")
    return data
