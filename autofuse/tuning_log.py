"""Tuning logs: append-only JSON Lines, one record per measured plan.

Records are never rewritten. A torn last line (a process killed mid-write) is reported and
skipped; a later append first writes a marker line that says so, so the reader keeps telling a
torn line from a corrupt one. Logs from several machines merge by record id without loss.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import uuid
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timezone
from importlib import metadata
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
LOG_NAME = "records.jsonl"
_TORN_MARKER = {"marker": "previous line torn"}


class LogError(ValueError):
    """A log that cannot be read as it is: one line naming the file and the problem."""


# What a plan compiles to under this code: bump it when normalisation or the rule-based schedules
# change the kernels. Latencies logged under another value describe other kernels: the tuner
# neither reuses them as measurements nor learns from them (their plans stay deployable).
KERNELS_VERSION = 36


def versions() -> dict[str, str]:
    out = {"kernels": str(KERNELS_VERSION)}
    for dist, key in (
        ("autofuse", "autofuse"),
        ("apache-tvm", "tvm"),
        ("optuna", "optuna"),
        ("xgboost-cpu", "xgboost"),
    ):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = "unknown"
    return out


def device_fingerprint(target: str) -> str:
    """CPU model and core count, or the CUDA architecture the plan was built for."""
    if target.startswith("cuda"):
        return f"{target} (built here; see the measurement for the device that ran it)"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"


# roles of the records that are the tuner's trials (the study's measured plans), in the
# order a run makes them first: its seeds, plans composed from kernel times, probes timing new
# kernels for the next composition, the sampler's picks, the cost model's picks (--strategy model)
TRIAL_ROLES = ("seed", "composed", "probe", "search", "model")


@dataclass(frozen=True)
class TuningRecord:
    """One measured plan. `measurement` holds measured numbers only; `predicted_s` is the cost
    model's estimate made before measuring, kept apart."""

    model_key: str
    model_name: str
    target: str
    scheduler: str
    plan: dict[str, Any]
    measurement: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    groups: list[dict[str, Any]] = field(default_factory=list)  # nodes, kernel, features
    predicted_s: float | None = None
    protocol: dict[str, Any] = field(default_factory=dict)
    role: str = "search"  # one of TRIAL_ROLES, or finalist | best
    trial: int | None = None
    study: str | None = None
    device: str = ""
    space: str = "default"
    versions: dict[str, str] = field(default_factory=versions)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    schema: int = SCHEMA_VERSION

    @property
    def status(self) -> str:
        return str(self.measurement.get("status"))

    @property
    def median_s(self) -> float | None:
        value = self.measurement.get("median_s")
        return float(value) if value is not None else None

    @property
    def plan_key(self) -> str:
        return str(self.plan["key"])

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> TuningRecord:
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")
        known = TuningRecord.__dataclass_fields__
        missing = [k for k in ("model_key", "target", "plan", "measurement") if k not in data]
        if missing:
            raise ValueError(f"missing fields {missing}")
        return TuningRecord(**{k: v for k, v in data.items() if k in known})


class TuningLog:
    """The records of one log directory (`records.jsonl` inside it)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.path = self.dir / LOG_NAME
        self.warnings: list[str] = []
        self._offset = 0  # bytes already handed out by follow()

    def follow(self) -> list[TuningRecord]:
        """Records appended since the last call (complete lines only): other workers' results."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        out = []
        for raw in chunk[:end].split(b"\n"):
            try:
                data = json.loads(raw) if raw.strip() else None
                if data and data != _TORN_MARKER:
                    out.append(TuningRecord.from_dict(data))
            except (ValueError, TypeError):
                continue  # records() reports these; following only needs the good ones
        return out

    def append(self, record: TuningRecord) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        line = record.to_json() + "\n"
        with open(self.path, "ab") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # several workers may share one log
            try:
                if fh.tell() > 0 and not self._ends_with_newline():
                    fh.write(b"\n" + json.dumps(_TORN_MARKER).encode() + b"\n")
                fh.write(line.encode())
                fh.flush()
                os.fsync(fh.fileno())
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"

    def __iter__(self) -> Iterator[TuningRecord]:
        return iter(self.records())

    def records(self, model_key: str | None = None, target: str | None = None) -> list[TuningRecord]:
        """All records (optionally of one model and target), in file order.

        Raises LogError for a corrupt line that is not a torn last line.
        """
        self.warnings = []
        if not self.path.exists():
            return []
        lines = self.path.read_bytes().split(b"\n")
        out = []
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
                if data == _TORN_MARKER:
                    continue
                rec = TuningRecord.from_dict(data)
            except (ValueError, TypeError) as err:
                is_last = all(not x.strip() for x in lines[i + 1 :])
                followed_by_marker = _next_is_marker(lines, i)
                if is_last or followed_by_marker:
                    self.warnings.append(f"{self.path}:{i + 1}: torn line skipped")
                    continue
                raise LogError(f"{self.path}:{i + 1}: corrupt log line ({err})") from None
            if (model_key is None or rec.model_key == model_key) and (
                target is None or rec.target == target
            ):
                out.append(rec)
        return out

    def best(self, model_key: str, target: str, scheduler: str | None = None) -> TuningRecord | None:
        """The plan to deploy: the latest 'best' decision of a finished tuning run, else the
        fastest validated measurement."""
        recs = [
            r
            for r in self.records(model_key, target)
            if r.status == "ok" and (scheduler is None or r.scheduler == scheduler)
        ]
        decided = [r for r in recs if r.role == "best"]
        if decided:
            return decided[-1]
        timed = [r for r in recs if r.median_s is not None]
        return min(timed, key=lambda r: r.median_s or 0.0) if timed else None

    def merge_from(self, sources: Iterable[str | Path]) -> int:
        """Append every record of `sources` (log dirs or files) not already here; returns count."""
        have = {r.id for r in self.records()}
        added = 0
        for src in sources:
            path = Path(src)
            other = TuningLog(path if path.is_dir() else path.parent)
            if path.is_file():
                other.path = path
            for rec in other.records():
                if rec.id not in have:
                    self.append(rec)
                    have.add(rec.id)
                    added += 1
            self.warnings.extend(other.warnings)
        return added


def _next_is_marker(lines: list[bytes], i: int) -> bool:
    for raw in lines[i + 1 :]:
        if raw.strip():
            try:
                return bool(json.loads(raw) == _TORN_MARKER)
            except ValueError:
                return False
    return False
