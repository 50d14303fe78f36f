"""Two `autofuse tune` workers share one Optuna study in PostgreSQL (and in a journal file).

.ci/run starts a local PostgreSQL server (scripts/start_postgres.sh) and sets
AUTOFUSE_TEST_POSTGRES_URL; under CI a missing server is a failure, not a skip.
"""

import os
import subprocess
import sys
from collections import Counter

import optuna
import pytest

from autofuse.measure import Measurement
from autofuse.tuning_log import TuningLog

TRIALS = 10


def postgres_url():
    url = os.environ.get("AUTOFUSE_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("CI must provide AUTOFUSE_TEST_POSTGRES_URL (scripts/start_postgres.sh)")
        pytest.skip("no PostgreSQL server: export AUTOFUSE_TEST_POSTGRES_URL=$(bash scripts/start_postgres.sh)")
    return url


def run_workers(model, log_dir, storage_args, n=2):
    cmd = [sys.executable, "-m", "autofuse.cli", "tune", str(model), "--log-dir", str(log_dir),
           "--trials", str(TRIALS), "--repeat", "2", "--no-finalize", "--json", *storage_args]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err


def check_study(study, log_dir):
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state for t in trials)
    assert states[optuna.trial.TrialState.RUNNING] == 0 and states[optuna.trial.TrialState.WAITING] == 0
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    finished = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)]
    assert len(finished) >= TRIALS
    owners = {t.user_attrs["owner"] for t in trials}
    assert len(owners) == 2, owners  # both workers took trials
    records = [r for r in TuningLog(log_dir).records() if r.study == study.study_name]
    by_trial = Counter(r.trial for r in records)
    anchor = next(m.default_s for m in (Measurement.from_dict(r.measurement) for r in TuningLog(log_dir).records())
                  if m.default_s)
    assert all(c == 1 for c in by_trial.values()), by_trial  # no trial measured twice
    for t in finished:  # no trial lost: each is a logged measurement or a cache hit of one
        if t.user_attrs.get("cached"):
            # both workers may have measured the same plan concurrently before either logged it;
            # a cache hit then reports one of those measurements
            candidates = [r for r in records if r.plan_key == t.user_attrs["plan_key"]]
            assert candidates, f"cached trial {t.number} has no measured record of its plan"
        else:
            assert by_trial[t.number] == 1, f"trial {t.number} has no log record"
            candidates = [r for r in records if r.trial == t.number]
        assert all(r.plan_key == t.user_attrs["plan_key"] for r in candidates)
        if t.state == optuna.trial.TrialState.COMPLETE:
            # the value told is the tuner's (Tuner.value): paired with TVM's plan, scaled to TVM's
            # plan's latency in the first paired record of the log, which both workers read first
            assert any(t.value == pytest.approx(Measurement.from_dict(r.measurement).at_default_s(anchor))
                       for r in candidates), (t.value, candidates)


def _study(storage, log_dir):
    names = optuna.get_all_study_names(storage)
    assert len(names) == 1
    return optuna.load_study(study_name=names[0], storage=storage)


def test_two_workers_share_a_postgresql_study(model_dir, tmp_path):
    url = postgres_url()
    storage = optuna.storages.RDBStorage(url)
    for name in optuna.get_all_study_names(storage):  # a fresh study for this run
        optuna.delete_study(study_name=name, storage=storage)
    run_workers(model_dir / "mlp.onnx", tmp_path, ["--storage", url])
    check_study(_study(storage, tmp_path), tmp_path)


def test_two_workers_share_the_default_journal(model_dir, tmp_path):
    run_workers(model_dir / "mlp.onnx", tmp_path, [])
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(tmp_path / "optuna_journal.log")))
    check_study(_study(storage, tmp_path), tmp_path)
