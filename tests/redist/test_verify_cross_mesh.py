"""The verifier on plans across meshes (docs/spec.md §3, §4): it proves the programs and the transfers between
them together, each destination block on each destination device; it proves the plan's footprint (no device
above the larger of its two buffers, none of neither mesh touched); and its refutations name a device and
a local index where numpy, run on the same stages, shows the claim wrong."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import redist
from redist import Mesh, Plan, ShardingType
from redist import program as P
from redist.backends import numpy_backend
from redist.cli import main
from redist.data import poisoned_source
from redist.steps import AllGather, AllSlice, Transfer
from redist.synthesis import synthesize
from redist.verify import verify, verify_program


def T(text: str, mesh: str) -> ShardingType:
    return ShardingType.parse(text, Mesh.parse(mesh))


# A pipeline stage's hand-off, replicas that share the sending, a resize, the same devices as another mesh, a
# partial source reduced before the transfer, sums created within it, summands handed over, and uneven dims.
PAIRS = [
    (T("f32[8{data}, 16{model}]", "data=2,model=2"), T("f32[8, 16{model}]", "model=4,device_ids=[4,5,6,7]")),
    (T("f32[8, 4]", "x=2"), T("f32[8, 4]", "y=4,device_ids=[2,3,4,5]")),
    (T("f32[48{dp}, 4]", "dp=8"), T("f32[48{dp}, 4]", "dp=6")),
    (T("f32[16{x}, 8]", "x=8"), T("f32[16{b}, 8{a}]", "a=2,b=4")),
    (T("f32[64] partial{x}", "x=4"), T("f32[64{x}]", "x=4,device_ids=[4,5,6,7]")),
    (T("f32[8{x}]", "x=2"), T("f32[8] partial{y}", "y=2,device_ids=[2,3]")),
    (T("f32[8] partial(max){x}", "x=2"), T("f32[8] partial(max){y}", "y=2,device_ids=[1,2]")),
    (T("f32[7{x}, 5{y}]", "x=2,y=2"), T("f32[7, 5{z}]", "z=3,device_ids=[3,4,5]")),
]


def _run(stages, src, seed=0):
    """The value and the buffers numpy makes of it, by device id, from poisoned source buffers."""
    value, bufs = poisoned_source(src, np.random.default_rng(seed), distinct=True)
    return value, numpy_backend.run_stages(stages, bufs)


def test_plans_across_meshes_are_proved_with_their_footprint():
    for src, dst in PAIRS:
        v = verify(synthesize(src, dst))
        assert v.ok, (src, dst, v.reason)
        assert "no device holds more than the larger of its buffers" in v.reason


def test_seeded_random_pairs_are_proved_run_exactly_and_bounded():
    """A handful of the property check of ``python -m proofs cross_mesh`` (every relation of two meshes)."""
    from proofs.cross_mesh import check_pair, random_pairs

    for case in random_pairs(12, seed=7):
        result = check_pair(case)
        assert result["ok"], result


def test_a_wrong_claim_is_refuted_at_a_device_and_index_where_numpy_disagrees():
    src, dst = T("f32[8{x}, 8]", "x=2"), T("f32[8{a}, 8{b}]", "a=2,b=2,device_ids=[1,2,3,4]")
    plan = synthesize(src, dst)
    v = verify(plan, "f32[8{b}, 8{a}]")  # text claims are read on the destination's mesh
    assert v.status == "refuted"
    cx = v.counterexample
    assert dst.mesh.has_device(cx["device"]) and cx["coords"] == dst.mesh.coords(cx["device"])
    value, out = _run(plan.stages, src)
    held = out[cx["device"]][cx["index"]]
    assert held == value[cx["holds"]["global_index"]] != value[cx["expected"]["global_index"]]


def _with_copies(stages, change):
    """``stages`` with the transfer's copy table rows changed by ``change`` (a list, edited in place)."""
    transfer = stages[1]
    rows = list(transfer.copies.copies)
    change(rows)
    return stages[:1] + (dataclasses.replace(transfer, copies=P.CopyTable(tuple(rows))),) + stages[2:]


