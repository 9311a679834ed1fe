"""partir_core through control flow: scan (over stacked layers), while / fori_loop and cond / switch are
partitioned like straight-line code and lowered to one partitioned loop each, with their reshards and
reductions inside the body."""

import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as PS

import redist
import partir_core as pc
from partir_core.analysis import analyze_groups
from partir_core.program import ControlFlow, Reshard, walk
from tests.partir_core.helpers import assert_same


MESH = redist.Mesh({"batch": 2, "model": 4})
MP = pc.ManualPartition


def t(text):
    return redist.ShardingType.parse(text, MESH)


def stacked_mlp(layers=3, d=16, hidden=32, batch=8):
    """A residual MLP over stacked layer weights (``params/w1``: ``(layers, d, hidden)``), as MaxText scans
    its layers: a training step (forward scan, backward scan, SGD update)."""
    def loss(params, x):
        def layer(h, p):
            return h + jnp.tanh(h @ p["w1"]) @ p["w2"], None

        h, _ = lax.scan(layer, x, params)
        return jnp.mean(h ** 2)

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    k = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k[0], (layers, d, hidden)) / 4,
              "w2": jax.random.normal(k[1], (layers, hidden, d)) / 6}
    return step, (params, jax.random.normal(k[2], (batch, d)))


MEGATRON = [MP({"x": 0}, axis="batch"), MP({"params/w1": 2, "params/w2": 1}, axis="model")]


def test_scan_over_stacked_layers_is_one_partitioned_loop_with_its_reductions_inside():
    step, args = stacked_mlp()
    pf = pc.jit(step, MESH, MEGATRON)
    low = pf.lower(*args)
    assert_same(pf(*args), step(*args))
    assert not low.unsupported and not low.carry_reshards and not low.fallbacks
    loops = [i for i in low.program.instructions if isinstance(i, ControlFlow)]
    assert [i.kind for i in loops] == ["scan", "scan"] and len(low.graph.regions) == 2  # forward and backward
    # Megatron inside the body: the row-split matmul's pending sum is all-reduced on the model axis in every
    # iteration; the stacked weights are never gathered around the loop
    inside = [c for loop in loops for body in loop.bodies for ins in walk(body)
              if isinstance(ins, Reshard) for c in ins.collectives]
    assert {(c.kind, c.axes, c.trips) for c in inside if "model" in c.axes} == {("all_reduce", ("model",), 3)}
    assert not [c for c in low.collectives if c.kind == "all_gather" and "model" in c.axes]
    # the body sees the per-layer slice of the stacked weight, split as the user split the stack
    enter = low.graph.eqns[low.graph.regions[0].enter]
    w1 = next(v for v in enter.outvars if low.graph.names.get(v) == "params/w1[i]")
    assert low.types[w1] == t("f32[16, 32{model}]")
    assert low.input_type("params/w1") == t("f32[3, 16, 32{model}]")
    assert "params/w1[i]" in str(low)


def test_a_stacked_layer_dim_may_be_split_like_any_dim():
    """Splitting the stacked layer dim of the weights (each device storing some layers): the loop reads every
    layer, so the stack is gathered where it enters the loop (the layer dim is whole inside the body) and the
    stacked gradient comes out whole and is sliced back; the step is exact."""
    step, args = stacked_mlp(layers=4)
    pf = pc.jit(step, MESH, [MP({"params/w1": 0, "params/w2": 0}, axis="model")])
    low = pf.lower(*args)
    assert_same(pf(*args), step(*args))
    assert low.input_type("params/w1") == t("f32[4{model}, 16, 32]") and not low.unsupported
    entries = {f"eqn {r.enter} (scan)" for r in low.graph.regions}
    assert {c.where for c in low.collectives if c.kind in ("all_gather", "exchange")} <= entries


def test_a_loop_costs_its_trip_count_times_its_body():
    short, long_ = (pc.jit(s, MESH, MEGATRON).lower(*a).simulate() for s, a in (stacked_mlp(2), stacked_mlp(4)))
    base = pc.jit(stacked_mlp(0)[0], MESH, MEGATRON).lower(*stacked_mlp(0)[1]).simulate()
    assert long_.flops - base.flops == pytest.approx(2 * (short.flops - base.flops))
    assert long_.comm_bytes - base.comm_bytes == pytest.approx(2 * (short.comm_bytes - base.comm_bytes))
    assert long_.step_time_s > short.step_time_s


