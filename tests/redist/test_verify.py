"""The Z3 verifier: proves synthesized plans, refutes false claims and mutants with counterexamples."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proofs.common import oracle
from redist import program as P
from redist import steps as S
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.plan import Plan
from redist.synthesis import synthesize
from redist.types import ShardingType
from redist.verify import Verdict, verify, verify_program
from redist.verify.encoding import read_axis
from redist.verify.verdict import Refuted
from tests import ROOT
from tests.redist.strategies import layouts, meshes, type_pairs


def T(text, mesh):
    return ShardingType.parse(text, mesh)


@st.composite
def pairs(draw):
    """Pairs on meshes of up to 16 devices, with sub-axes and partial sources."""
    return draw(type_pairs(mesh=draw(meshes(max_devices=16)), max_rank=3, sub_axes=0.2))


def _synth(src, dst):
    try:
        return synthesize(src, dst)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"synthesize failed (reported separately): {e}")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(pairs())
def test_random_plans_are_proved(case):
    src, dst = case
    plan = _synth(src, dst)
    v = verify(plan)
    assert isinstance(v, Verdict)
    assert v.ok, (str(plan), v.reason, v.counterexample)
    assert v.counterexample is None and v.seconds >= 0


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(pairs(), st.data(), st.integers(0, 2**32 - 1))
def test_random_claims_agree_with_numpy(case, data, seed):
    """A random claim with the same shape: verify's verdict equals what the numpy backend shows."""
    src, dst = case
    plan = _synth(src, dst)
    try:
        claim = dst.replace(dims=data.draw(layouts(dst.mesh, dst.rank, sub_axes=0.2))[0])
    except ShardingError:  # the claim puts one of the destination's partial axes in a dim
        return
    v = verify(plan, claim)
    ok, why = oracle(plan.program, src, claim, seed=seed)
    assert v.ok == ok, (str(plan), str(claim), v.reason, why)
    if not v.ok:
        assert v.counterexample is not None or "shape" in v.reason


def test_sub_axis_plan():
    mesh = Mesh({"x": 2, "y": 4})
    src, dst = T("f32[4{x}]", mesh), T("f32[4{y}]", mesh)
    plan = synthesize(src, dst)
    assert any("y:(" in a for ins in plan.program.instructions for a in getattr(ins, "axes", ()))
    v = verify(plan)
    assert v.ok, v.reason


def test_wrong_claim_is_refuted_with_counterexample():
    mesh = Mesh({"x": 2, "y": 4})
    src, dst = T("f32[8{x}, 16{y}]", mesh), T("f32[8{y}, 16{x}]", mesh)
    plan = synthesize(src, dst)
    assert verify(plan).ok
    claim = T("f32[8{y:(2)2,y:(1)2}, 16{x}]", mesh)  # same local shape, blocks in another order
    v = verify(plan, claim)
    assert not v.ok
    cx = v.counterexample
    assert set(cx) >= {"device", "coords", "index", "holds", "expected"}
    assert cx["holds"]["global_index"] != cx["expected"]["global_index"]
    # The counterexample is real: on that device and index the result holds what it says.
    import numpy as np

    from redist.backends.numpy_backend import run
    from redist.data import shard

    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    out = run(plan.program, shard(src, x))
    got = out[cx["device"]][tuple(cx["index"])]
    assert got == x[tuple(cx["holds"]["global_index"])]
    assert got != x[tuple(cx["expected"]["global_index"])]
    # A claim given as text works too, and a claim with another local shape is refuted on shapes.
    assert not verify(plan, "f32[8{x}, 16{y}]").ok
    assert "shape" in verify(plan, "f32[8, 16{x}]").reason


def test_partial_types():
    mesh = Mesh({"x": 2, "y": 3, "z": 2})
    cases = [("f32[6, 4] partial{x,y}", "f32[6{y}, 4] partial{x}"),
             ("f32[6, 4] partial{x,y,z}", "f32[6{y}, 4{x,z}]"),
             ("f32[6{y}, 4] partial{z}", "f32[6, 4{z}]"),
             ("f32[6{y}, 4{x}] partial{z}", "f32[6, 4{x}] partial{z}")]
    for a, b in cases:
        plan = synthesize(T(a, mesh), T(b, mesh))
        v = verify(plan)
        assert v.ok, (a, b, v.reason)
    # Claiming the sum is done when it is not, or claiming it is still pending when it is done: refuted.
    plan = synthesize(T("f32[6, 4] partial{x,y}", mesh), T("f32[6{y}, 4] partial{x}", mesh))
    v = verify(plan, T("f32[6{y}, 4]", mesh))
    assert not v.ok and "summand" in v.reason
    plan = synthesize(T("f32[6, 4] partial{x}", mesh), T("f32[6, 4{x}]", mesh))
    v = verify(plan, T("f32[6, 4{z}] partial{x}", mesh))
    assert not v.ok


def test_mixing_summands_of_different_groups_is_refuted():
    """A permute that takes the two summands of a group sum from different partial groups is wrong for
    summands that only sum right within their group (docs/spec.md §4)."""
    mesh = Mesh({"x": 2, "y": 2})
    src = T("f32[4] partial{x}", mesh)
    # device ids: (x, y) -> 2x + y. Swap device 2 and 3: group y=0 now holds summands from y=0 and y=1.
    prog = P.Program(mesh, src.np_dtype, (P.CollectivePermute((0, 1, 3, 2)),), ((4,), (4,)))
    v = verify_program(prog, src, src)
    assert not v.ok and "groups" in v.reason
    assert oracle(prog, src, src)[0] is False
    # Swapping whole groups is fine.
    prog = P.Program(mesh, src.np_dtype, (P.CollectivePermute((1, 0, 3, 2)),), ((4,), (4,)))
    assert verify_program(prog, src, src).ok and oracle(prog, src, src)[0]


def _mut(plan, instructions, shapes=None):
    return P.Program(plan.program.mesh, plan.program.dtype, tuple(instructions),
                     tuple(shapes or plan.program.shapes))


