"""Creating pending sums (docs/spec.md §3): a destination may be partial over axes the source is not;
each group's summands must add up to the value. Plans, their bounds and memory, the numpy and JAX backends,
and the verifier's summand-bijection queries (proofs and counterexamples)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from proofs.common import oracle
from redist import program as P
from redist import steps as S
from redist.bounds import lower_bound_bytes
from redist.data import poisoned_source, shard, unshard
from redist.errors import ShardingError
from redist.execute import execute
from redist.mesh import Mesh
from redist.synthesis import synthesize
from redist.types import ShardingType
from redist.verify import verify, verify_program
from tests.redist.strategies import meshes, type_pairs


def T(text, mesh):
    return ShardingType.parse(text, mesh)


# (mesh, src, dst, step kinds, bytes received): Shardy's replicated_and_sharded_to_unreduced and friends
NAMED = [
    ("x=4", "f32[32{x}, 32]", "f32[32, 32] partial{x}", ["shard_to_partial"], 0),
    ("x=2,y=4", "f32[16{y}, 8] partial{x}", "f32[16, 8] partial{x,y}", ["shard_to_partial"], 0),
    ("x=2,y=4", "f32[16, 8]", "f32[16, 8] partial{y:(1)2}", ["replicate_to_partial"], 0),   # onto a sub-axis
    ("x=2,y=4", "f32[16{x}, 8]", "f32[16, 8{y}] partial{x}", ["all_slice", "shard_to_partial"], 0),
    ("x=2,y=4", "f32[16, 8]", "f32[16, 8] partial{x,y}", ["replicate_to_partial"], 0),
    # reduce x, then create y: the all-reduce runs on the sliced buffer, the smallest it can
    ("x=2,y=4", "f32[8] partial{x}", "f32[8] partial{y}", ["all_slice", "all_reduce", "shard_to_partial"], 8),
    # uneven blocks nest in the whole dim: each device's rows go where the dim holds them (an exchange to every
    # device, then replicate_to_partial, would receive 40 B)
    ("x=4", "i32[5{x}, 2]", "i32[5, 2] partial{x}", ["shard_to_partial"], 0),
    ("x=2,y=2", "f32[7{x,y}, 3]", "f32[7, 3] partial{x,y}", ["shard_to_partial"], 0),
    ("x=2,y=2", "f32[7{x}, 3{y}]", "f32[7, 3{y}] partial{x}", ["shard_to_partial"], 0),
]


def _mesh(text):
    return Mesh.parse(text)


@pytest.mark.parametrize("mesh,src,dst,kinds,nbytes", NAMED)
def test_named_creations_are_planned_at_the_bound_and_proved(mesh, src, dst, kinds, nbytes):
    m = _mesh(mesh)
    s, d = T(src, m), T(dst, m)
    plan = synthesize(s, d)
    assert [step.kind for step in plan.steps] == kinds, plan
    assert plan.bytes_received == nbytes == lower_bound_bytes(s, d)
    assert plan.peak_bytes <= max(s.local_bytes, d.local_bytes)
    v = verify(plan)
    assert v.ok, (v.reason, v.counterexample)
    ok, why = oracle(plan.program, s, d, seed=1)
    assert ok, why


def test_a_destination_partial_over_axes_the_source_is_not_is_a_target():
    """Every pair of layouts is a target (docs/spec.md §3), one that creates pending sums included."""
    m = _mesh("x=2,y=2")
    assert lower_bound_bytes(T("f32[8] partial{y}", m), T("f32[8] partial{x}", m)) >= 0


def test_the_created_summands_are_zeros_except_one_per_group():
    """replicate_to_partial keeps the block on rank 0 of each group and zeros elsewhere; shard_to_partial puts
    each member's block in its own chunk of a zero buffer: the sums are the value, and nothing else is added."""
    m = _mesh("x=2,y=2")
    value = np.arange(16, dtype=np.float32).reshape(4, 4) + 1

    rep = synthesize(T("f32[4, 4]", m), T("f32[4, 4] partial{y}", m))
    out = execute(rep, shard(rep.src, value))
    assert [bool(b.any()) for b in out] == [True, False, True, False]  # devices (x, y): y=0 keeps the block
    np.testing.assert_array_equal(unshard(rep.dst, out), value)
    emb = synthesize(T("f32[4{y}, 4]", m), T("f32[4, 4] partial{y}", m))
    out = execute(emb, shard(emb.src, value))
    np.testing.assert_array_equal(out[0][:2], value[:2])
    assert not out[0][2:].any() and not out[1][:2].any()
    np.testing.assert_array_equal(out[1][2:], value[2:])