def test_a_carry_that_propagation_cannot_keep_is_moved_back_at_the_end_of_the_body():
    """The body transposes its carry: a carry split on dim 0 comes out split on dim 1. The carry keeps its type
    (a fixed point), the move back is made inside the loop every iteration, and it is reported."""
    def f(x):
        return lax.scan(lambda c, _: (jnp.tanh(c.T) * 0.5, jnp.sum(c)), x, None, length=3)

    x = jax.random.normal(jax.random.key(1), (8, 8))
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch")])
    low = pf.lower(x)
    assert_same(pf(x), f(x))
    (moved,) = low.carry_reshards
    assert (moved.region, moved.carry) == (0, 0) and "f32[8, 8{batch}]" in moved.src and "f32[8{batch}, 8]" in moved.dst
    (loop,) = [i for i in low.program.instructions if isinstance(i, ControlFlow)]
    assert any(isinstance(i, Reshard) for i in loop.bodies[0])  # inside the loop
    assert all(c.trips == 3 for c in low.collectives if c.where.startswith("end of the body"))
    assert low.out_types[0] == t("f32[8{batch}, 8]")


def test_while_and_fori_loop_with_traced_bounds_are_partitioned():
    def f(x, w, n):
        y = lax.fori_loop(0, n, lambda i, y: jnp.tanh(y @ w), x)

        def body(c):
            i, z = c
            return i + 1, z * 1.5 - jnp.sum(z, axis=1, keepdims=True) / 16

        return y, lax.while_loop(lambda c: c[0] < 5, body, (0, y))[1]

    x, w = jax.random.normal(jax.random.key(2), (8, 16)), jnp.eye(16) * 0.9
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch"), MP({"w": 1}, axis="model")])
    low = pf.lower(x, w, 3)
    assert_same(pf(x, w, 3), f(x, w, 3))
    assert not low.unsupported and [r.kind for r in low.graph.regions] == ["while", "while"]
    assert [r.trips for r in low.graph.regions] == [None, 5]  # a bound that is an input is not known
    assert all(c.trips in (1, 5) for c in low.collectives)
    assert low.types[low.graph.eqns[low.graph.regions[1].exit].outvars[1]].dims[0] == ("batch",)


def test_cond_and_switch_are_partitioned_with_reductions_inside_the_branches():
    def f(x, w, i):
        y = x @ w
        a = lax.cond(jnp.sum(y) > 0, lambda a: jnp.tanh(a) @ w.T, lambda a: a @ w.T * 2, y)
        b = lax.switch(i, [lambda a: a * 2, jnp.sin, lambda a: jnp.max(a, axis=0, keepdims=True) + a], a)
        return a, b

    x, w = jax.random.normal(jax.random.key(3), (8, 16)), jax.random.normal(jax.random.key(4), (16, 32)) / 4
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch"), MP({"w": 1}, axis="model")])
    low = pf.lower(x, w, 2)
    for i in range(3):
        assert_same(pf(x, w, i), f(x, w, i))
    assert not low.unsupported and [r.kind for r in low.graph.regions] == ["cond", "cond"]
    (first, second) = [i for i in low.program.instructions if isinstance(i, ControlFlow)]
    # the row-split matmul of each branch is all-reduced inside the branch; the third branch's max over the
    # batch-split dim is finished inside it
    assert all(any(isinstance(i, Reshard) for i in body) for body in first.bodies)
    assert any(c.kind == "all_reduce_max" and "branch" not in c.where for c in low.collectives)


def test_nested_loops_multiply_their_trips_and_stacked_pending_sums_are_reduced_once_after_the_loop():
    def f(x, w):
        def outer(c, _):
            d, _ = lax.scan(lambda d, _: (jnp.tanh(d @ w), None), c, None, length=2)
            return d, jnp.sum(d)

        return lax.scan(outer, x, None, length=3)

    x, w = jax.random.normal(jax.random.key(5), (8, 16)), jnp.eye(16) * 0.9
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch"), MP({"w": 1}, axis="model")])
    low = pf.lower(x, w)
    assert_same(pf(x, w), f(x, w))
    assert [r.parent for r in low.graph.regions] == [None, 0]
    assert {c.trips for c in low.collectives if c.kind == "all_gather"} == {6}
    # the per-iteration sums leave the loop as a stacked pending sum, reduced once
    sums = [c for c in low.collectives if c.kind == "all_reduce"]
    assert [(c.trips, c.where) for c in sums] == [(1, "output 1")]