def test_mutants_are_killed():
    mesh = Mesh({"x": 2, "y": 4})
    src, dst = T("f32[8{x}, 16{y}]", mesh), T("f32[8{y}, 16{x}]", mesh)
    # The collectives' plan (synthesize takes one exchange here, which receives fewer bytes).
    plan = Plan.from_steps(src, (S.AllToAll(1, 0, ("y:(2)2",)), S.Permute((("y",), ("x",)))))
    assert plan.dst == dst
    ins = list(plan.program.instructions)
    a2a = next(i for i, x in enumerate(ins) if isinstance(x, P.AllToAll))
    perm = next(i for i, x in enumerate(ins) if isinstance(x, P.CollectivePermute))
    sources = list(ins[perm].source_table(mesh))
    a, b = next((a, b) for a in range(8) for b in range(a + 1, 8) if sources[a] != a or sources[b] != b)
    sources[a], sources[b] = sources[b], sources[a]
    mutants = {
        "wrong permutation pair": ins[:perm] + [P.CollectivePermute(tuple(sources))] + ins[perm + 1:],
        "wrong axis": ins[:a2a] + [dataclasses.replace(ins[a2a], axes=("x",))] + ins[a2a + 1:],
        "duplicate": ins + [ins[-1]],
    }
    for name, new in mutants.items():
        from proofs.mutation import derive_shapes

        shapes = derive_shapes(plan.program, new) or None
        prog = _mut(plan, new, shapes if shapes else (tuple(plan.program.shapes) + (plan.program.shapes[-1],))[:len(new) + 1])
        v = verify_program(prog, src, dst)
        assert not v.ok, name
        assert oracle(prog, src, dst)[0] is False, name
    # Swapped group member order on a reduce over two axes.
    plan = synthesize(T("f32[8] partial{x,y}", mesh), T("f32[8{x,y}]", mesh))
    (rs,) = plan.program.instructions
    prog = _mut(plan, [dataclasses.replace(rs, axes=rs.axes[::-1])])
    assert not verify_program(prog, plan.src, plan.dst).ok
    assert oracle(prog, plan.src, plan.dst)[0] is False
    # Dropping the reduction.
    prog = P.Program(mesh, plan.program.dtype, (P.Slice(0, rs.axes),), plan.program.shapes)
    v = verify_program(prog, plan.src, plan.dst)
    assert not v.ok and "summand" in v.reason


def test_peak_and_bytes_are_checked():
    mesh = Mesh({"x": 2, "y": 4})
    plan = synthesize(T("f32[8{x}, 16{y}]", mesh), T("f32[8, 16]", mesh))
    v = verify(plan)
    assert v.ok and v.details["peak_bytes"] == plan.peak_bytes == 8 * 16 * 4
    assert v.details["bytes_received"] == plan.bytes_received

    assert not verify(_lying(plan, peak_bytes=plan.peak_bytes - 4)).ok
    assert "peak_bytes" in verify(_lying(plan, peak_bytes=plan.peak_bytes - 4)).reason
    r = verify(_lying(plan, bytes_received=plan.bytes_received - 1))
    assert r.status == "refuted" and "bytes_received" in r.reason


def _lying(plan, **claims):
    """``plan`` whose reported costs are ``claims`` (a Plan subclass: verify takes Plans only)."""
    lying = type("LyingPlan", (Plan,), {k: property(lambda self, v=v: v) for k, v in claims.items()})
    return lying(plan.steps, plan.types)


def test_scalar_and_trivial_plans():
    mesh = Mesh({"x": 3})
    for a, b in [("f32[]", "f32[]"), ("f32[] partial{x}", "f32[]"), ("f32[6]", "f32[6]"), ("f32[0{x}]", "f32[0]")]:
        plan = synthesize(T(a, mesh), T(b, mesh))
        assert verify(plan).ok, (a, b, verify(plan).reason)


def test_large_mesh_rank4_is_fast():
    mesh = Mesh({"a": 4, "b": 4, "c": 2, "d": 2})
    plan = synthesize(T("f32[64{a}, 32{b}, 16{c}, 8{d}]", mesh), T("f32[64{d,c}, 32{a}, 16, 8{b}]", mesh))
    v = verify(plan)
    assert v.ok and v.seconds < 5


# ---------------------------------------------------------------------------- uneven dims
def test_uneven_plans_are_proved_and_padding_is_never_data():
    mesh = Mesh({"x": 2, "y": 2})
    for a, b in [("f32[5{x}, 3]", "f32[5{y}, 3{x}]"), ("f32[7{x,y}]", "f32[7{y,x}]"), ("f32[5]", "f32[5{x,y}]"),
                 ("f32[5{x}]", "f32[5]"), ("f32[9, 3] partial{x}", "f32[9{y}, 3]"),
                 ("f32[9{y}, 3] partial{x}", "f32[9, 3{y}] partial{x}")]:
        plan = synthesize(T(a, mesh), T(b, mesh))
        v = verify(plan)
        assert v.ok, (a, b, v.reason)
    # f32[3{x}]: device x=0 holds [0, 2); device x=1 holds [2, 3) and one padding element. An exchange that
    # keeps everything but fills index 1 of the devices at x=0 from index 1 of those at x=1 (padding) reads
    # padding as data.
    from redist.blocks import Segment

    src = T("f32[3{x}]", mesh)

    def exchange(*segments):
        return P.Program(mesh, src.np_dtype, (P.Exchange((2,), (P.ExchangeDim(("x",), ("x",), segments),)),),
                         ((2,), (2,)))

    prog = exchange(Segment(0, 0, 0, 0, 1), Segment(0, 1, 1, 1, 1), Segment(1, 1, 0, 0, 2))
    v = verify_program(prog, src, src)
    assert not v.ok and "padding" in v.reason, v.reason
    assert v.counterexample["coords"]["x"] == 0 and v.counterexample["index"] == (1,)
    assert oracle(prog, src, src)[0] is False
    # Copying data into padding is fine: nobody reads it.
    prog = exchange(Segment(0, 0, 0, 0, 2), Segment(1, 1, 0, 0, 1), Segment(1, 0, 1, 1, 1))
    assert verify_program(prog, src, src).ok and oracle(prog, src, src)[0]


