import json

import pytest

from autofuse.measure import Measurement
from autofuse.plan import FusionPlan
from autofuse.tuning_log import KERNELS_VERSION
from autofuse.tuning_log import LogError
from autofuse.tuning_log import TuningLog
from autofuse.tuning_log import TuningRecord


def record(key="k1", target="llvm", median=1e-3, status="ok", role="search", groups=((0, 1), (2,))):
    plan = FusionPlan.from_groups(groups)
    lat = (median,) * 3 if status == "ok" else ()
    m = Measurement(plan.key, status, latencies_s=lat)
    return TuningRecord(key, "m", target, "none", plan.to_dict(), m.to_dict(), role=role)


def test_round_trip_and_fields(tmp_path):
    log = TuningLog(tmp_path)
    rec = record()
    log.append(rec)
    (back,) = log.records()
    assert back == rec
    data = json.loads(log.path.read_text())
    for field in ("schema", "versions", "model_key", "target", "device", "plan", "measurement",
                  "protocol", "created", "scheduler"):
        assert field in data
    assert set(data["versions"]) == {"autofuse", "tvm", "optuna", "xgboost", "kernels"}
    assert data["versions"]["kernels"] == str(KERNELS_VERSION)  # which kernels the latency describes


def test_torn_last_line_is_skipped_and_later_appends_survive(tmp_path):
    log = TuningLog(tmp_path)
    log.append(record(median=2e-3))
    with open(log.path, "ab") as fh:  # a process killed mid-write
        fh.write(record(median=1e-3).to_json()[:57].encode())
    recs = log.records()
    assert len(recs) == 1 and "torn" in log.warnings[0]
    log.append(record(median=3e-3))
    recs = log.records()
    assert [r.median_s for r in recs] == [2e-3, 3e-3]
    assert any("torn" in w for w in log.warnings)


def test_corrupt_middle_line_is_an_error(tmp_path):
    log = TuningLog(tmp_path)
    log.append(record())
    with open(log.path, "ab") as fh:
        fh.write(b'{"this": "is not a record"}\n')
    log.append(record())
    with pytest.raises(LogError, match=r"records.jsonl:2: corrupt log line"):
        log.records()


def test_best_query(tmp_path):
    log = TuningLog(tmp_path)
    log.append(record(median=3e-3, groups=((0,), (1,), (2,))))
    log.append(record(median=1e-3, groups=((0, 1, 2),)))
    log.append(record(median=0.5e-3, status="wrong_result", groups=((0, 2), (1,))))
    log.append(record(key="other", median=0.1e-3))
    log.append(record(target="cuda:sm_90", median=0.1e-3))
    best = log.best("k1", "llvm")
    assert best.median_s == 1e-3 and best.plan["groups"] == [[0, 1, 2]]
    log.append(record(median=2e-3, role="best", groups=((0,), (1, 2))))
    assert log.best("k1", "llvm").role == "best"  # a finished run's decision wins
    assert log.best("nope", "llvm") is None


def test_merge_keeps_every_record_once(tmp_path):
    a, b, dest = TuningLog(tmp_path / "a"), TuningLog(tmp_path / "b"), TuningLog(tmp_path / "d")
    for i in range(3):
        a.append(record(median=(i + 1) * 1e-3))
    for i in range(2):
        b.append(record(key="k2", median=(i + 1) * 1e-3))
    shared = record(key="k3")
    a.append(shared)
    b.append(shared)
    dest.append(record(key="k4"))
    assert dest.merge_from([a.dir, b.path]) == 6
    assert dest.merge_from([a.dir, b.dir]) == 0
    ids = [r.id for r in dest.records()]
    assert len(ids) == len(set(ids)) == 7
