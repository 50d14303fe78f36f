import itertools

import pytest

from autofuse.search import TuneConfig
from autofuse.search import Tuner
from autofuse.space import SearchSpace
from autofuse.tuning_log import TuningLog

from fakes import DriftingMeasurer
from fakes import FakeMeasurer


def best_by_brute_force(space, fake):
    plans = {}
    for bits in itertools.product([False, True], repeat=len(space.decisions)):
        plan = space.decode(dict(zip((d.id for d in space.decisions), bits)))
        plans[plan.key] = plan
    return min(plans.values(), key=fake.latency_s), len(plans)


def test_search_finds_known_best(small, tmp_path):
    fake = FakeMeasurer(small.graph)
    best, distinct = best_by_brute_force(SearchSpace(small.graph), fake)
    assert distinct > 20 and best != small.tvm_default()
    cfg = TuneConfig(trials=30, seed=0, min_gain=0.0)
    tuner = Tuner(small, "llvm", fake, TuningLog(tmp_path), cfg)
    result = tuner.run()
    assert result.best == best
    assert result.replaced_default
    # every distinct plan was measured at most once during the search
    searched = [r.plan_key for r in TuningLog(tmp_path).records() if r.role in ("seed", "search")]
    assert len(searched) == len(set(searched)) > 10
    finals = [r for r in TuningLog(tmp_path).records() if r.role == "finalist"]
    # the finalists' rounds, and the winner's confirming rounds against TVM's plan
    assert len(finals) - 2 * cfg.confirm_rounds in (cfg.final_rounds * cfg.finalists,
                                                    cfg.final_rounds * (cfg.finalists + 1))
    assert result.summary["latency_s"]["best"] == pytest.approx(fake.latency_s(best))


def test_a_winner_is_confirmed_in_more_rounds_before_it_replaces_tvm_s_plan(small, tmp_path):
    # the search's best plan runs well in the finalists' five rounds and 3x slower in every
    # process after them: a plan fast in some processes and slow in others that five missed
    best, _ = best_by_brute_force(SearchSpace(small.graph), FakeMeasurer(small.graph))

    class SlowLater(FakeMeasurer):
        def latency_s(self, plan):  # measured once in the search, five times in the finals
            return super().latency_s(plan) * (3.0 if plan.key == best.key and self.calls.count(best.key) > 6 else 1.0)

    for confirm, replaced in ((0, True), (5, False)):
        cfg = TuneConfig(trials=30, seed=0, min_gain=0.0, confirm_rounds=confirm)
        fake = SlowLater(small.graph)
        result = Tuner(small, "llvm", fake, TuningLog(tmp_path / str(confirm)), cfg).run()
        assert result.replaced_default == replaced and fake.calls.count(best.key) == 6 + confirm
        assert result.best.key == (best if replaced else small.tvm_default()).key
    assert "faster in 5 of 10 rounds" in result.reason


def test_same_seed_same_plans(small, tmp_path):
    runs = []
    for i in range(2):
        fake = FakeMeasurer(small.graph)
        Tuner(small, "llvm", fake, TuningLog(tmp_path / str(i)), TuneConfig(trials=12, seed=3, finalize=False)).run()
        runs.append(fake.calls)
    assert runs[0] == runs[1]


def test_never_slower_than_tvm_default(small, tmp_path):
    class DefaultIsBest(FakeMeasurer):
        def latency_s(self, plan):
            return 1e-3 if plan == small.tvm_default() else 1e-3 * 1.01

    fake = DefaultIsBest(small.graph)
    result = Tuner(small, "llvm", fake, TuningLog(tmp_path), TuneConfig(trials=10, min_gain=0.02)).run()
    assert result.best == small.tvm_default() and not result.replaced_default


def test_rules_strategy(small, tmp_path):
    result = Tuner(small, "llvm", FakeMeasurer(small.graph), TuningLog(tmp_path), TuneConfig(strategy="rules")).run()
    assert result.best == small.tvm_default() and result.measured == 1


