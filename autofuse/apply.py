"""TVM write side: turn a FusionPlan into a fused Relax module, one kernel per group.

Each multi-op group is outlined into a `Primitive` Relax function, exactly as FuseOps does, and
FuseTIR then merges every such function into one PrimFunc. Run on the output of
`tvm_bridge.normalize`; the result replaces the FuseOps -> FuseTIR pair of TVM's pipeline, so
the build must not run FuseOps again (build.py takes care of that).
"""

from __future__ import annotations

import heapq

import tvm
from tvm import relax

from autofuse.graph import OpGraph
from autofuse.plan import NO_LIMITS
from autofuse.plan import FusionLimits
from autofuse.plan import FusionPlan
from autofuse.plan import validate
from autofuse.tvm_bridge import MainBlock
from autofuse.tvm_bridge import main_block


def apply_plan(
    mod: tvm.IRModule, graph: OpGraph, plan: FusionPlan, limits: FusionLimits | None = None
) -> tvm.IRModule:
    """Validate `plan` against `graph`, group the bindings and fuse each group's kernels.
    `limits`: a search space's limits to check too (by default only structural legality)."""
    return fuse(mod, graph, plan, limits)[0]


def fuse(
    mod: tvm.IRModule, graph: OpGraph, plan: FusionPlan, limits: FusionLimits | None = None
) -> tuple[tvm.IRModule, list[str]]:
    """apply_plan, also returning the name of each group's PrimFunc (in `plan.groups` order)."""
    validate(graph, plan, limits or NO_LIMITS)
    grouped, names = group_bindings(mod, plan)
    kernels = [names.get(g) or graph.nodes[g[0]].op for g in plan.groups]
    # FuseTIR merges each Primitive function into one PrimFunc of the same name; DCE drops the
    # unused originals
    seq = tvm.transform.Sequential(
        [relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()]
    )
    return seq(grouped), kernels


def group_bindings(
    mod: tvm.IRModule, plan: FusionPlan
) -> tuple[tvm.IRModule, dict[tuple[int, ...], str]]:
    """Outline every group of two or more kernels into a Primitive function called from main.

    Returns the grouped module and the name given to each multi-op group's function.
    """
    block = main_block(mod)
    order = _unit_order(block, plan)
    grouper = _Grouper(mod, block, order)
    new_main = grouper.visit_expr(mod["main"])
    grouper.builder_.update_func(mod.get_global_var("main"), new_main)
    node_ids = {id(b): i for i, b in enumerate(block.node_bindings)}
    names = {
        tuple(sorted(node_ids[id(b)] for b in unit if id(b) in node_ids)): name
        for unit, name in grouper.group_names
    }
    return grouper.builder_.get(), names


def _unit_order(block: MainBlock, plan: FusionPlan) -> list[list[relax.Binding]]:
    """Emission units (a fused group, or one other binding) in a dependency-respecting order.

    Groups are convex and the group graph acyclic, so such an order exists; a heap on each
    unit's first binding position keeps it close to the original order.
    """
    node_ids = {id(b): i for i, b in enumerate(block.node_bindings)}
    group_of = plan.group_of()
    unit_of: dict[int, int] = {}  # binding index -> unit index
    units: list[list[int]] = []
    group_unit: dict[int, int] = {}
    var_group: dict[relax.Var, int] = {}  # results of multi-op groups
    for bi, binding in enumerate(block.bindings):
        nid = node_ids.get(id(binding))
        gi = group_of[nid] if nid is not None and len(plan.groups[group_of[nid]]) > 1 else None
        if gi is None and isinstance(binding.value, relax.TupleGetItem):
            # indexing a tuple-output kernel (e.g. split) of a group belongs inside that group
            gi = var_group.get(binding.value.tuple_value)
        if gi is not None:
            var_group[binding.var] = gi
        if gi is not None and gi in group_unit:
            unit_of[bi] = group_unit[gi]
            units[group_unit[gi]].append(bi)
            continue
        unit_of[bi] = len(units)
        units.append([bi])
        if gi is not None:
            group_unit[gi] = unit_of[bi]
    defined_by = {b.var: unit_of[bi] for bi, b in enumerate(block.bindings)}
    succ: list[set[int]] = [set() for _ in units]
    indeg = [0] * len(units)
    for bi, binding in enumerate(block.bindings):
        for v in relax.analysis.free_vars(binding.value):
            src, dst = defined_by.get(v), unit_of[bi]
            if src is not None and src != dst and dst not in succ[src]:
                succ[src].add(dst)
                indeg[dst] += 1
    ready = [(units[u][0], u) for u in range(len(units)) if indeg[u] == 0]
    heapq.heapify(ready)
    order: list[list[relax.Binding]] = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append([block.bindings[bi] for bi in units[u]])
        for w in succ[u]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(ready, (units[w][0], w))
    if len(order) != len(units):
        raise ValueError("the plan's groups depend on each other in a cycle")
    return order


