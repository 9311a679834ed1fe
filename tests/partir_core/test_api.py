"""partir_core with JAX's own objects: JAX meshes, NamedShardings, placed inputs, static and donated arguments;
explanations of conflicts, unsupported ops and the automatic search's choice; input paths; error messages."""

import pytest

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import redist
import partir_core as pc
from partir_core import schedules
from partir_core.automatic import SearchStats
from tests.partir_core.helpers import assert_same, model_and_inputs


MESH = redist.Mesh({"batch": 2, "model": 4})
MP = pc.ManualPartition
BP_MP = [MP({"x": 0}, axis="batch"), MP({"params/w1": 1, "params/w2": 0}, axis="model")]


def mlp(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def mlp_inputs():
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((16, 32), np.float32), "w2": rng.standard_normal((32, 8), np.float32)}
    return params, rng.standard_normal((8, 16), np.float32)


def permuted_mesh():
    """A JAX mesh over the 8 devices in a non-default order."""
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    return jax.sharding.Mesh(np.array([jax.devices()[i] for i in order]).reshape(2, 4), ("batch", "model"))


def assert_on_mesh(x, jax_mesh, spec, want):
    """Every shard of ``x`` is the block that ``NamedSharding(jax_mesh, spec)`` puts on its device, with the
    values of ``want`` there."""
    expected = NamedSharding(jax_mesh, spec).devices_indices_map(x.shape)
    assert len(x.addressable_shards) == jax_mesh.size
    for shard in x.addressable_shards:
        assert shard.index == expected[shard.device]
        np.testing.assert_allclose(np.asarray(shard.data), np.asarray(want)[shard.index], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ meshes
def test_a_jax_mesh_runs_on_its_own_devices_in_its_order():
    jm = permuted_mesh()
    params, x = mlp_inputs()
    pf = pc.jit(mlp, jm, BP_MP)
    low = pf.lower(params, x)
    assert low.mesh == redist.jax.redist_mesh(jm) and not low.mesh.is_row_major
    assert str(low.out_types) == "f32[8{batch}, 8]"
    y = pf(params, x)
    assert_on_mesh(y, jm, P("batch", None), mlp(params, x))
    placed, _ = pf.place(params, x)
    assert_on_mesh(placed[0]["w1"], jm, P(None, "model"), params["w1"])
    assert_on_mesh(placed[1], jm, P("batch", None), x)


def test_make_mesh_explicit_axes_and_an_abstract_mesh():
    params, x = mlp_inputs()
    made = jax.make_mesh((2, 4), ("batch", "model"))  # Explicit axes: the program runs on them as Auto
    assert_same(pc.jit(mlp, made, BP_MP)(params, x), mlp(params, x))
    abstract = jax.sharding.AbstractMesh((2, 4), ("batch", "model"))
    pf = pc.jit(mlp, abstract, BP_MP)
    assert pf.mesh == MESH and pf.lower(params, x).collectives == pc.jit(mlp, MESH, BP_MP).lower(params, x).collectives
    assert_same(pf(params, x), mlp(params, x))  # on the first 8 devices, as a redist.Mesh


def test_a_redist_mesh_with_device_ids_runs_on_those_devices():
    mesh = redist.Mesh({"batch": 2, "model": 4}, device_ids=[7, 6, 5, 4, 3, 2, 1, 0])
    params, x = mlp_inputs()
    y = pc.jit(mlp, mesh, BP_MP)(params, x)
    jm = jax.sharding.Mesh(np.array(jax.devices()[::-1][:8]).reshape(2, 4), ("batch", "model"))
    assert_on_mesh(y, jm, P("batch", None), mlp(params, x))


# ------------------------------------------------------------------------------------------------ shardings
def test_in_and_out_shardings_are_the_types_as_named_shardings():
    def f(params, x):
        return jnp.tanh(x @ params["w1"]) @ params["w2"], jnp.sum(x, axis=1)

    params, x = mlp_inputs()
    x = np.ones((5, 16), np.float32)  # a batch of 5 on 2 devices: uneven
    pf = pc.jit(f, MESH, BP_MP)
    low = pf.lower(params, x)
    ins, outs = low.in_shardings, low.out_shardings
    is_type = lambda t: isinstance(t, redist.ShardingType)  # noqa: E731
    assert jax.tree.structure(ins) == jax.tree.structure(low.in_types, is_leaf=is_type)
    # specs as JAX writes a result's, trailing whole dims left out
    assert ins[0]["w1"].spec == P(None, "model") and ins[0]["w2"].spec == P("model")
    assert ins[1].spec == P()  # the uneven batch dim is whole in its NamedSharding
    assert str(low.input_type("x")) == "f32[5{batch}, 16]"
    assert [str(t) for t in low.out_types] == ["f32[5{batch}, 8]", "f32[5{batch}]"]
    got = pf(params, x)
    for y, s in zip(got, outs):
        assert y.sharding == s  # the results carry them as they are: fed back, they are what a call was traced for
    assert_same(got, f(params, x))


def test_lowering_pauses_the_cyclic_collector_and_restores_it(monkeypatch):
    """While ``partir_core.jit`` traces, partitions and lowers a call with manual tactics, Python's cyclic
    collector is off (as during an automatic search); after it, as it was before: on or off, after a program or
    an error."""
    import gc

    from partir_core import partition

    seen = []
    lower = partition.lower

    def recorded(*args, **kwargs):
        seen.append(gc.isenabled())
        return lower(*args, **kwargs)

    def traced(params, x):
        seen.append(gc.isenabled())
        return mlp(params, x)

    monkeypatch.setattr(partition, "lower", recorded)
    ins = mlp_inputs()
    assert gc.isenabled()
    pc.jit(traced, MESH, BP_MP).lower(*ins)
    assert seen == [False, False] and gc.isenabled()
    with pytest.raises(pc.PartitionError, match="nearest"):
        pc.jit(traced, MESH, [MP({"params/w3": 0}, axis="batch")]).lower(*ins)
    assert gc.isenabled()
    gc.disable()
    try:
        pc.jit(traced, MESH, BP_MP).lower(*ins)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_place_then_call_moves_nothing():
    m, ins, want = model_and_inputs("mlp")
    host = jax.tree.map(np.asarray, ins)
    pf = pc.jit(m.step, MESH, schedules.schedule("BP+MP", m, ins, mesh=MESH))
    args, kwargs = pf.place(*host)
    assert kwargs == {}
    low = pf.lower(*host)
    for a, s in zip(jax.tree.leaves(args), jax.tree.leaves(low.in_shardings)):
        assert a.sharding == s
    with jax.transfer_guard("disallow"):
        out = pf(*args)  # nothing crosses from the host, nothing is resharded before the program
        with pytest.raises(Exception, match="[Dd]isallowed"):
            pf(*host)  # the guard does catch a call that moves its inputs
    assert_same(out, want)
    new_params, new_momentum = out[0], out[1]  # a training loop: the step's outputs feed the next step
    for a, s in zip(jax.tree.leaves((new_params, new_momentum)), jax.tree.leaves(low.in_shardings[:2])):
        assert a.sharding.is_equivalent_to(s, a.ndim)


def test_a_sub_axis_type_is_placed_on_the_refined_mesh():
    params, x = mlp_inputs()
    pf = pc.jit(mlp, MESH, [MP({"x": 0}, axis="model:(1)2"), MP({"params/w1": 1}, axis="model:(2)2")])
    low = pf.lower(params, x)
    assert str(low.input_type("x")) == "f32[8{model:(1)2}, 16]"
    x_sharding = low.in_shardings[1]
    assert x_sharding.mesh.axis_names == ("batch", "model:(1)2", "model:(2)2")
    assert x_sharding.spec == P("model:(1)2")
    args, _ = pf.place(params, x)
    with jax.transfer_guard("disallow"):
        y = pf(*args)
    assert_same(y, mlp(params, x))


# ------------------------------------------------------------------------------------------------ arguments
def test_static_arguments_are_traced_with_their_values():
    def step(w, x, n, *, lr):
        for _ in range(n):
            w = w - lr * (x.T @ jnp.tanh(x @ w))
        return w

    w, x = np.ones((16, 8), np.float32), np.linspace(0, 1, 128, dtype=np.float32).reshape(8, 16)
    pf = pc.jit(step, MESH, [MP({"x": 0}, axis="batch")], static_argnums=2, static_argnames="lr")
    assert pc.input_paths(pf, w, x, 2, lr=0.1) == ["w", "x"]
    assert pc.input_paths(step, w, x, 2, lr=0.1) == ["w", "x", "n", "lr"]
    np.testing.assert_allclose(pf(w, x, 2, lr=0.1), step(w, x, 2, lr=0.1), rtol=1e-5)
    np.testing.assert_allclose(pf(w, x, n=3, lr=0.1), step(w, x, 3, lr=0.1), rtol=1e-5)
    assert pf.lower(w, x, 2, lr=0.1) is not pf.lower(w, x, 3, lr=0.1)
    assert pf.lower(w, x, 2, lr=0.1) is pf.lower(w, x, n=2, lr=0.1)
    args, kwargs = pf.place(w, x, 2, lr=0.1)
    assert args[2] == 2 and kwargs == {"lr": 0.1}
    with pytest.raises(pc.PartitionError, match=r"static argument 'n' of step must be hashable.*list \[2\]"):
        pf(w, x, [2], lr=0.1)


def test_a_warm_call_is_dispatched_as_jax_jit_dispatches(monkeypatch):
    """A call of the function's positional parameters binds, flattens and looks up nothing in Python once its
    program is lowered: JAX's dispatch finds the program, as it finds a ``jax.jit``'s (its trace lowers a
    program from the arguments' shapes and dtypes: a bfloat16 array's too)."""
    params, x = mlp_inputs()
    pf = pc.jit(mlp, MESH, BP_MP)
    pf(params, x)

    def refused(*args, **kwargs):
        raise AssertionError("a warm call bound or looked up its arguments in Python")

    monkeypatch.setattr(pf.arguments, "bind", refused)
    monkeypatch.setattr(pf, "_lowered", refused)
    assert_same(pf(jax.tree.map(lambda a: 2 * a, params), x), mlp(jax.tree.map(lambda a: 2 * a, params), x))
    monkeypatch.undo()

    def scale(x, s):
        return x * s

    x16 = jnp.arange(32, dtype=jnp.bfloat16).reshape(8, 4)
    np.testing.assert_array_equal(pc.jit(scale, MESH, [MP({"x": 0}, axis="batch")])(x16, 2.0), scale(x16, 2.0))


def test_donated_arguments_are_deleted_and_their_buffers_reused():
    def step(w, g):
        return w - 0.1 * g

    w, g = np.ones((16, 8), np.float32), np.full((16, 8), 2.0, np.float32)
    pf = pc.jit(step, MESH, [MP({"w": 0}, axis="model")], donate_argnums=0)
    (pw, pg), _ = pf.place(w, g)
    out = pf(pw, pg)
    assert pw.is_deleted() and not pg.is_deleted()
    np.testing.assert_allclose(out, step(w, g))
    by_name = pc.jit(step, MESH, [MP({"w": 0}, axis="model")], donate_argnames="w")
    (pw, pg), _ = by_name.place(w, g)
    by_name(pw, pg)
    assert pw.is_deleted() and not pg.is_deleted()


def test_input_paths():
    def f(params, *rest, scale, **extra):
        return params["w"] * scale

    w = np.ones(4, np.float32)
    paths = pc.input_paths(f, {"w": w, "layers": [w, w]}, w, scale=w, shift=w)
    assert paths == ["params/layers/0", "params/layers/1", "params/w", "rest/0", "scale", "extra/shift"]
    m, ins, _ = model_and_inputs("mlp")
    assert pc.input_paths(m.step, *ins)[:2] == ["params/b1", "params/b2"]
    with pytest.raises(pc.PartitionError, match="arguments do not fit"):
        pc.input_paths(mlp, w)


# ------------------------------------------------------------------------------------------------ explanations
def test_explain_says_the_conflicts_of_the_bp_z3_preset():
    m, ins, _ = model_and_inputs("mlp")
    low = pc.jit(m.step, MESH, schedules.schedule("BP+Z3", m, ins, mesh=MESH)).lower(*ins)
    assert low.conflicts and all(not str(c).startswith("Conflict(") for c in low.conflicts)
    assert "tactic 2: conflict at eqn" in str(low.conflicts[0])
    text = low.explain()
    assert text.startswith(f"{len(low.conflicts)} conflicts, no ops without a partitioning rule")
    assert "tactic 1: ManualPartition({'x': 0, 'y': 0}, axis='batch')" in text
    assert "conflict 1: at eqn 0 (dot_general at " in text and "models.py:" in text  # the line of the model
    assert "asked: tactic 2 splits input params/w1 dim 1 on {batch} (its entry 'params/w1': 1)" in text
    assert "earlier tactics win), held by input x dim 0 from tactic 1" in text
    assert "cost:  operand 0 (input x) moves f32[8{batch}, 16] -> f32[8, 16]: all_gather over batch" in text
    assert "received per device" in text and "ms simulated (cpu-host)" in text
    assert "cost:  nothing moves into this op" in text
    assert "ms simulated (tpu-v4)" in low.explain("tpu-v4")


def test_explain_a_constructed_conflict_and_an_input_left_as_it_is():
    def f(a, c, b):
        return jnp.tanh(a @ c) + b

    a, c, b = np.ones((8, 4), np.float32), np.ones((4, 8), np.float32), np.ones((8, 8), np.float32)
    low = pc.jit(f, MESH, [MP({"a": 0}, axis="batch"), MP({"c": 1, "b": 1}, axis="batch")]).lower(a, c, b)
    text = low.explain()
    assert "found applying tactic 2" in text and "test_api.py:" in text  # this file's line
    assert "asked: tactic 2 splits input c dim 1 on {batch} (its entry 'c': 1)" in text
    assert "held by input a dim 0 from tactic 1" in text
    assert "input b, found applying tactic 2" in text and "kept:  the input as it is" in text
    assert "cost:  nothing moves (the input keeps its type)" in text
    (inputs,) = [c for c in low.conflicts if c.eqn < 0]
    assert str(inputs).startswith("tactic 2: input b dim 1 not split on {batch}")


def test_explain_names_an_unsupported_op_and_what_it_moves():
    def f(x):
        return jnp.cumsum(jnp.tanh(x), axis=0)

    x = np.ones((8, 4), np.float32)
    low = pc.jit(f, MESH, [MP({"x": 0}, axis="batch")]).lower(x)
    (u,) = low.unsupported
    assert u.primitive == "cumsum" and str(u).startswith(f"eqn {u.eqn} (cumsum): no factor rule")
    text = low.explain()
    assert f"unsupported: eqn {u.eqn} (cumsum at " in text and "test_api.py:" in text
    assert "has no partitioning rule: it runs whole on every device, its results replicated; operand 0 moves " \
           "f32[8{batch}, 4] -> f32[8, 4]: all_gather over batch" in text


def test_automatic_summary_shows_the_choice_and_why_the_runners_up_lost():
    m, ins, _ = model_and_inputs("mlp")
    budget = 20_000
    low = pc.jit(m.step, MESH, [pc.AutomaticPartition(memory_budget_bytes=budget, max_evals=30)]).lower(*ins)
    res = low.automatic
    assert isinstance(res.stats, SearchStats) and res.stats.evaluations <= 30
    chosen, *others = res.candidates
    assert list(chosen.actions) == res.actions and chosen.step_time_s == res.step_time_s and chosen.fits
    assert others and all(c.fits for c in others[:1])
    for c in others:
        assert (not c.fits and c.peak_bytes > budget) or (c.step_time_s, len(c.actions)) >= (
            res.step_time_s, len(res.actions))
    text = res.summary()
    assert text.startswith(f"chosen: {len(res.tactics)} tactic") and "budget 19.53 KiB" in text
    assert f"runners-up ({len(others)} of {res.stats.evaluations} sets evaluated" in text
    assert "  1. " in text and ("slower by" in text or "as fast" in text)
    if any(not c.fits for c in others):
        assert "over the memory budget (faster, but peak" in text
    if low.conflicts:  # a conflict between the search's actions names the action
        assert f"asked: tactic 1's action 1, {res.tactics[0]}" in low.explain()


# ------------------------------------------------------------------------------------------------ errors
def test_error_messages_name_the_nearest_paths_and_axes():
    m, ins, _ = model_and_inputs("mlp")
    with pytest.raises(pc.PartitionError, match=r"path 'params/w3' matches no input; the nearest input paths are "
                                                 r"params/w2, params/w1.*partir_core.input_paths"):
        pc.jit(m.step, MESH, [MP({"params/w3": 1})]).lower(*ins)
    with pytest.raises(pc.PartitionError, match=r"path 'zzz' matches no input; inputs are params/b1, params/b2, "
                                                 r"params/w1, .*, x, y$"):
        pc.jit(m.step, MESH, [MP({"zzz": 1})]).lower(*ins)

    def many(*xs):
        return sum(xs)

    with pytest.raises(pc.PartitionError, match=r"path 'q' matches no input; inputs are xs/0, xs/1, .*, xs/11, … "
                                                 r"\(14 in all\)$"):
        pc.jit(many, MESH, [MP({"q": 0})]).lower(*[np.ones(4, np.float32)] * 14)
    with pytest.raises(pc.PartitionError, match=r"unknown mesh axis 'modle'; the mesh has axes batch, model; did "
                                                 r"you mean 'model'\?"):
        pc.jit(m.step, MESH, [MP({"x": 0}, axis="modle")])
    with pytest.raises(pc.PartitionError, match=r"needs a mesh \(redist.Mesh, jax.sharding.Mesh or AbstractMesh\), "
                                                 r"got dict"):
        pc.jit(mlp, {"batch": 2}, [])
    with pytest.raises(pc.PartitionError, match=r"static_argnames names 'k', which is no parameter of mlp"):
        pc.jit(mlp, MESH, [], static_argnames="k")
    with pytest.raises(pc.PartitionError, match=r"argument 0 is both static and donated"):
        pc.jit(mlp, MESH, [], static_argnums=0, donate_argnums=0)
    with pytest.raises(pc.PartitionError, match=r"static_argnums must be an argument number"):
        pc.jit(mlp, MESH, [], static_argnums="x")
    with pytest.raises(pc.PartitionError, match=r"static_argnums names argument 5 of mlp, which has 2 positional"):
        pc.jit(mlp, MESH, [], static_argnums=5)(*mlp_inputs())