def test_exchange_mutants_are_refuted():
    """Mutants of an exchange's tables: a segment dropped (unwritten), read from another source block (a
    wrong class of senders), one more (overlapping), too long (off the buffer)."""
    mesh = Mesh({"x": 2, "y": 2})
    src, dst = T("f32[5{x}, 3]", mesh), T("f32[5{y}, 3{x}]", mesh)
    plan = synthesize(src, dst)
    (ex,) = plan.program.instructions
    assert isinstance(ex, P.Exchange)
    dim = next(i for i, x in enumerate(ex.dims) if len(x.segments) > 1)
    segs = ex.dims[dim].segments
    seg = next(g for g in segs if g.size)

    def with_segments(new):
        dims = list(ex.dims)
        dims[dim] = dataclasses.replace(dims[dim], segments=tuple(new))
        return _mut(plan, [dataclasses.replace(ex, dims=tuple(dims))])

    dropped = with_segments([g for g in segs if g != seg])
    v = verify_program(dropped, src, dst)
    assert not v.ok and "never written" in v.reason
    k_in = mesh.group_size(ex.dims[dim].source_axes)
    wrong_source = with_segments([g._replace(source_block=(g.source_block + 1) % k_in) if g == seg else g
                                  for g in segs])
    assert not verify_program(wrong_source, src, dst).ok
    assert oracle(wrong_source, src, dst)[0] is False
    overlapping = with_segments(list(segs) + [seg])
    assert "overlap" in verify_program(overlapping, src, dst).reason
    too_big = with_segments([g._replace(size=g.size + 9) if g == seg else g for g in segs])
    assert "does not fit" in verify_program(too_big, src, dst).reason


# ---------------------------------------------------------------------------- claims differ in a field
def _classic():
    mesh = Mesh({"x": 4, "y": 2})
    plan = synthesize(T("f32[16{y}, 16, 16{x}]", mesh), T("f32[16, 16{x,y}, 16]", mesh))
    return mesh, plan


def _on(t, mesh, dtype=None, shape=None):
    return ShardingType(mesh, t.shape if shape is None else shape, dtype or t.dtype, t.dims, t.partial)


@pytest.mark.parametrize("dtype", ["f64", "i32", "u32", "bf16", "f16", "i8", "bool"])
def test_claim_with_another_dtype_is_refuted(dtype):
    """A claim of another dtype than the plan's (f64, i32, bf16, ... for an f32 plan) is refuted, not proved."""
    _, plan = _classic()
    v = verify(plan, _on(plan.dst, plan.dst.mesh, dtype=dtype))
    assert v.status == "refuted" and not v.ok
    assert v.counterexample["holds"] == {"dtype": "f32"} and v.counterexample["expected"] == {"dtype": dtype}
    assert "dtype" in v.reason


def test_claim_on_the_mesh_with_axes_in_another_order_is_refuted_with_a_real_counterexample():
    """``Mesh({"y": 2, "x": 4})`` for a plan on ``x=4,y=2`` is refuted, not proved: device 1 then holds another
    block than the claim says."""
    mesh, plan = _classic()
    claim = _on(plan.dst, Mesh({"y": 2, "x": 4}))
    v = verify(plan, claim)
    assert v.status == "refuted"
    cx = v.counterexample
    assert cx["device"] == 1 and cx["holds"]["coords"] == {"x": 0, "y": 1} and cx["expected"]["coords"] == {"y": 0, "x": 1}
    # The counterexample is real: device 1's result is not what the claim puts on device 1.
    import numpy as np

    from redist.backends.numpy_backend import run
    from redist.data import shard

    x = np.arange(16 ** 3, dtype=np.float32).reshape(16, 16, 16)
    out = run(plan.program, shard(plan.src, x))
    assert not np.array_equal(out[1], shard(claim, x)[1])
    assert oracle(plan.program, plan.src, claim)[0] is False


@pytest.mark.parametrize("mesh_text", ["x=2,y=4", "x=8,y=1", "x=1,y=8", "a=4,y=2", "y=2,x=4", "x=4,y=2,z=1"])
def test_claim_on_another_arrangement_of_the_same_devices_is_refuted(mesh_text):
    """Other axis sizes, names or order (or an extra axis of size 1) on the same 8 devices: another mesh."""
    _, plan = _classic()
    mesh = Mesh.parse(mesh_text)
    dims = tuple(tuple(a for a in d if a in mesh.names) for d in plan.dst.dims)
    claim = ShardingType(mesh, plan.dst.shape, "f32", dims)
    v = verify(plan, claim)
    assert v.status == "refuted" and "mesh" in v.reason
    assert set(v.counterexample) >= {"device", "coords", "index", "holds", "expected"}
    assert v.counterexample["holds"]["mesh"] != v.counterexample["expected"]["mesh"]


def test_replicated_claim_on_a_reordered_mesh_is_refuted_too():
    """Every device holds everything either way, but the type is on another mesh (docs/spec.md §1: meshes are equal
    when axes, sizes and order agree): refuted, and the oracle agrees."""
    mesh = Mesh({"x": 4, "y": 2})
    plan = synthesize(T("f32[8{x}]", mesh), T("f32[8]", mesh))
    claim = T("f32[8]", Mesh({"y": 2, "x": 4}))
    v = verify(plan, claim)
    assert v.status == "refuted" and v.counterexample["device"] == 1
    assert oracle(plan.program, plan.src, claim)[0] is False


def test_claim_with_another_shape_is_refuted_with_a_counterexample():
    _, plan = _classic()
    v = verify(plan, _on(plan.dst, plan.dst.mesh, shape=(16, 16, 17)))
    assert v.status == "refuted"
    assert v.counterexample["holds"] == {"shape": (16, 16, 16)} and v.counterexample["expected"] == {"shape": (16, 16, 17)}


