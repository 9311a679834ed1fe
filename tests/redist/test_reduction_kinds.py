"""Reduction kinds of pending values (docs/spec.md §2): ``partial(max|min|prod){…}`` types, plans that
keep the kind, and the kinds on the numpy and JAX backends and in the verifier. The MPI counterparts run
under mpiexec in tests/redist/test_mpi_backend.py (its worker draws every kind)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import redist
from proofs.common import oracle
from redist import Mesh, ShardingError, ShardingType, synthesize, verify
from redist.data import summands, unshard
from redist.testing import SeededDraw, draw_mesh, draw_pair
from redist.types import REDUCTIONS
from redist.verify import verify_program

MESH = Mesh({"x": 2, "y": 4})


def T(text: str, mesh: Mesh = MESH) -> ShardingType:
    return ShardingType.parse(text, mesh)


def test_text_form_of_kinds():
    assert T("f32[8{x}] partial(max){y}").reduction == "max"
    assert str(T("f32[8{x}] partial(min){y}")) == "f32[8{x}] partial(min){y}"
    assert str(T("f32[8{x}] partial{y}")) == "f32[8{x}] partial{y}"  # a sum prints as before
    assert T("f32[8{x}] partial(sum){y}") == T("f32[8{x}] partial{y}")
    assert T("f32[8{x}]", MESH).reduction == "sum"


@pytest.mark.parametrize("text, words", [("f32[8] partial(mean){y}", "unknown reduction kind"),
                                         ("c64[8] partial(max){y}", "c64"),
                                         ("c128[8] partial(min){x}", "c128")])
def test_bad_kinds_raise(text, words):
    with pytest.raises(ShardingError, match=words):
        T(text)


def test_converting_between_kinds_raises():
    with pytest.raises(ShardingError, match="max"):
        synthesize(T("f32[8{x}] partial{y}"), T("f32[8{x}] partial(max){y}"))


@pytest.mark.parametrize("kind", REDUCTIONS)
@pytest.mark.parametrize("dtype", ["f32", "i32", "bool"])
def test_summands_reduce_to_the_value(kind, dtype):
    t = T(f"{dtype}[8{{x}}, 4] partial({kind}){{y}}")
    rng = np.random.default_rng(0)
    value = rng.integers(-4, 5, size=(8, 4)).astype(t.np_dtype)
    shards = summands(t, value, rng)
    np.testing.assert_array_equal(unshard(t, shards), value)
    if dtype != "bool":  # the members of a group do not all hold the value
        assert not all(np.array_equal(shards[0], s) for s in shards[1:4])


def _pairs(kind: str, n: int, seed: int):
    """Random pairs with a partial source of ``kind`` (f32, i32 and bool), on meshes of up to 8 devices."""
    draw = SeededDraw(f"kinds:{kind}:{seed}")
    out = []
    while len(out) < n:
        mesh = draw_mesh(draw, max_devices=8, min_devices=2)
        src, dst = draw_pair(draw, mesh, partial=1.0, sub_axes=0.25, dtype=("f32", "i32", "bool"), reductions=(kind,),
                             uneven=0.2)
        if src.partial:
            out.append((src, dst))
    return out


@pytest.mark.parametrize("kind", REDUCTIONS)
def test_numpy_runs_every_kind_and_the_verifier_proves_it(kind):
    reduced = 0
    for i, (src, dst) in enumerate(_pairs(kind, 25, 0)):
        plan = synthesize(src, dst)
        assert src.reduction == kind and plan.dst.reduction == (kind if dst.partial else "sum")
        rng = np.random.default_rng(i)
        value = rng.integers(-4, 5, size=src.shape).astype(src.np_dtype)
        out = redist.execute(plan, summands(src, value, rng))
        np.testing.assert_array_equal(unshard(dst, out), value, err_msg=f"{src} -> {dst}")
        assert verify(plan).ok, (str(src), str(dst))
        reduced += any(getattr(ins, "reduction", None) == kind for ins in plan.program.instructions)
    assert reduced >= 5


@pytest.mark.parametrize("kind", REDUCTIONS)
def test_jax_runs_every_kind(kind):
    pytest.importorskip("jax")
    for i, (src, dst) in enumerate(_pairs(kind, 10, 1)):
        plan = synthesize(src, dst)
        rng = np.random.default_rng(i)
        value = rng.integers(-4, 5, size=src.shape).astype(src.np_dtype)
        shards = summands(src, value, rng)
        out = redist.execute(plan, shards, backend="jax")
        for got, want in zip(out, redist.execute(plan, shards)):
            np.testing.assert_array_equal(got, want, err_msg=f"{src} -> {dst}")


@pytest.mark.parametrize("src, dst", [("f32[8{x}, 4] partial(max){y}", "f32[8{x}, 4{y}]"),
                                      ("f32[8{x}, 4] partial(min){y}", "f32[8{x}, 4]"),
                                      ("f32[8, 4] partial(prod){x,y}", "f32[8{y}, 4] partial(prod){x}")])
def test_a_program_is_refuted_for_a_source_of_another_kind(src, dst):
    """The program reduces by the source's kind: read as a sum of the same buffers it is wrong."""
    from redist.verify import verify_program

    plan = synthesize(T(src), T(dst))
    assert verify(plan).ok
    claim_dst = plan.dst.replace(reduction="sum") if plan.dst.partial else plan.dst
    v = verify_program(plan.program, plan.src.replace(reduction="sum"), claim_dst)
    assert v.status == "refuted", v.reason
    assert "sum" in v.reason


def test_claim_of_another_kind_is_refuted_with_a_counterexample():
    plan = synthesize(T("f32[8{x}, 4] partial(max){y}"), T("f32[8, 4{x}] partial(max){y}"))
    v = verify(plan, T("f32[8, 4{x}] partial(min){y}"))
    assert v.status == "refuted" and v.counterexample is not None
    assert "min" in v.reason


def test_oracle_sees_a_product_taken_twice():
    """The mutation oracle tells a product taken twice (an all-reduce by product run twice, which squares the
    summands) from one taken once: a scalar's value of 1 would be left as it is, the oracle would pass the
    mutant the verifier refutes, and the run would count a false alarm."""
    mesh = Mesh({"a0": 2, "a1": 2, "a2": 2})
    src, dst = T("f32[] partial(prod){a0,a1,a2}", mesh), T("f32[] partial(prod){a0,a1}", mesh)
    prog = synthesize(src, dst).program
    twice = dataclasses.replace(prog, instructions=prog.instructions * 2, shapes=prog.shapes + prog.shapes[1:])
    assert oracle(prog, src, dst)[0]
    assert not oracle(twice, src, dst, trials=6)[0]
    assert verify(synthesize(src, dst)).ok


def test_oracle_refuses_a_claim_of_another_kind_whatever_the_values():
    """The oracle refuses the claim ``partial(max)`` for a program that keeps a pending product of a scalar,
    although on some data the max of the product's summands equals the product: another kind is another type,
    which the verifier rightly refutes. On bool, a pending min and a pending prod (both a logical and) agree on
    every datum: only the kind check tells them apart."""
    mesh = Mesh({"a0": 2, "a1": 2, "a2": 2})
    src = T("bool[3] partial(min){a0,a2}", mesh)
    prog = synthesize(src, src).program
    claim = T("bool[3] partial(prod){a0,a2}", mesh)
    assert oracle(prog, src, src, trials=64)[0]
    assert oracle(prog, src, claim, trials=64) == (False, "the result is a pending min, not a pending prod")
    assert verify_program(prog, src, claim).status == "refuted"
