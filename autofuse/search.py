"""The tuner: Optuna proposes fusion plans, the cost model screens them, the measurer decides.

Each study searches one fixed space, named by (model key, target, search-space file, scheduler):
one boolean parameter per fusion decision, named by the decision's stable id. Studies are
seeded with `unfused`, `tvm_default` and the best logged plans; plans composed from the kernel
times measured so far (SearchSpace.compose) and probes that time new merges of the leading
plan's kernels (SearchSpace.probe) are queued as they become known. Per round, the sampler proposes
a batch; plans already measured are answered from the cache; once trained, the XGBoost model
ranks the rest and only the most promising are measured, the others are told PRUNED (with the
prediction as their only intermediate value). Every measurement becomes a log record.

The finalists are re-measured with more repeats next to `tvm_default`, which is replaced only
when the winner is faster by more than the measured noise and the configured minimum gain.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Protocol

import numpy as np
import optuna

from autofuse import tuning_log
from autofuse.build import MeasureConfig
from autofuse.build import cpu_threads
from autofuse.cost_model import XGBCostModel
from autofuse.cost_model import kendall_tau
from autofuse.decision import Rounds
from autofuse.decision import decide_over_default
from autofuse.decision import measure_rounds
from autofuse.features import group_features
from autofuse.features import group_rows
from autofuse.measure import Measurement
from autofuse.metrics import plan_metrics
from autofuse.plan import FusionLimits
from autofuse.plan import FusionPlan
from autofuse.space import SearchSpace
from autofuse.tuning_log import TRIAL_ROLES
from autofuse.tuning_log import TuningLog
from autofuse.tuning_log import TuningRecord
from autofuse.tuning_log import device_fingerprint
from autofuse.worker import tolerance
from autofuse.workload import Workload

STRATEGIES = ("rules", "search", "model")


class Measurer(Protocol):
    def measure(
        self,
        plan: FusionPlan,
        config: MeasureConfig | None = None,
        time_groups: bool = False,
        known_kernels: Any = (),
        scheduler: str | None = None,
    ) -> Measurement: ...


@dataclass(frozen=True)
class TuneConfig:
    """Budgets and knobs of one tuning run (all explicit; nothing is read from the environment).

    `trials` counts measured plans in the study (seeds included, resumed runs included);
    `patience` stops after that many measured trials without a new best (0: never).
    """

    strategy: str = "search"
    trials: int = 24
    time_budget_s: float | None = None
    patience: int = 0
    seed: int = 0
    screen_batch: int = 8
    measure_per_batch: int = 2
    min_train_samples: int = 8
    model_candidates: int = 256
    model_measure: int = 4
    finalists: int = 3
    final_repeat: int = 15
    final_rounds: int = 5  # paired rounds of the finalists against tvm_default (decision.py)
    confirm_rounds: int = 5  # more rounds of a winner against tvm_default before it replaces it
    kernel_trials: int = 0  # MetaSchedule trials per kernel for the finalists (0: off)
    kernel_plans: int = 2  # finalists (besides tvm_default) whose kernels get tuned
    min_gain: float = 0.02
    time_groups: bool = True
    finalize: bool = True


@dataclass
class TuneResult:
    strategy: str
    best: FusionPlan
    best_measurement: Measurement
    tvm_default: Measurement | None
    unfused: Measurement | None
    replaced_default: bool
    reason: str
    measured: int
    screened: int
    cached: int
    wall_s: float
    kendall_tau: float | None
    study: str | None
    summary: dict[str, Any] = field(default_factory=dict)


def open_study(storage: str | None, log_dir: Path, name: str, seed: int) -> optuna.Study:
    """An Optuna study in `storage`: a journal file in the log dir by default (resumable), or an
    RDB URL (sqlite:///..., postgresql://...) that several workers can share."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage is None or storage.startswith("journal:") or storage.endswith(".log"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = Path(storage.removeprefix("journal:")) if storage else log_dir / "optuna_journal.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        backend: Any = JournalStorage(JournalFileBackend(str(path)))
    else:
        backend = optuna.storages.RDBStorage(storage)
    sampler = optuna.samplers.TPESampler(
        multivariate=True, seed=seed, constant_liar=True, n_startup_trials=8
    )
    return optuna.create_study(
        study_name=name, storage=backend, sampler=sampler, direction="minimize", load_if_exists=True
    )


class Tuner:
    """One tuning job: a workload on a target, logged to `log`.

    Args:
        scheduler: label of how kernels were scheduled; latencies under different schedulers are
            never mixed (in the cache, the cost model or the study).
        storage: Optuna storage URL (None: journal file in the log directory).
        progress: called with a dict after every measurement.
    """

    def __init__(
        self,
        workload: Workload,
        target: str,
        measurer: Measurer,
        log: TuningLog,
        config: TuneConfig,
        limits: FusionLimits | None = None,
        space_name: str = "default",
        scheduler: str = "none",
        storage: str | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if config.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {config.strategy!r}; choose from {STRATEGIES}")
        self.w, self.target, self.measurer, self.log, self.cfg = workload, target, measurer, log, config
        self.space = SearchSpace(workload.graph, limits or FusionLimits())
        self.space_name, self.scheduler, self.storage = space_name, scheduler, storage
        self.progress = progress or (lambda event: None)
        self.target_kind = target.split(":")[0]
        # CPU threads the plans are measured on, logged with each: the plan that wins depends on
        # it (norm_chain's: faster than TVM's on two threads, slower on one)
        self.threads = None if "cuda" in target else (getattr(measurer, "threads", 0) or cpu_threads())
        self.model = XGBCostModel(min_samples=config.min_train_samples, seed=config.seed)
        self.measured: dict[str, Measurement] = {}
        self.kernel_s: dict[str, float] = {}  # kernel hash -> latency, this target/scheduler
        self.group_kernel: dict[tuple[int, ...], str] = {}  # this workload's groups -> kernel
        self.anchor_s: dict[str, float] = {}  # model key -> TVM's plan's latency in its first paired record
        self.predictions: list[tuple[float, float]] = []  # (predicted, measured) before measuring
        self.overhead_pairs: list[tuple[float, float, int]] = []
        self.counts = {"measured": 0, "screened": 0, "cached": 0}
        self.best_s: float | None = None
        self.rank_agreement: float | None = None
        self.started = time.perf_counter()
        self._follower = TuningLog(log.dir)  # its own read position: sees every record once
        self._load_history()
        self.seeds = self._seed_plans()  # unfused, tvm_default, logged best, plus_kinds: fixed per run
        self.composed: dict[str, FusionPlan] = {}  # plans SearchSpace.compose made from kernel times
        self.probes: dict[str, FusionPlan] = {}  # plans SearchSpace.probe made to time new kernels
        self._probed: set[str] = set()  # the leading plans a probe was made from
        # plans queued in the study by key (_enqueue); the seeds also when a resumed study holds them
        self.queued: dict[str, FusionPlan] = {p.key: p for p in self.seeds}
        self._composed_from: tuple[int, float] | None = None  # what the last composition knew

    # --- history ------------------------------------------------------------------------------

    def _comparable(self, rec: TuningRecord) -> bool:
        return (rec.target == self.target and rec.scheduler == self.scheduler
                and rec.versions.get("kernels") == str(tuning_log.KERNELS_VERSION))

    def _load_history(self) -> None:
        for rec in self._follower.follow():
            if self._comparable(rec):
                self._learn(rec)

    def _learn(self, rec: TuningRecord) -> None:
        m = Measurement.from_dict(rec.measurement)
        if m.default_s:
            self.anchor_s.setdefault(rec.model_key, m.default_s)
        # kernel times as measured, not scaled by how slowly TVM's plan ran beside the trial: the
        # kernels are timed alone after the plan, and that plan's slowness (a spell, or where
        # its worker placed its buffers) does not carry over. The same kernels in two runs of
        # four models (Swin, BERT, EfficientNet, DeBERTa-v2), in trials whose TVM's plan read
        # over 1.2x apart: raw times 11% apart (std of log ratios), scaled 16%. Scaled, DeBERTa's
        # composed plan split four matmuls from their bias adds (its unfused seed's TVM plan
        # read 371 us, the next trials' 202) and ran 1-2% slower than TVM's plan.
        self.kernel_s.update(rec.measurement.get("kernel_latencies_s") or {})
        for g in rec.groups:
            kernel = g.get("kernel")
            if kernel and kernel in self.kernel_s and g.get("features"):
                self.model.add(kernel, g["features"], self.kernel_s[kernel])
            if kernel and rec.model_key == self.w.key:
                self.group_kernel[tuple(g["nodes"])] = kernel
        if rec.model_key == self.w.key and rec.role != "best":
            known = self.measured.get(rec.plan_key)
            # a timed result (e.g. ingested from a remote device) replaces a build-only one
            if m.status != "illegal" and (known is None or (m.ok and not known.ok)):
                self.measured[rec.plan_key] = m
            self._note_overhead(rec.groups, m)

    def _note_overhead(self, groups: list[dict[str, Any]], m: Measurement) -> None:
        times = [self.kernel_s.get(g.get("kernel", "")) for g in groups]
        value = self.value(m)
        if value and groups and all(t is not None for t in times):
            self.overhead_pairs.append((value, float(sum(times)), len(groups)))  # type: ignore[arg-type]

    def value(self, m: Measurement) -> float | None:
        """A plan's latency as the search compares plans measured minutes apart: with TVM's plan
        timed beside it (IsolatedMeasurer.pair_with_default), their paired ratio times TVM's
        plan's latency in the workload's first paired record (the anchor); else its own median.
        This host's speed drifts by 1.6x in spells of tens of seconds (BERT's seeds and composed
        plans read 190 us and 300 us alike), which ranked trials by the spell they fell in."""
        return m.at_default_s(self.anchor_s.get(self.w.key))

    # --- measuring and logging ----------------------------------------------------------------

    def _features(self, plan: FusionPlan) -> list[list[float]]:
        return [group_features(self.w.graph, g, self.target_kind) for g in plan.groups]

    def predict(self, plan: FusionPlan) -> float | None:
        if not self.model.ready:
            return None
        known = [self._known_group_s(g) for g in plan.groups]
        return self.model.plan_cost(self._features(plan), known)

    def _known_group_s(self, group: tuple[int, ...]) -> float | None:
        kernel = self.group_kernel.get(group)
        return self.kernel_s.get(kernel) if kernel else None

    def measure(
        self,
        plan: FusionPlan,
        role: str,
        trial: int | None = None,
        config: MeasureConfig | None = None,
        scheduler: str | None = None,
    ) -> Measurement:
        """Measure and log one plan (under `scheduler`, by default the tuner's own)."""
        scheduler = scheduler or self.scheduler
        own = scheduler == self.scheduler
        predicted = self.predict(plan) if own else None
        if own:
            m = self.measurer.measure(
                plan, config=config, time_groups=self.cfg.time_groups, known_kernels=set(self.kernel_s)
            )
        else:
            m = self.measurer.measure(plan, config=config, scheduler=scheduler)
        return self._note(plan, m, role, trial, predicted, config, scheduler)

    def measure_many(
        self, plans: list[FusionPlan], role: str, config: MeasureConfig, scheduler: str | None = None
    ) -> list[Measurement]:
        """Measure and log several plans timed in turns (the measurer's measure_together), or one
        after the other where the measurer cannot."""
        together = getattr(self.measurer, "measure_together", None)
        if together is None:
            return [self.measure(p, role, config=config, scheduler=scheduler) for p in plans]
        scheduler = scheduler or self.scheduler
        ms = together(plans, config=config, scheduler=scheduler)
        return [self._note(p, m, role, None, None, config, scheduler) for p, m in zip(plans, ms)]

    def _note(
        self,
        plan: FusionPlan,
        m: Measurement,
        role: str,
        trial: int | None,
        predicted: float | None,
        config: MeasureConfig | None,
        scheduler: str,
    ) -> Measurement:
        """Log a measurement and learn from it."""
        own = scheduler == self.scheduler
        self.counts["measured"] += 1
        rec = self._record(plan, m, role, trial, predicted, config, scheduler)
        self.log.append(rec)
        self._load_history()  # learns our record, and any other worker's appended meanwhile
        if role in TRIAL_ROLES:
            self.measured[plan.key] = m
        value = self.value(m)
        if m.ok and predicted is not None and role == "search":
            self.predictions.append((predicted, value or 0.0))
        if own and m.ok and (self.best_s is None or (value or 0) < self.best_s):
            self.best_s = value
        self.model.fit()
        self.model.fit_overhead(self.overhead_pairs)
        self.progress({"event": "measured", "plan": plan, "measurement": m, "best_s": self.best_s, "role": role})
        return m

    def _record(
        self,
        plan: FusionPlan,
        m: Measurement,
        role: str,
        trial: int | None,
        predicted: float | None,
        config: MeasureConfig | None,
        scheduler: str | None = None,
    ) -> TuningRecord:
        groups = group_rows(self.w.graph, plan.groups, m.kernels, self.target_kind, m.resources)
        return TuningRecord(
            model_key=self.w.key,
            model_name=self.w.name,
            target=self.target,
            scheduler=scheduler or self.scheduler,
            plan=plan.to_dict(),
            measurement=m.to_dict(),
            metrics=plan_metrics(self.w.graph, plan).to_dict(),
            groups=groups,
            predicted_s=predicted,
            protocol={
                **asdict(config or getattr(self.measurer, "config", MeasureConfig())),
                "reference": "unfused plan, same target, same random inputs",
                "tolerances": {dt: list(tolerance(dt)) for dt in sorted({n.dtype for n in self.w.graph.nodes})},
                **({"threads": self.threads} if self.threads else {}),
            },
            role=role,
            trial=trial,
            study=self.study_name if self.cfg.strategy == "search" else None,
            device=device_fingerprint(self.target),
            space=self.space_name,
        )

    # --- budgets ------------------------------------------------------------------------------

    def _out_of_time(self) -> bool:
        budget = self.cfg.time_budget_s
        return budget is not None and time.perf_counter() - self.started > budget

    @property
    def study_name(self) -> str:
        # "tied": parameters per class of repeated decisions (SearchSpace.tied), not per decision
        return f"{self.w.key}-{self.target}-{self.space_name}-{self.scheduler}-k{tuning_log.KERNELS_VERSION}-tied"

    # --- strategies ---------------------------------------------------------------------------

    def _seed_plans(self) -> list[FusionPlan]:
        plans = [self.w.unfused(), self.w.tvm_default()]
        best = self.log.best(self.w.key, self.target, self.scheduler)
        if best is not None:
            plans.append(FusionPlan.from_dict(best.plan))
        # TVM's plan with each kind of fusion it never makes: the search starts from them
        plans += self.space.plus_kinds(self.w.tvm_default())
        return list({p.key: p for p in plans}.values())

    def run(self) -> TuneResult:
        strategy = self.cfg.strategy
        if strategy == "rules":
            plan = self.w.tvm_default()
            m = self._cached_or_measure(plan, "seed")
            return self._result(plan, m, self.w.tvm_default(), "TVM's rule-based plan", None)
        if strategy == "model":
            self._run_model()
        else:
            self._run_search()
        return self.finalize() if self.cfg.finalize else self._partial_result()

    def _cached_or_measure(self, plan: FusionPlan, role: str, trial: int | None = None) -> Measurement:
        if plan.key in self.measured:
            self.counts["cached"] += 1
            return self.measured[plan.key]
        return self.measure(plan, role, trial)

    def _study_measured(self, study: optuna.Study) -> int:
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
        return len(study.get_trials(deepcopy=False, states=states))

    @staticmethod
    def _waiting(study: optuna.Study) -> int:
        """Trials queued in the study (seeds, composed plans, probes) that no worker has asked yet."""
        return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))

    def _run_search(self) -> None:
        study = open_study(self.storage, self.log.dir, self.study_name, self.cfg.seed)
        self._fail_orphans(study)
        if not study.trials:
            for plan in self.seeds:
                self._enqueue(study, plan)
        since_best, best_before = 0, self.best_s
        while self._study_measured(study) < self.cfg.trials and not self._out_of_time():
            measured_before = self.counts["measured"]
            self._enqueue_composed(study)
            self._enqueue_probe(study)
            self._round(study)
            if self.best_s is not None and (best_before is None or self.best_s < best_before):
                since_best, best_before = 0, self.best_s
            else:
                since_best += self.counts["measured"] - measured_before
            if self.cfg.patience and since_best >= self.cfg.patience:
                break
        self._release_unasked(study)

    def _enqueue_composed(self, study: optuna.Study) -> None:
        """Once the seeds are measured, and whenever new kernel times change it: TVM's plan with
        the merges that paid kernel by kernel (SearchSpace.compose), with no per-kernel overhead
        credited and with the cost model's. Two candidates because that overhead, fitted from
        whole plans, also holds what the kernels cost each other in cache, and over- or
        underestimates what one fewer kernel saves; the measurement decides."""
        if any(p.key not in self.measured for p in self.seeds):
            return
        known = {g: self.kernel_s[k] for g, k in self.group_kernel.items() if k in self.kernel_s}
        if self._composed_from == (len(known), self.model.overhead_s):  # nothing new to compose from
            return
        self._composed_from = (len(known), self.model.overhead_s)
        for overhead in sorted({0.0, self.model.overhead_s}):
            plan = self.space.compose(self.w.tvm_default(), known, overhead)
            if plan.key not in self.measured and plan.key not in self.composed:  # TVM's plan is measured
                self.composed[plan.key] = plan
                self._enqueue(study, plan)

    def _enqueue_probe(self, study: optuna.Study) -> None:
        """Once the seeds and composed plans are measured, and whenever another plan leads: the
        leader with every untimed merge of two of its groups that fits (SearchSpace.probe),
        ordered by the cost model's predicted saving. Its measurement times those kernels, and
        the next composition takes the merges that paid: a climb from the leader, one kernel
        merge at a time, each trial timing many. One probe per leader; when its merges did not
        pay, the sampler's picks follow. Swin, 12 trials: the sampler's first picks ran
        167-255 us where TVM's plan ran 164 and the composed ones 140-145."""
        if not self.composed or self._waiting(study):
            return
        best = self._fastest(1)
        if not best or best[0] in self._probed:
            return
        self._probed.add(best[0])
        leader = next((p for p in self._known_plans() if p.key == best[0]), None)  # once per leader
        if leader is None:
            return
        timed = {g for g, k in self.group_kernel.items() if k in self.kernel_s}
        plan = self.space.probe(leader, timed, self._merge_gains if self.model.ready else None)
        if plan is not None and plan.key not in self.measured and plan.key not in self.queued:
            self.probes[plan.key] = plan
            self._enqueue(study, plan)

    def _merge_gains(self, merges: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]) -> list[float]:
        """The cost model's predicted saving of each (part, part, union) merge: the parts'
        measured times, plus the per-kernel overhead, less the union's predicted time."""
        predicted = self.model.predict_groups([group_features(self.w.graph, u, self.target_kind) for _, _, u in merges])
        return [(self._known_group_s(a) or 0.0) + (self._known_group_s(b) or 0.0) + self.model.overhead_s - float(t)
                for (a, b, _), t in zip(merges, predicted)]

    def _enqueue(self, study: optuna.Study, plan: FusionPlan) -> None:
        """Queue `plan` as the study's next trial: with the tied parameters nearest to it, for
        the sampler to learn from, and its key, so that `_ask` measures the plan itself (it may
        treat repeated blocks differently, as TVM's plan and composed ones can)."""
        self.queued[plan.key] = plan
        study.enqueue_trial(self.space.tie(self.space.encode(plan)), user_attrs={"plan_key": plan.key})

    def _release_unasked(self, study: optuna.Study) -> None:
        """Queued trials still waiting when the run stops (the budget ran out after two composed
        plans were queued, or another worker took the last trials) are taken, as `study.ask`
        takes them (another worker may be asking), and pruned: a resumed run would ask them
        without their plan, which only the queuing process holds, and measure the nearest tied
        parameters instead. A resumed run composes and queues those plans again."""
        waiting, running = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
        for t in study.get_trials(deepcopy=False, states=(waiting,)):
            if study._storage.set_trial_state_values(t._trial_id, running):  # False: another took it
                study._storage.set_trial_user_attr(t._trial_id, "owner", _owner())
                study._storage.set_trial_user_attr(t._trial_id, "released", "the run stopped before it was asked")
                study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.PRUNED)

    def _fail_orphans(self, study: optuna.Study) -> None:
        # trials left RUNNING by a killed process on this host would never finish
        host = socket.gethostname()
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            owner = t.user_attrs.get("owner", "")
            if owner.startswith(host + ":") and not _pid_alive(int(owner.split(":")[1])):
                study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)

    def _ask(self, study: optuna.Study) -> tuple[optuna.Trial, FusionPlan]:
        trial = study.ask()
        trial.set_user_attr("owner", _owner())
        params = {t: trial.suggest_categorical(t, [False, True]) for t in self.space.tied}
        queued = self.queued.get(trial.user_attrs.get("plan_key", ""))  # a seed or composed plan
        plan = queued or self.space.decode(self.space.untie(params))
        trial.set_user_attr("plan_key", plan.key)
        return trial, plan

    def _tell(self, study: optuna.Study, trial: optuna.Trial, m: Measurement) -> None:
        if m.ok:
            study.tell(trial, self.value(m))
        else:
            trial.set_user_attr("failure", f"{m.status}: {m.error}")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _tell_cached(self, study: optuna.Study, trial: optuna.Trial, plan: FusionPlan) -> None:
        self.counts["cached"] += 1
        trial.set_user_attr("cached", True)
        self._tell(study, trial, self.measured[plan.key])

    def _round(self, study: optuna.Study) -> None:
        self._load_history()  # plans other workers measured meanwhile are cache hits
        room = self.cfg.trials - self._study_measured(study)
        # seeds, composed plans and probes still queued are asked alone: a batch that also asked the
        # sampler spent two trials on its first, near-random picks (133 parameters before any
        # model) ahead of the composed plan (Swin, 8 trials: 217 and 199 us measured, the
        # composed plan, 140 us against TVM's 164, never)
        queued = self._waiting(study)
        batch = self.cfg.screen_batch if self.model.ready else 1
        asked = [self._ask(study) for _ in range(max(1, min(queued, room) if queued else min(batch, room * 4)))]
        fresh: list[tuple[optuna.Trial, FusionPlan]] = []
        for trial, plan in asked:
            if plan.key in self.measured:
                self._tell_cached(study, trial, plan)
            else:
                fresh.append((trial, plan))
        if not fresh:
            return
        seed_keys = {p.key for p in self.seeds}
        first = seed_keys | set(self.composed) | set(self.probes)  # measured as they come, never screened
        enqueued = [tp for tp in fresh if tp[1].key in first]
        rest = [tp for tp in fresh if tp[1].key not in first]
        if self.model.ready and len(rest) > self.cfg.measure_per_batch:
            scored = sorted(rest, key=lambda tp: self.predict(tp[1]) or 0.0)
            chosen, screened = scored[: self.cfg.measure_per_batch], scored[self.cfg.measure_per_batch :]
        else:
            chosen, screened = rest, []
        for trial, plan in enqueued + chosen:
            if plan.key in self.measured:  # the same plan twice in one batch
                self._tell_cached(study, trial, plan)
                continue
            role = ("seed" if plan.key in seed_keys else "composed" if plan.key in self.composed
                    else "probe" if plan.key in self.probes else "search")
            self._tell(study, trial, self.measure(plan, role, trial.number))
        for trial, plan in screened:
            self.counts["screened"] += 1
            trial.report(self.predict(plan) or 0.0, step=0)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    def _run_model(self) -> None:
        for plan in self.seeds[:2]:
            self._cached_or_measure(plan, "seed")
        if not self.model.fit():
            self.model.min_samples = 1  # learn from whatever the seeds gave
            self.model.fit()
        rng = np.random.default_rng(self.cfg.seed)
        base = self.space.encode(self.w.tvm_default())
        candidates: dict[str, FusionPlan] = {}
        for i in range(self.cfg.model_candidates):
            params = self.space.random_params(rng.random, rng.uniform(0.2, 1.0))
            if i % 2:  # half of them start from TVM's own plan
                params = {k: v or base[k] for k, v in params.items()}
            plan = self.space.decode(params)
            candidates.setdefault(plan.key, plan)
        ranked = sorted(candidates.values(), key=lambda p: self.predict(p) or 0.0)
        for plan in ranked[: self.cfg.model_measure]:
            if self._out_of_time():
                break
            self._cached_or_measure(plan, "model")

    # --- final decision -----------------------------------------------------------------------

    def finalize(self) -> TuneResult:
        """Re-measure the finalists next to tvm_default; keep tvm_default unless clearly beaten.

        With `kernel_trials`, the best plans and tvm_default then get MetaSchedule-tuned kernels
        and the decision is made again, on tuned kernels for all of them.
        """
        default = self.w.tvm_default()
        plans = {p.key: p for p in self._known_plans()}
        finalists = [plans[k] for k in self._fastest(self.cfg.finalists) if k in plans]
        if default.key not in [p.key for p in finalists]:
            finalists.append(default)
        final = self._measure_rounds(finalists, self.scheduler)
        good = final.good
        if not good:
            dm = self.measured.get(default.key) or Measurement(default.key, "runtime_error", error="no finalist ran")
            return self._result(default, dm, default, "no finalist measured correctly", None)
        if self.cfg.kernel_trials > 0 and hasattr(self.measurer, "tune_kernels"):
            return self._finalize_tuned(finalists, good, default, plans)
        winner, reason, final = self._decide(final, default, plans, self.scheduler)
        good = final.good
        self.log.append(self._record(winner, good[winner.key], "best", None, None, final.config))
        return self._result(winner, good[winner.key], default, reason, good.get(default.key),
                            final.speedup(default.key, winner.key))

    def _fastest(self, n: int) -> list[str]:
        ok = [(k, self.value(m)) for k, m in self.measured.items() if m.ok and m.median_s]
        return [k for k, _ in sorted(ok, key=lambda km: km[1] or 0.0)[:n]]

    def _decide(self, rounds: Rounds, default: FusionPlan, plans: dict[str, FusionPlan],
                scheduler: str) -> tuple[FusionPlan, str, Rounds]:
        """The decision over the finalists' rounds (decision.decide_over_default). A plan that
        would replace TVM's is first measured against it in `confirm_rounds` more rounds, and
        the decision made again on all of them: a plan fast in most processes and far slower in
        some can have every one of five rounds where it runs well (MobileNetV2's finalist:
        162-168 us in its five, TVM's plan 170-172; in `autofuse bench` right after, 164-171 us in
        four processes of six and 228-241 in two, TVM's plan 170-183 in all)."""

        def decide(rounds: Rounds) -> tuple[str, str]:
            medians = {k: m.median_s for k, m in rounds.good.items() if m.median_s}
            return decide_over_default(medians, rounds.noise, default.key, self.cfg.min_gain, rounds.per_round)

        key, reason = decide(rounds)
        if key != default.key and key in plans and default.key in rounds.good and self.cfg.confirm_rounds > 0:
            more = rounds.joined(self._measure_rounds([plans[key], default], scheduler, self.cfg.confirm_rounds))
            if key in more.good and default.key in more.good:
                key, reason, rounds = *decide(more), more
            else:
                key, reason = default.key, f"{reason}, but it failed in a confirming round: kept tvm_default"
        if rounds.slow_rounds:
            reason += f"; {rounds.slow_rounds} of {rounds.ran} rounds ran in a slow spell of the host, left out"
        return plans.get(key, default), reason, rounds

    def _finalize_tuned(
        self,
        finalists: list[FusionPlan],
        cheap: dict[str, Measurement],
        default: FusionPlan,
        plans: dict[str, FusionPlan],
    ) -> TuneResult:
        """MetaSchedule stage: tune the finalists' kernels (database shared by all plans, runs and
        models), measure every finalist with tuned kernels and decide again."""
        tuned = [p for p in finalists if p.key in cheap][: self.cfg.kernel_plans]
        if default not in tuned:
            tuned.append(default)
        for plan in tuned:
            if self._out_of_time():
                break
            self.progress({"event": "tuning_kernels", "plan": plan})
            result = self.measurer.tune_kernels(plan, self.cfg.kernel_trials, self.cfg.seed)  # type: ignore[attr-defined]
            self.progress({"event": "kernels_tuned", "plan": plan, "result": result})
        final = self._measure_rounds(tuned, "metaschedule")
        good = final.good
        if not good:
            dm = cheap.get(default.key) or Measurement(default.key, "runtime_error", error="no finalist ran")
            return self._result(default, dm, default, "no plan ran with tuned kernels", None)
        winner, reason, decided = self._decide(final, default, plans, "metaschedule")
        chosen = decided.good
        self.log.append(self._record(winner, chosen[winner.key], "best", None, None, decided.config, "metaschedule"))
        both = [k for k in good if k in cheap]
        self.rank_agreement = kendall_tau([cheap[k].median_s or 0.0 for k in both], [good[k].median_s or 0.0 for k in both])
        res = self._result(winner, chosen[winner.key], default, f"{reason}, MetaSchedule-tuned kernels",
                           chosen.get(default.key), decided.speedup(default.key, winner.key))
        res.summary["scheduler"] = "metaschedule"
        res.summary["cheap_vs_tuned_tau"] = self.rank_agreement
        res.summary["cheap_schedule_latency_s"] = {k: cheap[k].median_s for k in both}
        res.summary["tuned_latency_s"] = {k: good[k].median_s for k in both}
        return res

    def _measure_rounds(self, plans: list[FusionPlan], scheduler: str, rounds: int | None = None) -> Rounds:
        """The finalists in rounds (`final_rounds` unless given), timed in turns
        (decision.measure_rounds), each measurement logged."""
        rounds = max(1, rounds or self.cfg.final_rounds)
        base = getattr(self.measurer, "config", MeasureConfig())
        cfg = replace(base, repeat=max(3, self.cfg.final_repeat // rounds))
        return measure_rounds(lambda ps, c: self.measure_many(ps, "finalist", c, scheduler), plans, rounds, cfg,
                              between=getattr(self.measurer, "restart", None), reference=self.w.tvm_default().key)

    def _known_plans(self) -> list[FusionPlan]:
        plans = {p.key: p for p in self.seeds}
        for rec in self.log.records(self.w.key, self.target):
            plans.setdefault(rec.plan_key, FusionPlan.from_dict(rec.plan))
        return list(plans.values())

    def _partial_result(self) -> TuneResult:
        ok = [(k, m) for k, m in self.measured.items() if m.ok and m.median_s]
        plans = {p.key: p for p in self._known_plans()}
        default = self.w.tvm_default()
        if not ok:
            m = self.measured.get(default.key) or Measurement(default.key, "runtime_error", error="nothing measured")
            return self._result(default, m, default, "search only, nothing measured", None)
        key, m = min(ok, key=lambda km: self.value(km[1]) or 0.0)
        return self._result(plans.get(key, default), m, default, "search only (no final decision)", self.measured.get(default.key))

    def _result(
        self,
        best: FusionPlan,
        m: Measurement,
        default: FusionPlan,
        reason: str,
        dm: Measurement | None,
        paired: float | None = None,
    ) -> TuneResult:
        """The run's result; `paired` is the winner's speedup over tvm_default paired over their
        samples timed in turns (decision.Rounds.speedup), which replaces the ratio of medians."""
        unfused = self.measured.get(self.w.unfused().key)
        tau = kendall_tau([p for p, _ in self.predictions], [q for _, q in self.predictions])
        res = TuneResult(
            strategy=self.cfg.strategy,
            best=best,
            best_measurement=m,
            tvm_default=dm or self.measured.get(default.key),
            unfused=unfused,
            replaced_default=best.key != default.key,
            reason=reason,
            measured=self.counts["measured"],
            screened=self.counts["screened"],
            cached=self.counts["cached"],
            wall_s=time.perf_counter() - self.started,
            kendall_tau=tau,
            study=self.study_name if self.cfg.strategy == "search" else None,
        )
        sum_error = sum_of_groups_error(self.model, self.overhead_pairs)
        res.summary = summarize(self.w, res, self.model, len(self.predictions), sum_error)
        if paired:
            res.summary["speedup_vs_tvm_default"] = paired
        self.model.save(self.log.dir / f"cost_model-{self.target.replace(':', '_')}-{self.scheduler}.json")
        return res


def _owner() -> str:
    """Who measures a trial: this host and process (`_fail_orphans` reads it back)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sum_of_groups_error(model: XGBCostModel, pairs: list[tuple[float, float, int]]) -> float | None:
    """Median relative error of (sum of measured kernel times + overhead) vs whole-plan latency."""
    errors = [abs(s + model.overhead_s * k - m) / m for m, s, k in pairs if m > 0]
    return float(np.median(errors)) if errors else None


def summarize(
    w: Workload, res: TuneResult, model: XGBCostModel, n_pred: int, sum_error: float | None = None
) -> dict[str, Any]:
    def lat(m: Measurement | None) -> float | None:
        return m.median_s if m is not None and m.ok else None

    best_metrics = plan_metrics(w.graph, res.best)
    default_metrics = plan_metrics(w.graph, w.tvm_default())
    out = {
        "model": w.name,
        "model_key": w.key,
        "strategy": res.strategy,
        "best_plan": res.best.key,
        "replaced_tvm_default": res.replaced_default,
        "reason": res.reason,
        "latency_s": {"best": lat(res.best_measurement), "tvm_default": lat(res.tvm_default), "unfused": lat(res.unfused)},
        "noise": {"best": res.best_measurement.spread, "tvm_default": res.tvm_default.spread if res.tvm_default else None},
        "kernels": {"best": best_metrics.kernels, "tvm_default": default_metrics.kernels, "unfused": len(w.graph)},
        "fusion_ratio": {"best": best_metrics.fusion_ratio, "tvm_default": default_metrics.fusion_ratio},
        "bytes_saved": {"best": best_metrics.bytes_saved, "tvm_default": default_metrics.bytes_saved},
        "measured": res.measured,
        "screened_by_model": res.screened,
        "cache_hits": res.cached,
        "wall_s": res.wall_s,
        "cost_model": {"kernels_learned": len(model.samples), "kendall_tau": res.kendall_tau, "tau_pairs": n_pred,
                       "overhead_s": model.overhead_s, "sum_of_groups_error": sum_error},
    }
    b, d = out["latency_s"]["best"], out["latency_s"]["tvm_default"]
    out["speedup_vs_tvm_default"] = d / b if b and d else None
    return out