@st.composite
def creating_pairs(draw, max_devices=16, uneven=0.3):
    """Pairs whose destination creates pending sums (dst.partial not a subset of src.partial)."""
    mesh = draw(meshes(max_axes=3, max_devices=max_devices, min_devices=2))
    src, dst = draw(type_pairs(mesh=mesh, max_rank=3, sub_axes=0.25, create=1.0, uneven=uneven, padded=True))
    assume(not set(dst.partial) <= set(src.partial))
    return src, dst


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(creating_pairs(), st.integers(0, 2**16))
def test_random_creations_are_proved_memory_bounded_and_run_on_numpy(pair, seed):
    src, dst = pair
    plan = synthesize(src, dst)
    assert plan.dst == dst
    assert plan.peak_bytes <= max(src.local_bytes, dst.local_bytes)
    assert plan.bytes_received >= lower_bound_bytes(src, dst)
    v = verify(plan)
    assert v.ok, (str(plan), v.reason, v.counterexample)
    ok, why = oracle(plan.program, src, dst, seed=seed)
    assert ok, why


# ---------------------------------------------------------------------------------------------- the verifier
def _program(mesh, src, instructions):
    shapes = [src.local_shape]
    for ins in instructions:
        shapes.append(P.shape_after(ins, shapes[-1], mesh))
    return P.Program(mesh, src.np_dtype, tuple(instructions), tuple(shapes))


M = Mesh({"x": 2, "y": 2})
REPLICATED = T("f32[4, 6]", M)
SHARDED = T("f32[4{x}, 6]", M)
PARTIAL = T("f32[4, 6] partial{x}", M)

# (what, source, instructions, claim, words of the refutation)
WRONG = [
    ("no KeepRoot: every member keeps the block, the sum counts it twice",
     REPLICATED, [], "f32[4, 6] partial{x}", "summand"),
    ("KeepRoot over y, claimed over x", REPLICATED, [P.KeepRoot(("y",))], "f32[4, 6] partial{x}", None),
    ("KeepRoot over x, claimed over x and y", REPLICATED, [P.KeepRoot(("x",))], "f32[4, 6] partial{x,y}", "summand"),
    ("a gather where the chunk should be embedded", SHARDED, [P.AllGather(0, ("x",))], "f32[4, 6] partial{x}",
     "summand"),
    ("the chunk embedded along the wrong dim", T("f32[4{x}, 2]", M), [P.EmbedChunk(1, ("x",)), P.Reshape((4, 2))],
     "f32[4, 2] partial{x}", None),
    ("the chunk embedded over y, claimed over x", SHARDED, [P.EmbedChunk(0, ("y",))], "f32[4, 6] partial{x}", None),
    ("a source summand zeroed: KeepRoot on a partial source", PARTIAL, [P.KeepRoot(("x",))],
     "f32[4, 6] partial{x}", "lacks source summand"),
]


