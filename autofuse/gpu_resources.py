"""Per-kernel GPU resource usage (registers, spills, shared memory) read from ptxas, as
fusion constraints.

A fused CUDA kernel can need more registers per thread than the hardware has (255 on every
architecture since Kepler) or spill to local memory, and then runs slower than the kernels it
replaced; shared memory per block is also capped. These limits are the GPU's fusibility rules.
They are known at compile time, without a GPU: `nvcc --resource-usage` on the CUDA source TVM
generated prints them per kernel. A plan with a group over a limit is infeasible (status
'over_limit'), like an illegal plan; the numbers are also logged per kernel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

# shared memory one block may use, by compute capability (bytes; the opt-in maximum)
_SMEM_PER_BLOCK = {"sm_70": 96 << 10, "sm_75": 64 << 10, "sm_80": 163 << 10, "sm_86": 99 << 10,
                   "sm_89": 99 << 10, "sm_90": 227 << 10, "sm_100": 227 << 10, "sm_120": 99 << 10}


class ResourceError(RuntimeError):
    """ptxas could not be run or its report not read."""


@dataclass(frozen=True)
class KernelResources:
    """What one kernel (one group; the max or sum over its CUDA kernels) needs per thread/block."""

    registers: int = 0
    spill_bytes: int = 0  # spill stores + spill loads
    smem_bytes: int = 0
    stack_bytes: int = 0

    def merge(self, other: KernelResources) -> KernelResources:
        return KernelResources(
            max(self.registers, other.registers),
            self.spill_bytes + other.spill_bytes,
            max(self.smem_bytes, other.smem_bytes),
            max(self.stack_bytes, other.stack_bytes),
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class ResourceLimits:
    """When a fused GPU kernel is infeasible (search_spaces/*.json "gpu_resources")."""

    max_registers: int = 255
    max_smem_bytes: int | None = None  # None: the architecture's per-block maximum
    allow_spills: bool = False

    @staticmethod
    def from_dict(data: dict[str, Any] | None) -> ResourceLimits:
        data = data or {}
        known = {k: data[k] for k in ("max_registers", "max_smem_bytes", "allow_spills") if k in data}
        return ResourceLimits(**known)

    def violations(self, name: str, res: KernelResources, arch: str) -> list[str]:
        out = []
        if res.registers > self.max_registers:
            out.append(f"{name}: {res.registers} registers > {self.max_registers}")
        if res.spill_bytes and not self.allow_spills:
            out.append(f"{name}: spills {res.spill_bytes} bytes")
        smem = self.max_smem_bytes if self.max_smem_bytes is not None else _SMEM_PER_BLOCK.get(arch, 48 << 10)
        if res.smem_bytes > smem:
            out.append(f"{name}: {res.smem_bytes} bytes shared memory > {smem}")
        return out


def cuda_source(executable_module: Any) -> str | None:
    """The CUDA C source inside a compiled Relax executable (None if it has no CUDA module)."""
    stack = [executable_module]
    while stack:
        mod = stack.pop()
        if getattr(mod, "kind", "") == "cuda":
            return str(mod.inspect_source(""))
        stack.extend(getattr(mod, "imports", []))
    return None


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def ptxas_usage(source: str, arch: str = "sm_90", timeout_s: float = 300.0) -> dict[str, KernelResources]:
    """Resource usage of every __global__ kernel in `source`, compiled for `arch` by nvcc."""
    nvcc = shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if os.path.exists(p)), None
    )
    if nvcc is None:
        raise ResourceError("nvcc not found: cannot read GPU kernel resource usage")
    with tempfile.TemporaryDirectory(prefix="autofuse-ptxas-") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        with open(src, "w") as fh:
            fh.write(source)
        cmd = [nvcc, f"-arch={arch}", "-cubin", "--resource-usage", "-w", "-o", os.path.join(tmp, "k.cubin"), src]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ResourceError(f"nvcc failed: {err}") from None
    if proc.returncode != 0:
        raise ResourceError(f"nvcc failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return parse_ptxas(proc.stdout + proc.stderr)


def parse_ptxas(report: str) -> dict[str, KernelResources]:
    """Per-kernel numbers from ptxas' `-v` / nvcc's `--resource-usage` report."""
    out: dict[str, KernelResources] = {}
    name = None
    frame = (0, 0, 0)
    for line in report.splitlines():
        if m := _ENTRY.search(line):
            name, frame = m.group(1), (0, 0, 0)
        elif (m := _FRAME.search(line)) and name:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and name:
            smem = int(m.group(2) or 0)
            out[name] = KernelResources(int(m.group(1)), frame[1] + frame[2], smem, frame[0])
            name = None
    return out


def by_function(usage: dict[str, KernelResources], functions: list[str]) -> dict[str, KernelResources]:
    """Group CUDA kernels by the PrimFunc that produced them: TVM names them `<func>_kernel`,
    `<func>_kernel_1`, ... (a PrimFunc may launch several)."""
    out: dict[str, KernelResources] = {}
    longest_first = sorted(set(functions), key=len, reverse=True)
    for kernel, res in usage.items():
        func = next((f for f in longest_first if re.fullmatch(rf"{re.escape(f)}_kernel(_\d+)?", kernel)), None)
        if func is not None:
            out[func] = out[func].merge(res) if func in out else res
    return out