def test_stacked_results_keep_their_layouts_into_the_next_loop():
    """Two stacked results of one scan, split on the model axis on different factors (as the residuals a
    forward scan saves for the backward one), enter a second scan without a gather between the loops: the ties
    of a loop's exit are independent, so one mesh axis may split a factor of each."""
    def f(x, w1, w2):
        _, (a, b) = lax.scan(lambda c, _: (c, (jnp.tanh(c @ w1), jnp.sin(c @ w2))), x, None, length=3)
        return lax.scan(lambda c, ab: (c + jnp.sum(ab[0] ** 2) + jnp.sum(ab[1]), None), 0.0, (a, b))[0]

    x, w1, w2 = (jax.random.normal(jax.random.key(k), s) for k, s in ((8, (8, 16)), (9, (16, 32)), (10, (16, 8))))
    pf = pc.jit(f, MESH, [MP({"w1": 1, "w2": 1}, axis="model")])
    low = pf.lower(x, w1, w2)
    assert_same(pf(x, w1, w2), f(x, w1, w2))
    ys = [v for v in low.graph.eqns[low.graph.regions[0].exit].outvars if len(low.graph.shape(v)) == 3]
    assert [low.types[v].dims for v in ys] == [((), (), ("model",))] * 2
    assert not [c for c in low.collectives if c.kind in ("all_gather", "exchange")] and not low.conflicts


def test_random_keys_flow_through_a_scan():
    def f(x, key):
        def layer(h, k):
            keep = jax.random.bernoulli(k, 0.8, h.shape)
            return jnp.where(keep, jnp.tanh(h) / 0.8, 0.0), None

        return lax.scan(layer, x, jax.random.split(key, 3))[0]

    x, key = jax.random.normal(jax.random.key(6), (8, 16)), jax.random.key(7)
    pf = pc.jit(f, MESH, [MP({"x": 0}, axis="batch"), MP({"x": 1}, axis="model")])
    assert_same(pf(x, key), f(x, key))
    assert not pf.lower(x, key).unsupported


def test_the_dim_groups_see_through_loop_bodies():
    """The auto-partitioner's analysis joins a stacked weight's per-layer dims with the dims they meet inside
    the body: the hidden dim of w1 and w2 is one group; the stacked layer dim joins no weight dim."""
    step, args = stacked_mlp()
    low = pc.jit(step, MESH, []).lower(*args)
    groups = analyze_groups(low.graph, low.rules)
    v = dict(zip(low.graph.in_paths, low.graph.invars))
    hidden = groups.find(v["params/w1"], 2)
    assert hidden is not None and hidden is groups.find(v["params/w2"], 1)
    assert groups.find(v["params/w1"], 0) is not groups.find(v["params/w1"], 1)
    assert {("params/w1", 2), ("params/w2", 1)} <= set(hidden.inputs)


# ---------------------------------------------------------------------- higher-order primitives it does not know
def test_shard_map_inside_the_function_is_refused_naming_it():
    """A higher-order primitive that partir_core neither inlines nor partitions (shard_map; pmap, which JAX
    traces into one) is refused when lowering, anywhere in the function, not met as a KeyError when it runs.
    Primitives that hold their jaxprs as plain parameters (custom_linear_solve) still run replicated."""
    jmesh = jax.sharding.Mesh(jax.devices()[:2], ("a",), axis_types=(jax.sharding.AxisType.Auto,))
    doubled = jax.shard_map(lambda b: b * 2, mesh=jmesh, in_specs=PS("a"), out_specs=PS("a"))

    def in_a_scan(x):
        return lax.scan(lambda c, _: (doubled(c), None), x, None, length=2)[0]

    x = jnp.ones((8, 4))
    schedule = [MP({"x": 0}, axis="batch")]
    for f in (lambda x: doubled(x) + 1, in_a_scan, lambda x: jax.pmap(lambda b: b * 2)(x[:1])):
        with pytest.raises(pc.PartitionError, match=r"^(shard_map|xla_pmap) inside a function to partition is not "
                                                    r"supported: .*call (shard_map|xla_pmap) outside partir_core.jit"):
            pc.jit(f, MESH, schedule)(x)
    solve = lambda x: lax.custom_linear_solve(lambda v: 2 * v, x, lambda matvec, b: b / 2) + x  # noqa: E731
    assert_same(pc.jit(solve, MESH, schedule)(x), solve(x))


def test_a_scan_output_its_body_reduces_anyway_is_reduced_once():
    """A pending sum that a scan's body reduces for one reader and also stacks as an output (a residual a
    forward pass saves for its backward) is reduced once per iteration: the output takes the reduced buffer,
    instead of being stacked pending and reduced a second time after the loop."""
    def f(x, ws):
        def body(c, w):
            y = x @ w  # x split on its features: a pending sum over model
            return c + jnp.tanh(y), y

        return lax.scan(body, jnp.zeros((8, 16)), ws)

    x, ws = jnp.ones((8, 32)) / 8, jnp.ones((3, 32, 16)) / 4
    pf = pc.jit(f, MESH, [MP({"x": 1, "ws": 1}, axis="model")])
    low = pf.lower(x, ws)
    (reduce,) = low.collectives
    assert reduce.kind == "all_reduce" and reduce.trips == 3
    assert not low.out_types[1].partial
    assert_same(pf(x, ws), f(x, ws))