@pytest.mark.parametrize("what,src,instructions,claim,words", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_creating_programs_are_refuted_with_a_counterexample(what, src, instructions, claim, words):
    try:
        program = _program(M, src, instructions)
    except Exception as e:  # noqa: BLE001 - a claim whose shape cannot even be derived is not this test's case
        pytest.fail(f"ill-formed test case {what}: {e}")
    dst = T(claim, M)
    v = verify_program(program, src, dst)
    assert v.status == "refuted", (what, v.reason)
    assert v.counterexample is not None
    if words:
        assert words in v.reason, v.reason
    ok, _ = oracle(program, src, dst, seed=3)
    assert not ok, f"{what}: the numpy backend finds it right, so the refutation is a false alarm"


@pytest.mark.parametrize("src,instructions,claim", [
    (REPLICATED, [P.KeepRoot(("x",))], "f32[4, 6] partial{x}"),
    (REPLICATED, [P.KeepRoot(("y", "x"))], "f32[4, 6] partial{x,y}"),
    (SHARDED, [P.EmbedChunk(0, ("x",))], "f32[4, 6] partial{x}"),
    (PARTIAL, [P.KeepRoot(("y",))], "f32[4, 6] partial{x,y}"),
])
def test_right_creating_programs_by_hand_are_proved(src, instructions, claim):
    program = _program(M, src, instructions)
    dst = T(claim, M)
    v = verify_program(program, src, dst)
    assert v.ok, (v.reason, v.counterexample)
    assert oracle(program, src, dst, seed=4)[0]


# ---------------------------------------------------------------------------------------------- JAX
def test_creations_agree_on_jax():
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)")

    rng = np.random.default_rng(0)
    cases = [(m, a, b) for m, a, b, _, _ in NAMED] + [
        ("x=4", "i32[5{x}, 2]", "i32[5, 2] partial{x}"),
        ("x=2,y=2", "bf16[6{x}, 4] partial{y}", "bf16[6, 4{y}] partial{x}"),
        ("x=2,y=4", "f32[8, 4{y}]", "f32[8{x}, 4] partial{y}"),
    ]
    for mesh, a, b in cases:
        m = _mesh(mesh)
        src, dst = T(a, m), T(b, m)
        plan = synthesize(src, dst)
        value, shards = poisoned_source(src, rng)
        want = execute(plan, shards)
        with jax.transfer_guard("disallow"):
            got = execute(plan, shards, backend="jax")
        for w, g in zip(want, got):
            assert g.dtype == dst.np_dtype and np.array_equal(g, w, equal_nan=True), (a, b, plan.program)
        np.testing.assert_array_equal(unshard(dst, got), value)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(creating_pairs(max_devices=8), st.integers(0, 2**16))
def test_random_creations_agree_on_jax(pair, seed):
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 JAX devices (tests/conftest.py sets XLA_FLAGS)")

    src, dst = pair
    plan = synthesize(src, dst)
    value, shards = poisoned_source(src, np.random.default_rng(seed))
    want = execute(plan, shards)
    got = execute(plan, shards, backend="jax")
    for w, g in zip(want, got):
        assert np.array_equal(g, w, equal_nan=True), plan.program
    np.testing.assert_array_equal(unshard(dst, got), value)


# ---------------------------------------------------------------------------------------------- reduction kinds
@pytest.mark.parametrize("src,dst", [
    ("f32[4, 6]", "f32[4, 6] partial(max){x}"),
    ("f32[4{x}, 6]", "f32[4, 6] partial(min){x}"),
    ("f32[4, 6] partial(max){x}", "f32[4, 6] partial(max){x,y}"),
    ("f32[4, 6] partial(prod){y}", "f32[4, 6] partial(prod){x}"),
])
def test_only_pending_sums_are_created(src, dst):
    """Creating summands writes zeros, the identity of a sum only: a destination that creates a pending max,
    min or product is refused, by the planner and by the step that would create it."""
    s, d = T(src, M), T(dst, M)
    with pytest.raises(ShardingError, match="only pending sums can be created"):
        synthesize(s, d)
    with pytest.raises(ShardingError, match="only pending sums can be created"):
        lower_bound_bytes(s, d)
    if s.partial:
        with pytest.raises(ShardingError, match="identity"):
            S.ReplicateToPartial(("y",) if "x" in s.partial else ("x",)).apply(s)


def test_a_created_max_is_refuted():
    """KeepRoot's zeros are no identity of a max: the claim is refuted, with a counterexample."""
    program = _program(M, REPLICATED, [P.KeepRoot(("x",))])
    v = verify_program(program, REPLICATED, T("f32[4, 6] partial(max){x}", M))
    assert v.status == "refuted" and "identity of a sum only" in v.reason
    assert v.counterexample is not None


def test_created_axes_may_go_to_another_dim_than_the_sources():
    """``x`` cannot join ``y`` in dim 0 (4 rows over 16 devices), so it goes to dim 1: one permute of the source's
    blocks, then ``shard_to_partial``, receiving one block (16 B) where gathering over ``x`` first and replicating
    received 64 B."""
    m = _mesh("x=4,y=4")
    s, d = T("f32[4{x}, 16{y}]", m), T("f32[4{y}, 16] partial{x}", m)
    plan = synthesize(s, d)
    assert [step.kind for step in plan.steps] == ["permute", "shard_to_partial"], plan
    assert plan.bytes_received == s.local_bytes == 16
    assert verify(plan).ok
    ok, why = oracle(plan.program, s, d, seed=1)
    assert ok, why
