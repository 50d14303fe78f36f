"""GPU resource limits as fusion constraints: ptxas' report read per kernel, over-limit plans
rejected. Compile-only: no GPU needed, nvcc is."""

import shutil

import pytest

from autofuse.build import MeasureConfig
from autofuse.gpu_resources import KernelResources
from autofuse.gpu_resources import ResourceLimits
from autofuse.gpu_resources import by_function
from autofuse.gpu_resources import parse_ptxas
from autofuse.measure import IsolatedMeasurer
from autofuse.space import SearchSpace
from autofuse.space import load_resource_limits

REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'fused_matmul_add_kernel' for 'sm_90'
ptxas info    : Function properties for fused_matmul_add_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'fused_matmul_add_kernel_1' for 'sm_90'
ptxas info    : Function properties for fused_matmul_add_kernel_1
    16 bytes stack frame, 24 bytes spill stores, 32 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'matmul_kernel' for 'sm_90'
ptxas info    : Function properties for matmul_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 400 bytes cmem[0]
"""


def test_report_parsed_and_grouped_by_primfunc():
    usage = parse_ptxas(REPORT)
    assert usage["fused_matmul_add_kernel"] == KernelResources(40, 0, 8192, 0)
    assert usage["fused_matmul_add_kernel_1"] == KernelResources(255, 56, 0, 16)
    grouped = by_function(usage, ["fused_matmul_add", "matmul"])
    assert grouped["fused_matmul_add"] == KernelResources(255, 56, 8192, 16)
    assert grouped["matmul"].registers == 12  # not swallowed by the longer name


def test_limits():
    spilling = KernelResources(200, 56, 0, 0)
    assert ResourceLimits().violations("k", spilling, "sm_90") == ["k: spills 56 bytes"]
    assert ResourceLimits(allow_spills=True).violations("k", spilling, "sm_90") == []
    assert ResourceLimits(max_registers=128, allow_spills=True).violations("k", spilling, "sm_90")
    big_smem = KernelResources(32, 0, 100 << 10, 0)
    assert ResourceLimits().violations("k", big_smem, "sm_90") == []  # 227 KiB per block
    assert ResourceLimits().violations("k", big_smem, "sm_86")  # 99 KiB
    assert load_resource_limits("gpu") == ResourceLimits(255, None, False)


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@needs_nvcc
def test_cuda_plans_report_resources_and_over_limit_groups_are_rejected(transformer):
    plan = SearchSpace(transformer.graph).plan_of_kinds({"vertical", "horizontal", "reduction"})
    cfg = MeasureConfig(timeout_s=300)
    with IsolatedMeasurer(transformer, target="cuda", config=cfg, build_only=True) as m:
        built = m.measure(plan)
    assert built.status == "built", built.error
    assert set(built.resources) <= set(built.kernels) and len(built.resources) >= len(set(built.kernels)) // 2
    assert all(r["registers"] > 0 for r in built.resources.values())
    tight = ResourceLimits(max_registers=8)
    with IsolatedMeasurer(transformer, target="cuda", config=cfg, build_only=True, resource_limits=tight) as m:
        rejected = m.measure(plan)
    assert rejected.status == "over_limit" and rejected.rule == "resources"
    assert "registers > 8" in rejected.error
