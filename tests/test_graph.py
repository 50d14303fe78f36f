from autofuse.graph import OpGraph
from autofuse.graph import OpKind
from autofuse.graph import OpNode


def test_extract_small_module(small):
    g = small.graph
    assert [n.op for n in g.nodes] == [
        "matmul", "relu", "sum", "divide", "fast_exp", "add", "multiply", "add"
    ]
    assert g.nodes[0].kind == OpKind.OUT_EWISE_FUSABLE and g.nodes[0].is_anchor
    assert g.nodes[2].kind == OpKind.REDUCE
    assert set(g.edges) == {(0, 1), (1, 2), (1, 3), (2, 3), (3, 5), (4, 5), (5, 7), (6, 7)}
    assert g.outputs == frozenset({7})
    # x is read by matmul, exp and multiply; w only by matmul
    assert g.input_readers == ((0, 4, 6), (0,))
    assert g.nodes[0].flops == 4 * 8 * 8 * 2
    assert g.nodes[0].bytes_out == 4 * 8 * 4
    assert g.nodes[2].shape == (4, 1)


def test_reachability(small):
    g = small.graph
    assert (g.descendants[0] >> 7) & 1 and not (g.descendants[7] >> 0) & 1
    assert g.independent(4, 6) and g.independent(0, 4) and not g.independent(1, 3)


def test_json_round_trip(transformer):
    g = transformer.graph
    assert OpGraph.from_json(g.to_json()) == g


def test_rejects_backward_edges():
    node = OpNode(0, "a", "relu", OpKind.ELEMWISE, (1,), "float32", 1.0, 4, 4)
    node1 = OpNode(1, "b", "relu", OpKind.ELEMWISE, (1,), "float32", 1.0, 4, 4)
    try:
        OpGraph((node, node1), ((1, 0),))
    except ValueError as err:
        assert "not forward" in str(err)
    else:
        raise AssertionError("a backward edge must be rejected")


def chain_of_blocks(blocks: int) -> OpGraph:
    """blocks x (matmul -> add -> relu), each block reading the one before."""
    nodes, edges = [], []
    for b in range(blocks):
        for op, kind in (("matmul", OpKind.OUT_EWISE_FUSABLE), ("add", OpKind.BROADCAST), ("relu", OpKind.ELEMWISE)):
            i = len(nodes)
            nodes.append(OpNode(i, f"{op}{b}", op, kind, (8, 16), "float32", 1.0, 512, 512))
            if i:
                edges.append((i - 1, i))
    return OpGraph(tuple(nodes), tuple(edges), frozenset({len(nodes) - 1}))


def test_nodes_in_the_same_part_of_repeated_blocks_share_a_role():
    g = chain_of_blocks(6)
    roles = [g.roles[b * 3: b * 3 + 3] for b in range(6)]
    # the blocks two edges or more from either end look alike; those nearer an end do not
    assert roles[1] == roles[2] == roles[3] == roles[4]
    assert roles[0] != roles[1] and roles[5] != roles[4] and roles[0] != roles[5]
    assert len(set(roles[2])) == 3  # matmul, add and relu are different parts
    # labels are numbered by first appearance: the same in every process
    assert g.roles[0] == 0 and max(g.roles) == len(set(g.roles)) - 1