def test_model_strategy_uses_earlier_logs(transformer, tmp_path):
    fake = FakeMeasurer(transformer.graph)
    log = TuningLog(tmp_path)
    Tuner(transformer, "llvm", fake, log, TuneConfig(trials=16, seed=1)).run()
    fresh = FakeMeasurer(transformer.graph)
    result = Tuner(transformer, "llvm", fresh, log, TuneConfig(strategy="model", model_measure=3)).run()
    assert result.best_measurement.ok
    assert fake.latency_s(result.best) <= fake.latency_s(transformer.tvm_default())
    # with the cost model trained on the log, only the top few candidates were measured (and
    # the finalists, and the winner's confirming rounds against TVM's plan)
    cfg = TuneConfig()
    assert result.measured <= 3 + 2 + 1 + cfg.final_rounds * (cfg.finalists + 1) + 2 * cfg.confirm_rounds


def test_cost_model_screens_and_ranks(transformer, tmp_path):
    fake = FakeMeasurer(transformer.graph)
    cfg = TuneConfig(trials=30, seed=0, screen_batch=8, measure_per_batch=2)
    result = Tuner(transformer, "llvm", fake, TuningLog(tmp_path), cfg).run()
    assert result.screened > 0
    tau = result.kendall_tau
    assert tau is not None and tau > 0.3, tau
    assert (tmp_path / "cost_model-llvm-none.json").exists()


def test_sqlite_storage_and_resume(small, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    fake = FakeMeasurer(small.graph)
    Tuner(small, "llvm", fake, TuningLog(tmp_path), TuneConfig(trials=6, finalize=False), storage=url).run()
    first = len(fake.calls)
    fake2 = FakeMeasurer(small.graph)
    Tuner(small, "llvm", fake2, TuningLog(tmp_path), TuneConfig(trials=10, finalize=False), storage=url).run()
    import optuna

    study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 10 and first >= 6
    assert not set(fake2.calls) & set(fake.calls)  # resumed: nothing measured again


def test_log_records_protocol_and_versions(small, tmp_path):
    Tuner(small, "llvm", FakeMeasurer(small.graph), TuningLog(tmp_path), TuneConfig(trials=3)).run()
    rec = TuningLog(tmp_path).records()[0]
    assert rec.protocol["tolerances"]["float32"] == [1e-4, 1e-5]
    assert rec.versions["tvm"] and rec.device and rec.study and rec.trial == 0
    assert rec.groups and all("features" in g for g in rec.groups)


def test_metaschedule_stage_on_real_kernels(small, tmp_path):
    """The finalists' kernels are tuned with MetaSchedule and the decision is made again."""
    from autofuse.build import MeasureConfig
    from autofuse.measure import IsolatedMeasurer

    cfg = TuneConfig(trials=5, kernel_trials=2, kernel_plans=0, final_rounds=1, final_repeat=3)
    db = tmp_path / "metaschedule"
    with IsolatedMeasurer(small, config=MeasureConfig(repeat=3, min_repeat_ms=5), database=str(db)) as m:
        result = Tuner(small, "llvm", m, TuningLog(tmp_path), cfg, scheduler="rules").run()
        group = m._worker.process.pid
    assert result.summary["scheduler"] == "metaschedule"
    # MetaSchedule's builder/runner pools (children of the worker) die with it
    import os
    import time

    time.sleep(0.5)
    left = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(p) == group]
    assert not left, left
    assert (db / "database_tuning_record.json").stat().st_size > 0
    best = TuningLog(tmp_path).best(small.key, "llvm")
    assert best.role == "best" and best.scheduler == "metaschedule"
    assert set(result.summary["tuned_latency_s"]) == set(result.summary["cheap_schedule_latency_s"])