def test_program_on_another_mesh_or_dtype_than_its_source_is_refuted():
    """The program's own mesh and dtype are fields too: they must be the source type's."""
    mesh, plan = _classic()
    prog = plan.program
    reordered = dataclasses.replace(prog, mesh=Mesh({"y": 2, "x": 4}))
    v = verify_program(reordered, plan.src, plan.dst)
    assert v.status == "refuted" and "mesh" in v.reason and v.counterexample["device"] == 1
    import numpy as np

    wider = dataclasses.replace(prog, dtype=np.dtype(np.float64))
    v = verify_program(wider, plan.src, plan.dst)
    assert v.status == "refuted" and v.counterexample["holds"] == {"dtype": "float64"}


def test_partial_claims_that_differ_are_refuted():
    mesh = Mesh({"x": 2, "y": 3, "z": 2})
    plan = synthesize(T("f32[6, 4] partial{x,y}", mesh), T("f32[6{y}, 4] partial{x}", mesh))
    for claim in ["f32[6{y}, 4] partial{z}", "f32[6{y}, 4] partial{x,z}", "f32[6{y}, 4]"]:
        v = verify(plan, claim)
        assert v.status == "refuted" and v.counterexample is not None, claim


# ---------------------------------------------------------------------------- status and time
def test_verdict_status_tells_proved_refuted_and_undecided_apart():
    _, plan = _classic()
    proved, refuted = verify(plan), verify(plan, "f32[16, 16{y,x}, 16]")
    assert (proved.status, proved.ok, bool(proved)) == ("proved", True, True)
    assert (refuted.status, refuted.ok, bool(refuted)) == ("refuted", False, False)
    with pytest.raises(ShardingError, match="status"):
        Verdict("maybe", "")


def test_a_spent_deadline_is_undecided_not_refuted():
    _, plan = _classic()
    v = verify(plan, timeout_s=1e-9)
    assert v.status == "undecided" and not v.ok and v.counterexample is None
    assert "timeout_s" in v.reason


def _random_permutation_and_back(mesh, seed=0):
    """A program that permutes the devices at random and back: true, but its tables have no structure."""
    rng = random.Random(seed)
    there = list(range(mesh.size))
    rng.shuffle(there)
    back = [0] * mesh.size
    for d, s in enumerate(there):
        back[s] = d
    # device d takes from there[d], then from back[d]: the element of device there[back[d]] = d.
    src = ShardingType(mesh, (mesh.size,), "f32", (mesh.names,))
    prog = P.Program(mesh, src.np_dtype, (P.CollectivePermute(tuple(there)), P.CollectivePermute(tuple(back))),
                     ((1,), (1,), (1,)))
    return prog, src


def test_timeout_bounds_the_wall_time_of_a_hard_query():
    """``timeout_s`` bounds the whole call: building the constraints counts against it, and Z3 gets only what
    is left of it, not the whole budget after them. This query is not decided in 120 s."""
    import time

    prog, src = _random_permutation_and_back(Mesh({"x": 256, "y": 256}))
    t0 = time.perf_counter()
    v = verify_program(prog, src, src, timeout_s=2)
    wall = time.perf_counter() - t0
    assert v.status == "undecided" and "timeout_s=2" in v.reason
    assert wall < 20, wall  # about T = 2 s, with a margin for a busy machine
    # The watchdog that interrupted Z3 at the deadline leaves the next call alone.
    assert verify(_classic()[1]).status == "proved"


@pytest.mark.parametrize("mesh_text", ["x=8,y=4", "x=2,y=3,z=4"])
def test_permute_tables_are_exact(mesh_text):
    """A random permutation and back is proved; the permutation alone is refuted, and the oracle agrees."""
    prog, src = _random_permutation_and_back(Mesh.parse(mesh_text), seed=3)
    assert verify_program(prog, src, src).status == "proved" and oracle(prog, src, src)[0]
    there = dataclasses.replace(prog, instructions=prog.instructions[:1], shapes=prog.shapes[:2])
    v = verify_program(there, src, src)
    assert v.status == "refuted" and oracle(there, src, src)[0] is False
    cx = v.counterexample
    assert cx["holds"]["from_device"] == prog.instructions[0].sources[cx["device"]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-50, 50), min_size=1, max_size=40), st.booleans())