def test_a_transfer_from_the_wrong_device_or_missing_a_copy_is_refuted_with_a_true_counterexample():
    src, dst = PAIRS[0]
    plan = synthesize(src, dst)

    def wrong_source(rows):
        c = rows[5][0]
        rows[5] = (dataclasses.replace(c, source=3 - c.source),) + rows[5][1:]

    def dropped(rows):
        rows[6] = rows[6][1:]

    for change, words in ((wrong_source, "holds global element"), (dropped, "is never written")):
        stages = _with_copies(plan.stages, change)
        v = verify_program(stages, src, dst)
        assert v.status == "refuted" and words in v.reason, v.reason
        cx = v.counterexample
        value, out = _run(stages, src)
        assert out[cx["device"]][cx["index"]] != value[cx["expected"]["global_index"]]


def test_transfers_that_do_not_fit_their_meshes_are_refuted():
    src, dst = PAIRS[0]
    plan = synthesize(src, dst)
    stages = plan.stages

    def to_outside(rows):
        rows[4:] = [(), *rows[5:], rows[4]]  # device 4's copies to device 8, no device of the destination's

    def from_outside(rows):
        rows[4] = tuple(dataclasses.replace(c, source=9) for c in rows[4])

    reordered = dataclasses.replace(stages[1], src_mesh=Mesh.parse("data=2,model=2,device_ids=[3,2,1,0]"))
    cases = [(_with_copies(stages, to_outside), "device 8 is no device of the mesh it writes"),
             (_with_copies(stages, from_outside), "which is no device of the mesh it reads"),
             (stages[:1] + stages[2:], "do not alternate programs and transfers"),
             (stages[:1] + (reordered,) + stages[2:], "(a transfer) reads its buffers on mesh")]
    for bad, words in cases:
        v = verify_program(bad, src, dst)
        assert v.status == "refuted" and words in v.reason, v.reason
    v = verify_program(stages, src, dst, costs=(plan.peak_bytes, plan.bytes_received - 1))
    assert v.status == "refuted" and f"make device 4 receive {plan.bytes_received}" in v.reason


def test_a_plan_through_devices_of_neither_mesh_or_above_a_devices_bound_is_refuted():
    """Numpy runs both plans right; the verifier refutes their footprint, naming the device."""
    src = T("f32[8{x}]", "x=2")
    detour = Plan.from_steps(src, [Transfer(Mesh.parse("y=2,device_ids=[2,3]"), (("y",),)), AllGather(0, ("y",)),
                                   Transfer(Mesh({"x": 2}), ((),)), AllSlice(0, ("x",))])
    v = verify(detour)
    assert v.status == "refuted" and "on neither the source's mesh" in v.reason and v.counterexample["device"] == 2
    gathered = Plan.from_steps(src, [Transfer(Mesh.parse("y=2,device_ids=[1,2]"), (("y",),)), AllGather(0, ("y",)),
                                     AllSlice(0, ("y",))])
    v = verify(gathered)
    assert v.status == "refuted" and v.counterexample["device"] == 1  # on both meshes, bound 16 bytes on each
    assert (v.counterexample["holds"]["buffer_bytes"], v.counterexample["expected"]["buffer_bytes_at_most"]) == (32, 16)
    for plan in (detour, gathered):
        value, out = _run(plan.stages, src)
        assert np.array_equal(redist.unshard(plan.dst, out), value)


def test_the_command_line_reads_a_claim_on_the_destinations_mesh(capsys):
    args = ["verify", "f32[8{x}]", "f32[8{y}]", "--mesh", "x=2", "--dst-mesh", "y=2,device_ids=[2,3]"]
    assert main(args) == 0 and "verify: proved in" in capsys.readouterr().out
    assert main(args + ["--claim", "f32[8] partial{y}"]) == 1
    assert "counterexample: device " in capsys.readouterr().out
    with pytest.raises(redist.ShardingError, match="of 4 devices, but the plan leaves its result on mesh"):
        verify(synthesize(*PAIRS[5]), T("f32[8{z}]", "z=4"))