def test_cpu_candidates_build_without_importing_every_tensor_intrinsic(tmp_path):
    # MetaSchedule's builder processes import tvm.s_tir.tensor_intrin for every batch (14 s here);
    # autofuse's CPU builder does without, in a fresh process as LocalBuilder's workers are
    script = (
        "import sys, tvm\n"
        "from autofuse.build import _build_candidate\n"
        "from tvm.script import tirx as T\n"
        "@T.prim_func\n"
        "def f(a: T.Buffer((8,), 'float32'), b: T.Buffer((8,), 'float32')):\n"
        "    for i in range(8):\n"
        "        b[i] = a[i] + 1.0\n"
        "lib = _build_candidate(tvm.IRModule({'main': f}), tvm.target.Target('llvm'), None)\n"
        "a = tvm.runtime.tensor(__import__('numpy').arange(8, dtype='float32'))\n"
        "b = tvm.runtime.empty((8,), 'float32')\n"
        "lib['main'](a, b)\n"
        "assert b.numpy()[7] == 8.0, b.numpy()\n"
        "assert 'tvm.s_tir.tensor_intrin' not in sys.modules\n"
    )
    import subprocess
    import sys

    (tmp_path / "build_one.py").write_text(script)  # TVMScript reads its source from a file
    proc = subprocess.run([sys.executable, str(tmp_path / "build_one.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from autofuse.build import _candidate_builder

    import tvm

    assert _candidate_builder(tvm.target.Target("cuda")) == "local"  # CUDA lowering needs them


def _pgid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def test_latencies_of_other_kernels_are_not_reused(small, tmp_path, monkeypatch):
    # after a change to normalisation or the schedules, logged latencies describe other kernels:
    # a new run measures again (its own study), while the old plans stay in the log
    from autofuse import tuning_log

    first = FakeMeasurer(small.graph)
    Tuner(small, "llvm", first, TuningLog(tmp_path), TuneConfig(trials=6, finalize=False)).run()
    again = FakeMeasurer(small.graph)
    Tuner(small, "llvm", again, TuningLog(tmp_path), TuneConfig(trials=6, finalize=False)).run()
    assert again.calls == []  # same kernels: everything answered from the log
    before = tuning_log.KERNELS_VERSION
    monkeypatch.setattr(tuning_log, "KERNELS_VERSION", before + 1)
    upgraded = FakeMeasurer(small.graph)
    tuner = Tuner(small, "llvm", upgraded, TuningLog(tmp_path), TuneConfig(trials=6, finalize=False))
    tuner.run()
    assert len(set(upgraded.calls)) >= 6
    assert {small.unfused().key, small.tvm_default().key} <= set(upgraded.calls)  # measured again
    assert {r.versions["kernels"] for r in TuningLog(tmp_path).records()} == {str(before), str(before + 1)}


def test_search_measures_the_plan_composed_from_kernel_times(transformer, tmp_path):
    # once the seeds are measured, TVM's plan with every merge whose kernel paid is measured
    # next: here it beats every seed (each takes one kind of merge whole, good and bad alike)
    fake = FakeMeasurer(transformer.graph)
    Tuner(transformer, "llvm", fake, TuningLog(tmp_path), TuneConfig(trials=12, finalize=False)).run()
    recs = TuningLog(tmp_path).records()
    seeds = [r.measurement["median_s"] for r in recs if r.role == "seed"]
    composed = [r for r in recs if r.role == "composed"]
    assert len(seeds) >= 6 and composed
    # right after the seeds, before any of the sampler's picks
    assert recs.index(composed[0]) == len(seeds)
    assert min(r.measurement["median_s"] for r in composed) < min(seeds)
    space = SearchSpace(transformer.graph)
    before = recs[: recs.index(composed[0])]
    kernel_s = {g: fake.group_s(g) for r in before for g in map(tuple, (x["nodes"] for x in r.groups))}
    assert composed[0].plan_key == space.compose(transformer.tvm_default(), kernel_s).key
    # so a budget of one trial past the seeds is spent on it
    tight = TuningLog(tmp_path / "tight")
    Tuner(transformer, "llvm", FakeMeasurer(transformer.graph), tight,
          TuneConfig(trials=len(seeds) + 1, finalize=False)).run()
    assert [r.role for r in tight.records()] == ["seed"] * len(seeds) + ["composed"]


def test_plans_still_queued_when_the_run_stops_are_released_not_left_waiting(small, tmp_path):
    # another worker queued two plans as this one's budget ran out, and took one of them: the
    # other is pruned (a later run would ask it without its plan), the one taken is left alone
    import optuna

    from autofuse.search import open_study

    tuner = Tuner(small, "llvm", FakeMeasurer(small.graph), TuningLog(tmp_path), TuneConfig(trials=6, finalize=False))
    tuner.run()
    study = open_study(None, tmp_path, tuner.study_name, 0)
    for plan in (small.unfused(), small.tvm_default()):
        study.enqueue_trial(tuner.space.tie(tuner.space.encode(plan)), user_attrs={"plan_key": plan.key})
    taken = study.ask()
    tuner._release_unasked(study)
    states = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert states[taken.number].state == optuna.trial.TrialState.RUNNING
    released = [t for t in states.values() if t.user_attrs.get("released")]
    assert len(released) == 1 and released[0].state == optuna.trial.TrialState.PRUNED
    assert released[0].user_attrs["owner"] and not study.get_trials(states=(optuna.trial.TrialState.WAITING,))


def test_search_probes_the_leader_and_composes_from_what_the_probe_timed(transformer, tmp_path):
    # after the composed plan, the leading plan with untimed merges of two of its groups is
    # measured, and the next composition takes the probed merges that paid
    fake = FakeMeasurer(transformer.graph)
    Tuner(transformer, "llvm", fake, TuningLog(tmp_path), TuneConfig(trials=12, finalize=False)).run()
    recs = TuningLog(tmp_path).records()
    roles = [r.role for r in recs]
    at = roles.index("probe")
    assert "composed" in roles[:at] and "search" not in roles[:at]
    leader = min(recs[:at], key=lambda r: r.measurement["median_s"])
    leader_groups = [tuple(g) for g in leader.plan["groups"]]
    group_of = {n: i for i, g in enumerate(leader_groups) for n in g}
    new = [tuple(g) for g in recs[at].plan["groups"] if tuple(g) not in leader_groups]
    assert new and all(len({group_of[n] for n in g}) == 2 for g in new)
    seen_before = {tuple(g) for r in recs[:at] for g in r.plan["groups"]}
    later = next(r for r in recs[at + 1:] if r.role == "composed")
    assert {tuple(g) for g in later.plan["groups"]} & (set(new) - seen_before)
    assert later.measurement["median_s"] < leader.measurement["median_s"]


def test_search_compares_plans_through_the_host_s_slow_spells(transformer, tmp_path):
    # every second plan runs 1.6x slower, TVM's plan timed beside it alike: the tuner ranks
    # plans by their ratio to TVM's plan, and keeps the kernel times (timed alone, after the
    # spell) as they were measured
    fake = DriftingMeasurer(transformer.graph, transformer.tvm_default())
    tuner = Tuner(transformer, "llvm", fake, TuningLog(tmp_path), TuneConfig(trials=16, finalize=False))
    tuner.run()
    true_s = {k: fake.latency_s(p) for k, p in fake.plans.items()}
    assert tuner._fastest(3) == sorted(true_s, key=true_s.get)[:3]
    for group, kernel in tuner.group_kernel.items():
        assert tuner.kernel_s[kernel] == pytest.approx(fake.group_s(group))
    assert tuner.best_s == pytest.approx(min(true_s.values()))


def test_search_samples_tied_parameters_and_measures_queued_plans_as_they_are(tmp_path):
    # a six-layer MLP: the sampler gets one parameter per part of the repeated layers, and a
    # queued plan that treats the layers differently is measured itself, not its tied nearest
    import optuna

    from autofuse import models
    from autofuse.search import open_study
    from autofuse.workload import prepare

    path = tmp_path / "deep_mlp.onnx"
    import onnx

    onnx.save(models.mlp(dims=(32,) + (32,) * 6 + (8,)), path)
    w = prepare(path)
    space = SearchSpace(w.graph)
    assert len(space.tied) < len(space.decisions)
    fake = FakeMeasurer(w.graph)
    tuner = Tuner(w, "llvm", fake, TuningLog(tmp_path / "logs"), TuneConfig(trials=12, finalize=False))
    tuner.run()
    study = open_study(None, tmp_path / "logs", tuner.study_name, 0)
    assert all(set(t.params) == set(space.tied) for t in study.trials)
    tied = next(ids for ids in space.tied.values() if len(ids) > 2)
    odd = space.decode({tied[0]: True})  # one layer's merge of that part, the others not
    assert space.decode(space.untie(space.tie(space.encode(odd)))) != odd
    tuner._enqueue(study, odd)
    trial, plan = tuner._ask(study)
    assert plan == odd and trial.params == space.tie(space.encode(odd))
    assert trial.user_attrs["plan_key"] == odd.key
    assert study.trials[-1].state == optuna.trial.TrialState.RUNNING