def _group_name(members: list[relax.Binding]) -> str:
    ops = [m.value.args[0].name_hint for m in members if not isinstance(m.value, relax.TupleGetItem)]
    name = "fused_" + "_".join(ops)
    return name if len(name) <= 64 else f"{name[:56]}_{len(ops)}ops"


@relax.expr_functor.mutator
class _Grouper(relax.PyExprMutator):  # type: ignore[misc]
    def __init__(
        self, mod: tvm.IRModule, block: MainBlock, order: list[list[relax.Binding]]
    ) -> None:
        super().__init__(mod)
        self.block, self.order = block, order
        self.group_names: list[tuple[list[relax.Binding], str]] = []
        later = list(block.func.body.blocks)[block.block_index + 1 :]
        self.used_later = {
            v
            for expr in [b.value for blk in later for b in blk.bindings] + [block.func.body.body]
            for v in relax.analysis.free_vars(expr)
        }
        self.users: dict[relax.Var, set[int]] = {}  # var -> ids of the bindings reading it
        for b in block.bindings:
            for v in relax.analysis.free_vars(b.value):
                self.users.setdefault(v, set()).add(id(b))

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        if not block.same_as(self.func_block()):
            return super().visit_dataflow_block_(block)
        self.builder_._begin_dataflow_block()
        for unit in self.order:
            if len(unit) == 1:
                self.visit_binding(unit[0])
            else:
                self._emit_group(unit)
        return self.builder_._end_block()

    def func_block(self) -> relax.BindingBlock:
        return self.block.func.body.blocks[self.block.block_index]

    def _outputs(self, members: list[relax.Binding]) -> list[relax.Var]:
        inside = {id(m) for m in members}
        return [
            m.var
            for m in members
            if m.var in self.used_later
            or not isinstance(m.var, relax.DataflowVar)
            or self.users.get(m.var, set()) - inside
        ]

    def _emit_group(self, members: list[relax.Binding]) -> None:
        local: dict[relax.Var, relax.Var] = {m.var: None for m in members}  # type: ignore[misc]
        ext_args: list[relax.Expr] = []
        ext_params: list[relax.Var] = []

        def param_for(arg: relax.Expr) -> relax.Expr:
            # vars from outside the group and constants both become parameters: FuseTIR
            # rejects tensor constants inside primitive functions
            for i, a in enumerate(ext_args):
                if a.same_as(arg):
                    return ext_params[i]
            ext_args.append(arg)
            ext_params.append(relax.Var(f"p{len(ext_params)}", arg.ty))
            return ext_params[-1]

        outs = self._outputs(members)
        name = _group_name(members)
        fbb = relax.BlockBuilder()
        bound: list[tuple[relax.Binding, list[relax.Expr]]] = []
        for m in members:
            if isinstance(m.value, relax.TupleGetItem):
                bound.append((m, []))
                continue
            args = m.value.args[1].fields
            bound.append((m, [a if a in local else param_for(a) for a in args]))
        with fbb.function(name, ext_params, attrs={"Primitive": True}, private=True):
            with fbb.dataflow():
                for m, args in bound:
                    if isinstance(m.value, relax.TupleGetItem):
                        item = relax.TupleGetItem(local[m.value.tuple_value], m.value.index)
                        local[m.var] = fbb.emit(item, name_hint=m.var.name)
                        continue
                    call = m.value
                    new_args = [local[a] if a in local else a for a in args]
                    rebuilt = relax.Call(
                        call.op,
                        [call.args[0], relax.Tuple(new_args), *call.args[2:]],
                        call.attrs,
                        call.ty_args,
                    )
                    local[m.var] = fbb.emit(rebuilt, name_hint=m.var.name)
                result = [local[v] for v in outs]
                ret = fbb.emit_output(result[0] if len(result) == 1 else relax.Tuple(result))
            fbb.emit_func_output(ret)
        gv = self.builder_.add_func(fbb.get()[name], name)
        self.group_names.append((members, gv.name_hint))
        call = relax.Call(gv, [self.visit_expr(a) for a in ext_args])
        if len(outs) == 1:
            self._bind(outs[0], call)
            return
        tup = self.builder_.emit(call, name_hint=f"{name}_out")
        for i, v in enumerate(outs):
            self._bind(v, relax.TupleGetItem(tup, i))

    def _bind(self, old: relax.Var, value: relax.Expr) -> None:
        if isinstance(old, relax.DataflowVar):
            new = self.builder_.emit(value, name_hint=old.name)
        else:
            new = self.builder_.emit_output(value, name_hint=old.name)
        self.set_var_remap(old, new)
