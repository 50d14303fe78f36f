"""Measure fusion plans in an isolated worker process; every failure comes back as data.

`Measurement.status` classifies the outcome: ok, built (build-only targets such as CUDA on a
machine without a GPU), illegal, build_error, timeout, runtime_error, wrong_result. A worker that
dies or hangs is killed and replaced; the tuning process itself never runs TVM code that
compiles or executes a plan.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from multiprocessing.connection import Connection
from typing import Any

from autofuse.build import MeasureConfig
from autofuse.build import cpu_threads
from autofuse.gpu_resources import ResourceLimits
from autofuse.plan import FusionLimits
from autofuse.plan import FusionPlan
from autofuse.plan import IllegalPlanError
from autofuse.plan import validate
from autofuse.worker import PARENT_ENV
from autofuse.workload import Workload

# how long a fresh worker may take to import TVM and rebuild the workload before it counts as
# failed to start: 120 s was passed on a loaded 2-core CI machine (another install running)
WORKER_START_S = 300.0


@dataclass(frozen=True)
class Measurement:
    """Outcome of measuring one plan: latency samples, or the failure and its class."""

    plan_key: str
    status: str
    latencies_s: tuple[float, ...] = ()
    compile_s: float | None = None
    max_abs_err: float | None = None
    error: str | None = None
    rule: str | None = None  # the broken legality rule, for status 'illegal'
    wall_s: float = 0.0
    kernels: tuple[str, ...] = ()  # structural hash of each group's kernel, in plan order
    kernel_latencies_s: dict[str, float] = field(default_factory=dict)  # newly timed kernels
    # GPU: registers / spill_bytes / smem_bytes / stack_bytes per kernel hash (gpu_resources)
    resources: dict[str, dict[str, int]] = field(default_factory=dict)
    # TVM's plan timed in turns with this one (IsolatedMeasurer.pair_with_default): sample k of
    # each taken back to back, so that their ratio holds through the host's slow spells
    default_latencies_s: tuple[float, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.latencies_s) if self.latencies_s else None

    @property
    def spread(self) -> float | None:
        """Interquartile range over the median: the run-to-run noise of this measurement."""
        if len(self.latencies_s) < 2:
            return None
        q = statistics.quantiles(self.latencies_s, n=4, method="inclusive")
        return (q[2] - q[0]) / statistics.median(self.latencies_s)

    @property
    def default_s(self) -> float | None:
        """TVM's plan's median in the same turns; None unless it was timed beside this plan."""
        return statistics.median(self.default_latencies_s) if self.default_latencies_s else None

    @property
    def vs_default(self) -> float | None:
        """This plan's latency over TVM's plan's, paired sample by sample (paired_ratio)."""
        return paired_ratio(self.latencies_s, self.default_latencies_s)

    def at_default_s(self, default_s: float | None) -> float | None:
        """This plan's latency had TVM's plan run in `default_s`: the paired ratio times it, which
        compares plans measured minutes apart through the host's drift; without a pair or a
        `default_s`, the plan's own median."""
        ratio = self.vs_default
        return ratio * default_s if ratio and default_s else self.median_s

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["latencies_s"] = list(self.latencies_s)
        out["default_latencies_s"] = list(self.default_latencies_s)
        out["kernels"] = list(self.kernels)
        out["median_s"] = self.median_s
        out["spread"] = self.spread
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Measurement:
        known = {f for f in Measurement.__dataclass_fields__}
        kept = {k: v for k, v in data.items() if k in known}
        kept["latencies_s"] = tuple(kept.get("latencies_s") or ())
        kept["default_latencies_s"] = tuple(kept.get("default_latencies_s") or ())
        kept["kernels"] = tuple(kept.get("kernels") or ())
        return Measurement(**kept)


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The median over paired samples (same index: timed back to back) of a / b; None unless
    both hold the same, non-zero number of samples. Pairing cancels a shared host's slow spells,
    which move both samples of a pair alike."""
    if len(a) != len(b) or not a:
        return None
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    return statistics.median(ratios) if ratios else None


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    conn: Connection


@dataclass
class IsolatedMeasurer:
    """Builds, checks and times plans of one workload in a worker process.

    Args:
        workload: the normalised model.
        target: a target spec ('llvm', 'cuda', ...), see build.make_target.
        config: timing protocol and per-plan timeout.
        limits: legality limits checked before anything is built.
        build_only: compile but do not run (CUDA without a GPU).
        threads: TVM worker threads (0: build.cpu_threads(), one per physical core).
        scheduler: how kernels are scheduled (build.SCHEDULERS; None: the target's default).
        database: MetaSchedule work dir, for scheduler 'metaschedule'.
        resource_limits: GPU kernels over these are 'over_limit' (gpu_resources).
        pair_with_default: `measure` times each plan in turns with TVM's plan (compiled once per
            worker), in `Measurement.default_latencies_s`: the tuner's yardstick for comparing
            plans measured minutes apart on a host whose speed drifts (BERT's trials read 190 us
            and 300 us for near-identical plans, in slow spells lasting tens of seconds).
    """

    workload: Workload
    target: str = "llvm"
    config: MeasureConfig = field(default_factory=MeasureConfig)
    limits: FusionLimits = field(default_factory=FusionLimits)
    build_only: bool = False
    threads: int = 0
    scheduler: str | None = None
    database: str | None = None
    resource_limits: ResourceLimits = field(default_factory=ResourceLimits)
    pair_with_default: bool = False
    _worker: _Worker | None = None
    _work_dir: str | None = None  # the saved workload, and what its workers share (worker.serve)

    def measure(
        self,
        plan: FusionPlan,
        config: MeasureConfig | None = None,
        time_groups: bool = False,
        known_kernels: Collection[str] = (),
        scheduler: str | None = None,
    ) -> Measurement:
        """Build, check and time `plan`.

        Args:
            config: overrides the measurer's timing protocol (e.g. more repeats for finalists).
            time_groups: also time each kernel alone (cost-model data), except `known_kernels`.
            scheduler: overrides the measurer's scheduler for this plan.
        """
        start = time.perf_counter()
        config = config or self.config
        try:
            request = self._plan_request(plan, config, scheduler, build_only=self.build_only,
                                         time_groups=time_groups, known_kernels=sorted(known_kernels))
            if self.pair_with_default and not self.build_only:
                request["paired_with"] = [list(g) for g in self.workload.tvm_default().groups]
        except IllegalPlanError as err:
            return Measurement(plan.key, "illegal", error=str(err), rule=err.rule)
        result = self._exchange(request, config.timeout_s)
        if result.get("stage") == "pair" and result["status"] != "ok":  # TVM's plan killed the worker
            self.pair_with_default = False
            del request["paired_with"]
            result = self._exchange(request, config.timeout_s)
        return self._measurement(plan, result, time.perf_counter() - start)

    @staticmethod
    def _measurement(plan: FusionPlan, result: dict[str, Any], wall_s: float) -> Measurement:
        return Measurement(
            plan.key,
            result.pop("status"),
            latencies_s=tuple(result.pop("latencies_s", ())),
            kernels=tuple(result.pop("kernels", ())),
            default_latencies_s=tuple(result.pop("default_latencies_s", ())),
            wall_s=wall_s,
            **{k: v for k, v in result.items() if k in Measurement.__dataclass_fields__},
        )

    def measure_together(
        self,
        plans: Sequence[FusionPlan],
        config: MeasureConfig | None = None,
        scheduler: str | None = None,
        time_groups: bool = False,
    ) -> list[Measurement]:
        """Build and check `plans` in one worker, then time them in turns, sample by sample
        (build.time_interleaved): the way to compare plans on a shared, noisy host. One
        Measurement per plan, in order; `time_groups` also times each plan's kernels alone, after.
        If the worker dies or times out on the batch, each plan is measured alone instead, so
        one bad plan fails alone."""
        return self._together(plans, config, scheduler, time_groups)[0]

    def measure_beside_onnxruntime(
        self, plans: Sequence[FusionPlan], onnx_path: str, config: MeasureConfig | None = None
    ) -> tuple[list[Measurement], Measurement]:
        """measure_together, with onnxruntime running `onnx_path` (the workload's ONNX model) in
        the worker, its samples taken before the plans run (worker._measure_together: each
        runtime's waiting threads slowed the other's samples when they were taken in turns).
        Returns the plans' Measurements and onnxruntime's (plan key 'onnxruntime'; status
        'runtime_error' where it could not run)."""
        measured, reply = self._together(plans, config, None, False, onnxruntime=onnx_path)
        if reply.get("onnxruntime_latencies_s"):
            return measured, Measurement("onnxruntime", "ok", tuple(reply["onnxruntime_latencies_s"]))
        error = reply.get("onnxruntime_error") or "onnxruntime was not timed"
        return measured, Measurement("onnxruntime", "runtime_error", error=error)

    def _together(
        self, plans: Sequence[FusionPlan], config: MeasureConfig | None, scheduler: str | None, time_groups: bool,
        **extra: Any,
    ) -> tuple[list[Measurement], dict[str, Any]]:
        start = time.perf_counter()
        config = config or self.config
        out: list[Measurement | None] = [None] * len(plans)
        todo: list[int] = []
        requests: list[dict[str, Any]] = []
        for i, plan in enumerate(plans):
            try:
                requests.append(self._plan_request(plan, config, scheduler, time_groups=time_groups))
                todo.append(i)
            except IllegalPlanError as err:
                out[i] = Measurement(plan.key, "illegal", error=str(err), rule=err.rule)
        if self.build_only or len(todo) < (1 if extra else 2):
            for i in todo:
                out[i] = self.measure(plans[i], config, time_groups, scheduler=scheduler)
            return [m for m in out if m is not None], {}
        request = {**requests[0], "op": "together", "plans": [r["groups"] for r in requests], **extra}
        del request["groups"]
        result = self._exchange(request, config.timeout_s * len(todo))
        if result.get("status") != "ok":  # the worker died or hung on one of them
            for i in todo:
                out[i] = self.measure(plans[i], config, time_groups, scheduler=scheduler)
            return [m for m in out if m is not None], {}
        wall = (time.perf_counter() - start) / len(todo)  # each plan's share
        for i, res in zip(todo, result["results"]):
            out[i] = self._measurement(plans[i], dict(res), wall)
        return [m for m in out if m is not None], result

    def export(self, plan: FusionPlan, library: str, scheduler: str | None = None) -> dict[str, Any]:
        """Build `plan` and export its library to `library` (in the worker) for another machine to
        measure; returns the worker's result (status 'built' or the failure, kernel hashes,
        GPU resources, each kernel's buffer shapes)."""
        try:
            request = self._plan_request(plan, self.config, scheduler, export_to=library)
        except IllegalPlanError as err:
            return {"status": "illegal", "error": str(err), "rule": err.rule}
        return self._exchange(request, self.config.timeout_s)

    def _plan_request(
        self, plan: FusionPlan, config: MeasureConfig, scheduler: str | None, **extra: Any
    ) -> dict[str, Any]:
        """The worker request for `plan`; raises IllegalPlanError when the plan breaks the
        measurer's limits (checked here, so nothing is built for it)."""
        validate(self.workload.graph, plan, self.limits)
        return {
            "groups": [list(g) for g in plan.groups],
            "target": self.target,
            "config": asdict(config),
            "scheduler": scheduler or self.scheduler,
            "database": self.database,
            "resource_limits": asdict(self.resource_limits),
            **extra,
        }

    def write_reference(self, out_dir: str) -> dict[str, Any]:
        """Save the workload's inputs and its unfused CPU outputs as .npy files in `out_dir`."""
        return self._exchange({"op": "reference", "out_dir": out_dir}, self.config.timeout_s)

    def reference_outputs(self) -> tuple[list[Any], list[Any]]:
        """(the worker's inputs, the unfused model's CPU outputs on them) as numpy arrays."""
        import numpy as np

        with tempfile.TemporaryDirectory() as tmp:
            ref = self.write_reference(tmp)
            if ref.get("status") != "ok":
                raise RuntimeError(f"the reference run failed: {ref.get('error')}")
            return ([np.load(os.path.join(tmp, i["file"])) for i in ref["inputs"]],
                    [np.load(os.path.join(tmp, f)) for f in ref["expected"]])

    def tune_kernels(self, plan: FusionPlan, trials: int, seed: int = 0, timeout_s: float = 3600.0) -> dict[str, Any]:
        """MetaSchedule-tune the plan's kernels into `self.database` (in the worker process)."""
        if not self.database:
            return {"status": "build_error", "error": "no MetaSchedule database directory set"}
        request = {"op": "tune_kernels", "groups": [list(g) for g in plan.groups], "target": self.target,
                   "database": self.database, "trials": trials, "seed": seed}
        return self._exchange(request, timeout_s)

    def _exchange(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        worker = self._ensure_worker()
        if worker is None:
            return {"status": "runtime_error", "error": "measurement worker failed to start"}
        worker.conn.send(request)
        deadline = time.monotonic() + timeout_s
        stage = "build"
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not worker.conn.poll(left):
                self._kill()
                return {"status": "timeout", "error": f"no result after {timeout_s:g}s ({stage})", "stage": stage}
            try:
                kind, payload = worker.conn.recv()
            except (EOFError, OSError):
                code = worker.process.wait(5)
                self._kill()
                status = "build_error" if stage == "build" else "runtime_error"
                return {"status": status, "error": f"worker process died during {stage} (exit code {code})",
                        "stage": stage}
            if kind == "stage":
                stage = payload
            elif kind == "result":
                return dict(payload)

    def _ensure_worker(self) -> _Worker | None:
        if self._worker is not None and self._worker.process.poll() is None:
            return self._worker
        self._kill()
        if self._work_dir is None:
            self._work_dir = tempfile.mkdtemp(prefix="autofuse-")
            self.workload.save(self._work_dir)
        # a fresh interpreter (not fork, not multiprocessing's spawn, which re-imports the
        # caller's __main__), talking over a socket pair that TVM's own prints cannot corrupt
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["TVM_NUM_THREADS"] = str(self.threads or cpu_threads())
        env[PARENT_ENV] = str(os.getpid())  # the worker dies with this process (worker.die_with_parent)
        inputs = json.dumps([asdict(s) for s in self.workload.inputs])
        proc = subprocess.Popen(
            [sys.executable, "-m", "autofuse.worker", str(theirs.fileno()), self._work_dir, inputs],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # TVM and MetaSchedule print progress there
            # its own process group: MetaSchedule's builder/runner pools are the worker's
            # children and would outlive it (400 MB each) if only the worker were killed
            start_new_session=True,
        )
        theirs.close()
        parent = Connection(ours.detach())
        try:
            ready = parent.poll(WORKER_START_S) and parent.recv()[0] == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            proc.kill()
            parent.close()
            return None
        self._worker = _Worker(proc, parent)
        return self._worker

    def _kill(self) -> None:
        """Kill the worker and everything it started (its process group)."""
        if self._worker is not None:
            try:
                os.killpg(self._worker.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._worker.process.kill()
            self._worker.process.wait(5)
            self._worker.conn.close()
            self._worker = None

    def restart(self) -> None:
        """Stop the worker; the next measurement starts a fresh one. Where a process happens to
        place a plan's buffers is part of its latency: TVM's plan for transformer_block ran 55 us
        in one worker and 38-40 us in others, steady within each. Rounds that decide between
        plans therefore run in different processes (decision.measure_rounds)."""
        if self._worker is not None and self._worker.process.poll() is None:
            try:
                self._worker.conn.send(None)
                self._worker.process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def close(self) -> None:
        self.restart()
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    def __enter__(self) -> IsolatedMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