def test_the_table_encoding_is_the_table(values, runs):
    """``lookup`` is exact: at every key its term evaluates to the table's entry (here with affine runs)."""
    import z3

    from redist.verify.solver import Deadline
    from redist.verify.tables import lookup

    if runs:  # stretches of an affine function, as a permute that swaps axes has
        values = [values[i // 5] * 3 + (i % 5) * values[-1] for i in range(len(values) * 2)]
    key = z3.Int("key")
    term = lookup(key, values, Deadline(None, 0.0), "test")
    for k, want in enumerate(values):
        assert z3.simplify(z3.substitute(term, (key, z3.IntVal(k)))).as_long() == want


def test_a_transpose_table_has_one_leaf_per_row():
    """The memory fix: the source coordinates of a permute that swaps two axes of 256 devices each encode in
    256 leaves, not as a chain of 65,536."""
    import z3

    from redist.verify.solver import Deadline
    from redist.verify.tables import lookup

    n = 256
    sources = [(d % n) * n + d // n for d in range(n * n)]  # device (x, y) takes from device (y, x)

    def leaves(e):
        return sum(leaves(c) for c in e.children()[1:]) if z3.is_app_of(e, z3.Z3_OP_ITE) else 1

    for coord in (lambda s: s // n, lambda s: s % n):
        term = lookup(z3.Int("key"), [coord(s) for s in sources], Deadline(None, 0.0), "test")
        assert leaves(term) == n


# ---------------------------------------------------------------------------- misuse
def test_verify_misuse_raises_sharding_error_naming_the_argument():
    """Garbage arguments raise ShardingError naming the argument, not AttributeError/TypeError from inside."""
    mesh, plan = _classic()
    bad = [
        (lambda: verify("plan"), "plan"),
        (lambda: verify(None), "plan"),
        (lambda: verify(plan, 42), "dst"),
        (lambda: verify(plan, T("f32[16, 16{x}, 16]", Mesh({"x": 4}))), "dst"),
        (lambda: verify(plan, "f32[16, 16{q}, 16]"), "q"),
        (lambda: verify(plan, timeout_s="x"), "timeout_s"),
        (lambda: verify(plan, timeout_s=-1), "timeout_s"),
        (lambda: verify(plan, timeout_s=0), "timeout_s"),
        (lambda: verify(plan, timeout_s=float("nan")), "timeout_s"),
        (lambda: verify(plan, timeout_s=True), "timeout_s"),
        (lambda: verify(plan, check_costs="yes"), "check_costs"),
        (lambda: verify_program(plan, plan.src, plan.dst), "program"),
        (lambda: verify_program(plan.program, "f32[16]", plan.dst), "src"),
        (lambda: verify_program(dataclasses.replace(plan.program, shapes=None), plan.src, plan.dst), "shapes"),
    ]
    for call, word in bad:
        with pytest.raises(ShardingError, match=word):
            call()
    assert verify(plan, timeout_s=float("inf")).status == "proved"
    assert verify(plan, None, 30).status == "proved"  # docs/spec.md §4: verify(plan, dst=None, timeout_s=None)


def test_huge_and_infinite_timeouts_are_no_bound_and_print_nothing(monkeypatch):
    """Regression (issue: soundness and robustness, second round): ``timeout_s=1e10`` printed a traceback from
    the watchdog's thread (``threading.Timer`` overflows past ``threading.TIMEOUT_MAX``). A bound longer than
    Z3's timer counts leaves Z3 unbounded; infinity, and an integer too large for a float, are no bound."""
    import threading

    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    _, plan = _classic()
    for timeout_s in (1e10, 2.0**62, 10**400, float("inf"), np.float64(1e300), 4 * 10**6):
        v = verify(plan, "f32[16, 16{y,x}, 16]", timeout_s=timeout_s)
        assert v.status == "refuted", (timeout_s, v.reason)
    assert not failures, [f.exc_value for f in failures]


def test_malformed_instructions_are_refuted_not_raised():
    mesh, plan = _classic()
    prog = plan.program
    src = plan.src
    from redist.blocks import Copy

    cases = [P.Slice("0", ("x",)), P.AllGather(0, None), P.CollectivePermute(None), P.Transpose([0, 1, 2]),
             P.Exchange(src.local_shape, ((Copy(0, (0,), (0,), (1,)),),) * mesh.size), P.Reshape((-1, 16))]
    for ins in cases:
        v = verify_program(dataclasses.replace(prog, instructions=(ins,), shapes=(prog.shapes[0],) * 2), src, src)
        assert v.status == "refuted", (ins, v.reason)


# ---------------------------------------------------------------------------- axis tokens
# The verifier reads instruction axes from their text (it never asks the mesh), and must accept exactly the tokens
# that the backends' reader, Mesh.axis, accepts: ``name`` or ``name:(pre)size`` with pre and size in ASCII digits,
# pre >= 1, size >= 2 and pre·size dividing the axis. On the mesh x=4, y=6, z=1:
TOKEN_MESH = Mesh({"x": 4, "y": 6, "z": 1})
TOKENS = [
    # whole axes and sub-axes, and the whole axis written as a sub-axis
    "x", "y", "z", "x:(1)2", "x:(2)2", "y:(1)2", "y:(2)3", "y:(1)3", "y:(3)2", "x:(1)4", "y:(1)6",
    # leading zeros, a zero, empty numbers
    "x:(01)2", "x:(1)02", "x:(001)002", "x:(0)2", "x:(1)0", "x:(00)2", "x:()2", "x:(1)", "x:()",
    # digits other than ASCII 0-9: Arabic-Indic, extended Arabic-Indic, superscript, full-width, NKo, math bold, CJK
    "y:(١)2", "y:(1)٢", "y:(۱)2", "x:(²)2", "x:(1)²", "x:(１)２", "x:(1)２", "x:(߁)2", "x:(𝟏)2", "x:(一)2",
    # whitespace
    " x", "x ", "x:(1) 2", "x:( 1)2", "x :(1)2", "x\n", "x:(1)2\n", "\tx", "x:(1)\u20032",
    # sizes that do not divide the axis, and sub-axes of size 1
    "y:(1)4", "y:(4)2", "y:(2)2", "x:(1)8", "x:(8)1", "x:(3)1", "x:(1)1", "x:(2)1", "x:(4)1", "z:(1)1",
    # no axis of the mesh, or no token
    "w", "X", "x1", "_x", "1x", "", "x:", "x:(1)2:(1)2", "x(1)2", "x:[1]2", "ｘ", "é", "x:(1)2)",
    # numbers past any mesh, long enough that int() refuses them, with and without leading zeros
    "x:(2147483648)2", "x:(1)99999999999999999999", "x:(" + "1" * 5000 + ")2", "x:(" + "0" * 5000 + "1)2",
    "x:(1)" + "0" * 4400 + "2",
    # not text
    1, None, ("x",), b"x",
]


def _mesh_reads(mesh, token):
    """What the backends' reader makes of ``token``: (name, size, stride, pre, stop), or None if it refuses."""
    try:
        a = mesh.axis(token)
    except ShardingError:
        return None
    return a.name, a.size, a.stride, a.pre, a.stop


def _verifier_reads(mesh, token):
    """What the verifier makes of ``token``: the same fields, or None if it refutes it."""
    try:
        a = read_axis(dict(mesh.axes), token)
    except Refuted:
        return None
    return a.name, a.size, a.stride, a.lo, a.hi


@pytest.mark.parametrize("token", TOKENS, ids=[ascii(t)[:40] for t in TOKENS])
def test_the_verifier_reads_an_axis_token_exactly_as_the_backends_do(token):
    assert _verifier_reads(TOKEN_MESH, token) == _mesh_reads(TOKEN_MESH, token)


_TOKEN_TEXT = st.sampled_from(["x", "y", "z", "w", ":", "(", ")", "0", "1", "2", "3", "6", "١", "٢", "²", "２", "۳",
                               " ", "_", "\n"])
_DIGITS = st.text(st.sampled_from("0123456789١٢²２۳𝟏 "), max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(_TOKEN_TEXT, max_size=10),
                 st.builds("{}:({}){}".format, st.sampled_from(["x", "y", "z", "w"]), _DIGITS, _DIGITS)))
def test_the_verifier_accepts_a_token_exactly_when_the_backends_do(token):
    assert _verifier_reads(TOKEN_MESH, token) == _mesh_reads(TOKEN_MESH, token)


@pytest.mark.parametrize("token, twin, claim", [("y:(١)2", "y:(1)2", "f32[8{y:(1)2}, 4]"),
                                                ("y:(1)٢", "y:(1)2", "f32[8{y:(1)2}, 4]"),
                                                ("y:(１)2", "y:(1)2", "f32[8{y:(1)2}, 4]"),
                                                ("y:(2)1", None, "f32[8, 4]")])
def test_a_program_over_an_axis_the_backends_refuse_is_not_proved(token, twin, claim):
    """A hand-built program that slices over ``y:(١)2`` (a non-ASCII digit, which ``\\d`` would read as
    ``y:(1)2``) or over the sub-axis of size 1 ``y:(2)1`` is not proved, as every backend refuses to run it. The
    same program over the ASCII ``twin`` is proved, and runs."""
    mesh = Mesh({"x": 2, "y": 4})
    src, dst = T("f32[8, 4]", mesh), T(claim, mesh)
    program = P.Program(mesh, src.np_dtype, (P.Slice(0, (token,)),), (src.local_shape, dst.local_shape))
    verdict = verify_program(program, src, dst)
    assert verdict.status == "refuted" and repr(token) in verdict.reason, verdict.reason
    ran, why = oracle(program, src, dst)
    assert not ran and "ShardingError" in why, why
    if twin is not None:
        ascii_program = dataclasses.replace(program, instructions=(P.Slice(0, (twin,)),))
        assert verify_program(ascii_program, src, dst).status == "proved" and oracle(ascii_program, src, dst)[0]


def test_claim_mutants_are_refuted_with_counterexamples_and_are_wrong():
    """The claim-side operators of proofs/mutation.py (device order included), on a plan with partial axes and
    sub-axes in its mesh's reach: every mutant is refuted, with a counterexample, and the numpy oracle agrees."""
    from proofs.mutation import claim_mutants

    mesh = Mesh({"x": 2, "y": 4, "z": 1})
    plan = synthesize(T("f32[8{y:(1)2}, 6] partial{x}", mesh), T("f32[8{x}, 6{y:(1)2}]", mesh))
    seen = set()
    for op, desc, claim in claim_mutants(plan.dst, random.Random(0), max_per_op=100):
        seen.add(op)
        v = verify(plan, claim)
        assert v.status == "refuted" and v.counterexample is not None, (desc, v.reason)
        assert oracle(plan.program, plan.src, claim)[0] is False, desc
    assert seen == {"claim_dtype", "claim_mesh_order", "claim_axis_sizes", "claim_shape", "claim_device_order"}


def test_every_dropped_exchange_copy_is_refuted_with_a_counterexample():
    """With one copy of an exchange dropped, verify refutes with a counterexample, never an IndexError from
    looking the source device up at coordinates the model left free (e.g. device 2's first copy here).
    Exchanges are segment tables: each segment dropped in turn."""
    mesh = Mesh({"x": 2, "y": 4})
    plan = synthesize(T("f32[7{x}, 5{y}]", mesh), T("f32[7{y}, 5{x}]", mesh))
    prog = plan.program
    t = next(i for i, ins in enumerate(prog.instructions) if isinstance(ins, P.Exchange))
    ex = prog.instructions[t]
    for i, dim in enumerate(ex.dims):
        for j, seg in enumerate(dim.segments):
            dims = ex.dims[:i] + (dataclasses.replace(dim, segments=dim.segments[:j] + dim.segments[j + 1:]),) \
                + ex.dims[i + 1:]
            instructions = prog.instructions[:t] + (dataclasses.replace(ex, dims=dims),) + prog.instructions[t + 1:]
            v = verify_program(dataclasses.replace(prog, instructions=instructions), plan.src, plan.dst)
            # Only the devices whose block in dim i the segment served lack its elements.
            assert v.status == "refuted" and mesh.group_index(v.counterexample["device"], dim.axes) == seg.block, \
                (i, j, v.reason)


# ---------------------------------------------------------------------------- threads

# Cases for the thread tests, as (name, call of timeout_s): proved and refuted plans, a partial source, uneven
# dims, a plan across meshes, and a query that no budget here decides (a random permutation of 256 devices and
# back: the watchdog interrupts it).
_THREAD_CASES = """
import random
from redist import program as P
from redist.mesh import Mesh
from redist.synthesis import synthesize
from redist.types import ShardingType
from redist.verify import verify, verify_program

mesh = Mesh({"x": 4, "y": 2})
T = lambda text: ShardingType.parse(text, mesh)
classic = synthesize(T("f32[16{y}, 16, 16{x}]"), T("f32[16, 16{x,y}, 16]"))
partial = synthesize(T("f32[8, 6] partial{x}"), T("f32[8{y}, 6{x}]"))
uneven = synthesize(T("f32[7{x}, 5{y}]"), T("f32[7{y}, 5{x}]"))
big = Mesh({"x": 16, "y": 16})
there = list(range(big.size))
random.Random(0).shuffle(there)
back = [there.index(d) for d in range(big.size)]
hard_src = ShardingType(big, (big.size,), "f32", (big.names,))
hard = P.Program(big, hard_src.np_dtype, (P.CollectivePermute(tuple(there)), P.CollectivePermute(tuple(back))),
                 ((1,), (1,), (1,)))
stage = Mesh.parse("model=4,device_ids=[4,5,6,7]")
across = synthesize(T("f32[8, 16{y}] partial{x}"), ShardingType.parse("f32[8{model}, 16]", stage))
CASES = {
    "proved": lambda t: verify(classic, timeout_s=t),
    "refuted": lambda t: verify(classic, "f32[16, 16{y,x}, 16]", timeout_s=t),
    "partial": lambda t: verify(partial, timeout_s=t),
    "partial_refuted": lambda t: verify(partial, "f32[8{x}, 6{y}]", timeout_s=t),
    "uneven": lambda t: verify(uneven, timeout_s=t),
    "hard": lambda t: verify_program(hard, hard_src, hard_src, timeout_s=0.3 if t is None else t),
    "across": lambda t: verify(across, timeout_s=t),
    "across_refuted": lambda t: verify(across, "f32[8, 16{model}]", timeout_s=t),
}
"""


def _python(script: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter on this checkout: a crash there is a failed test, not a dead pytest."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)


def test_verify_calls_in_threads_at_once_each_give_the_single_threaded_verdict():
    """Regression (issue: soundness and robustness, second round): verify calls in several threads shared Z3's
    global context, and crashed the interpreter (SIGSEGV, double free, Z3 assertion) in most runs. Eight threads
    verify proved, refuted and undecided cases at once, some with budgets so small that the deadline or the
    watchdog ends them, in rounds, in fresh processes: each verdict is the single-threaded one (or undecided, for
    a call with a small budget)."""
    script = _THREAD_CASES + """
import threading
names = sorted(CASES)
alone = {name: CASES[name](None).status for name in names}
wrong = []

def work(i):
    for r in range(4):
        name = names[(i + r) % len(names)]
        small = (i + r) % 3 == 0
        try:
            status = CASES[name](0.02 if small else None).status
        except Exception as e:
            status = repr(e)
        if status != alone[name] and not (small and status == "undecided"):
            wrong.append((name, small, status, alone[name]))

threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(alone["hard"], sorted(set(alone.values())), wrong)
"""
    for _ in range(3):
        out = _python(script, timeout=600)
        assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
        assert out.stdout.split("\n")[0] == "undecided ['proved', 'refuted', 'undecided'] []", out.stdout
        assert "Traceback" not in out.stderr, out.stderr[-2000:]


def test_a_deadline_in_another_thread_cancels_no_verify_call():
    """Regression (same issue): the watchdog of a call interrupted Z3's one global context, so a verify call
    beside another whose deadline ran out was cancelled (``Z3Exception('canceled')`` or an undecided verdict).
    One thread verifies again and again, beside threads whose calls the watchdog interrupts and a thread of
    numpy work: every one of its verdicts is the verdict."""
    script = _THREAD_CASES + """
import threading
import numpy as np
stop = threading.Event()

def interrupted(seed):
    rng = random.Random(seed)
    while not stop.is_set():
        CASES["hard"](rng.uniform(0.01, 0.1))

def numpy_work():
    a = np.random.default_rng(0).random((300, 300))
    while not stop.is_set():
        a = np.tanh(a @ a.T)

others = [threading.Thread(target=interrupted, args=(i,)) for i in range(3)] + [threading.Thread(target=numpy_work)]
for t in others:
    t.start()
seen = []
try:
    for r in range(12):
        for name in ("proved", "refuted", "partial"):
            try:
                v = CASES[name](None if r % 2 else 600)
                seen.append(v.status if v.status == "undecided" else name if v.status == "proved" or
                            name == "refuted" else v.status)
            except Exception as e:
                seen.append(repr(e))
finally:
    stop.set()
    for t in others:
        t.join()
print(sorted(set(seen)))
"""
    out = _python(script, timeout=600)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.strip() == "['partial', 'proved', 'refuted']", out.stdout


def test_the_verifier_never_uses_z3s_global_context(monkeypatch):
    """Each call works in a Z3 context of its own: nothing of it is made in Z3's global context (which every
    thread of the process shares), whatever the query: values, sums, coverage, creation, permute tables."""
    import z3

    def refuse(*args):
        raise AssertionError("the verifier used Z3's global context")

    monkeypatch.setattr(z3.z3, "main_ctx", refuse)
    mesh, plan = _classic()
    assert verify(plan).status == "proved"
    assert verify(plan, "f32[16, 16{y,x}, 16]").status == "refuted"
    assert verify(synthesize(T("f32[8, 6] partial{x}", mesh), T("f32[8{y}, 6{x}]", mesh))).status == "proved"
    assert verify(synthesize(T("f32[8, 6] partial(max){x,y}", mesh), T("f32[8{x}, 6]", mesh))).status == "proved"
    assert verify(synthesize(T("f32[7{x}, 5]", mesh), T("f32[7, 5] partial{x}", mesh))).status == "proved"
    reversed_mesh = Mesh({"x": 4, "y": 2}, device_ids=list(range(7, -1, -1)))
    assert verify(synthesize(T("f32[7{x}, 5{y}]", mesh), T("f32[7{y}, 5{x}]", reversed_mesh))).status == "proved"
    maxima = T("f32[8] partial(max){x}", mesh)
    twice = P.Program(mesh, maxima.np_dtype, (P.AllReduce(("x",), "max"),) * 2, ((8,),) * 3)
    v = verify_program(twice, maxima, T("f32[8]", mesh))
    assert v.status == "proved" and v.details["queries"] == 3
    prog, src = _random_permutation_and_back(Mesh({"x": 4, "y": 2}))
    assert verify_program(prog, src, src, timeout_s=60).status == "proved"
    assert verify_program(prog, src, src, timeout_s=1e-9).status == "undecided"


# ---------------------------------------------------------------------------- plans of steps, not synthesized
def _from_steps(mesh_text, src, steps):
    mesh = Mesh.parse(mesh_text)
    return Plan.from_steps(T(src, mesh), steps)


# Plans that the numpy backend runs right, and that an element "never written" or "one value has one reduction
# kind" must not make verify refute.
RIGHT_PLANS = [
    ("x=2", "i32[5{x}]", [S.ShardToPartial(0, ("x",)), S.AllReduce(("x",))]),
    ("x=2", "i32[5{x}]", [S.ShardToPartial(0, ("x",)), S.ReduceScatter(0, ("x",))]),
    ("x=3,y=2", "f32[7{x}, 3]", [S.ShardToPartial(0, ("x",)), S.AllReduce(("x",))]),
    ("x=3,y=2", "f32[7{x}, 3]", [S.ShardToPartial(0, ("x",)), S.ReduceScatter(1, ("x",))]),
    ("x=3,y=2", "f32[7{x,y}, 3]", [S.ShardToPartial(0, ("x", "y")), S.ReduceScatter(0, ("y",)),
                                    S.AllReduce(("x",))]),
    ("x=2", "i32[5] partial(prod){x}", [S.ReduceScatter(0, ("x",), "prod"), S.ShardToPartial(0, ("x",)),
                                        S.AllReduce(("x",))]),
    ("x=2", "i32[4] partial(prod){x}", [S.ReduceScatter(0, ("x",), "prod"), S.ShardToPartial(0, ("x",)),
                                        S.AllReduce(("x",))]),
    ("x=3,y=2", "i64[7, 3] partial(max){x,y}", [S.ReduceScatter(0, ("x",), "max"), S.AllReduce(("y",), "max"),
                                                 S.ShardToPartial(0, ("x",)), S.AllReduce(("x",))]),
    ("x=2,y=2", "i32[4] partial(min){x}", [S.AllReduce(("x",), "min"), S.ReplicateToPartial(("x", "y")),
                                           S.AllReduce(("x", "y"))]),
]


@pytest.mark.parametrize("mesh_text,src,steps", RIGHT_PLANS)
def test_plans_that_numpy_runs_right_are_proved(mesh_text, src, steps):
    """An uneven shard_to_partial lowers to an exchange that writes no data where a member lacks its rows:
    zeros that the reduction after it adds up, as a creating claim's. A pending product (max, min) reduced whole
    and then made pending sums is two stages: its reductions, then sums. Each plan is right on numpy, and
    proved."""
    plan = _from_steps(mesh_text, src, steps)
    assert oracle(plan.program, plan.src, plan.dst)[0]
    v = verify(plan)
    assert v.status == "proved", (str(plan), v.reason)


def test_two_stage_programs_that_compute_something_else_are_refuted():
    """The two-stage queries keep refuting: the sum taken twice (no zeros where the created sum needs them), the
    product not taken, too few of its summands, a claim of another kind or other partial axes; each with a
    counterexample, and numpy agrees that each is wrong."""
    plan = _from_steps("x=2,y=2", "i32[4] partial(prod){x,y}",
                       [S.ReduceScatter(0, ("x",), "prod"), S.AllReduce(("y",), "prod"), S.ReplicateToPartial(("y",)),
                        S.AllReduce(("y",))])
    prog, (rs, ar, keep, total) = plan.program, plan.program.instructions
    assert (type(keep), verify(plan).status) == (P.KeepRoot, "proved")

    def program(*instructions):
        shapes = [prog.shapes[0]]
        for ins in instructions:
            shapes.append(prog.shapes[1] if isinstance(ins, P.ReduceScatter) else shapes[-1])
        return dataclasses.replace(prog, instructions=instructions, shapes=tuple(shapes))

    mesh = plan.src.mesh
    wrong = [(program(rs, ar, total), plan.dst, "twice"),  # no zeros: the sum takes the element twice
             (program(rs, keep, total), plan.dst, "summand"),  # the product over y is never taken
             (program(ar, keep, total), T("i32[4]", mesh), "summand"),  # nor over x
             (prog, T("i32[4{x}] partial{y}", mesh), "twice"),  # the sum over y is taken
             (prog, T("i32[4{x}] partial(prod){y}", mesh), "pending sums")]
    for mutant, claim, word in wrong:
        v = verify_program(mutant, plan.src, claim)
        assert v.status == "refuted" and v.counterexample is not None and word in v.reason, (mutant, claim, v.reason)
        assert not oracle(mutant, plan.src, claim)[0]


def test_the_coverage_query_enumerates_the_members_it_names():
    """Regression (same issue): where the claim's partial group has one device (an axis of size 1), the coverage
    query listed its size among the member values but had no variable for it, so each value went to the wrong
    member: a maximum over replicas, then over the summands, was refuted ("never takes source summand")."""
    mesh = Mesh({"x": 1, "y": 2, "z": 2})
    src = T("i32[4] partial(max){y}", mesh)
    prog = P.Program(mesh, src.np_dtype, (P.AllReduce(("z",), "max"), P.AllReduce(("y",), "max")), ((4,),) * 3)
    for claim in ("i32[4] partial(max){x}", "i32[4]"):
        v = verify_program(prog, src, T(claim, mesh))
        assert v.status == "proved" and v.details["queries"] == 3, (claim, v.reason)
        assert oracle(prog, src, T(claim, mesh))[0]


@pytest.mark.parametrize("seed", range(4))
def test_verify_agrees_with_numpy_on_plans_of_random_steps(seed):
    """The issue's property: verify proves every plan that the numpy backend runs right, on plans built from
    random step sequences through the typing rules (not synthesized: all_slice, all_gather, all_to_all,
    permute, exchange, reduce_scatter, all_reduce, replicate_to_partial, shard_to_partial, pad, unpad), from
    random sources (uneven dims, partial sums, max, min and products, sub-axes, device orders; integer and bool
    dtypes, exact in any order), and never one it runs wrong; a mutant of each plan's program or claim is never
    proved where numpy shows a difference (:mod:`proofs.step_sequences`). 4 x 100 plans."""
    from proofs.step_sequences import run

    res = run(n=100, seed=seed, n_mutants=1)
    assert not res["failures"], res["failures"][:3]
    assert res["outcomes"] == {"proved": 100}, res["outcomes"]
    assert {"uneven", "sub-axes", "device order", "two kinds", "source sum", "source max", "source min",
            "source prod"} <= set(res["features"]), res["features"]
    assert {"all_slice", "all_gather", "all_to_all", "permute", "exchange", "reduce_scatter", "all_reduce",
            "replicate_to_partial", "shard_to_partial", "pad", "unpad"} <= set(res["steps"]), res["steps"]
