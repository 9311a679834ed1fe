"""Packing independent collectives (partir_core.packing): what a pack computes, which reshards pack, and the
order a program runs them in."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partir_core as pc
import redist
from redist import hlo
from redist import xla_baseline as xb
from redist.backends.jax_backend import jax_mesh_of

from partir_core import models, packing, reshard, schedules
from partir_core.instructions import Compute, Reshard

from .helpers import assert_same

MESH = redist.Mesh({"batch": 2, "model": 4})

# (source, destination) types whose moves are one collective, with local steps around some
ALL_GATHERS = [("f32[8{batch}, 16]", "f32[8, 16]"), ("f32[4, 16{batch}]", "f32[4, 16]"),
               ("f32[6, 8{batch}, 2]", "f32[6, 8, 2]"), ("f32[2{batch}]", "f32[2]")]
REDUCE_SCATTERS = [("f32[8, 16] partial{batch}", "f32[8{batch}, 16]"),
                   ("f32[4, 16] partial{batch}", "f32[4, 16{batch}]"),
                   ("f32[6, 4, 2] partial{batch}", "f32[6, 4{batch}, 2]")]
ALL_TO_ALLS = [("f32[8{batch}, 16]", "f32[8, 16{batch}]"), ("f32[4, 16{batch}]", "f32[4{batch}, 16]"),
               ("f32[6{batch}, 4]", "f32[6, 4{batch}]")]


def _type(text):
    return redist.ShardingType.parse(text, MESH)


def _reshards(pairs):
    """A reshard per ``(source, destination)`` pair, of buffer ``("in", k)`` to ``("out", k)``."""
    out = []
    for k, (src, dst) in enumerate(pairs):
        m = reshard.move(_type(src), _type(dst))
        cols = [reshard.Collective(c, a, b, "test") for c, a, b in m.collectives]
        out.append(Reshard(("in", k), ("out", k), m, cols))
    return out


def _run_both(reshards, xs, data=lambda y: y):
    """Every device's results of ``reshards`` run alone and packed, on the local operands ``xs`` (each stacked
    over the devices), as ``data`` of them."""
    names = reshard.AxisNames({a: (a,) for a in MESH.names})
    every = P(("batch", "model"))

    def body(*blocks):
        local = [b[0] for b in blocks]
        alone = [reshard.run(r.move, x, names) for r, x in zip(reshards, local)]
        packed = reshard.run_packed_moves([r.move for r in reshards], local, names)
        return tuple(data(y)[None] for y in alone + packed)

    outs = jax.jit(jax.shard_map(body, mesh=jax_mesh_of(MESH), in_specs=(every,) * len(xs), out_specs=every,
                                 check_vma=False))(*xs)
    n = len(reshards)
    return outs[:n], outs[n:]


@pytest.mark.parametrize("pairs", [ALL_GATHERS, REDUCE_SCATTERS, ALL_TO_ALLS], ids=["all_gather", "reduce_scatter",
                                                                                    "all_to_all"])
def test_a_pack_computes_what_its_reshards_compute_alone(pairs):
    reshards = _reshards(pairs)
    assert packing.packs(reshards) == [list(range(len(reshards)))]  # independent: one pack
    xs = [jax.random.normal(jax.random.key(k), (MESH.size, *r.move.plan.src.local_shape))
          for k, r in enumerate(reshards)]
    alone, packed = _run_both(reshards, xs)
    for a, b in zip(alone, packed):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_reshards_of_other_kinds_axes_or_dtypes_do_not_pack():
    reshards = _reshards([ALL_GATHERS[0], ("f32[8{model}, 16]", "f32[8, 16]"), ("i32[8{batch}, 16]", "i32[8, 16]"),
                          REDUCE_SCATTERS[0], ALL_TO_ALLS[0]])
    assert packing.packs(reshards) == []


def _op(reads, writes):
    """An equation of the instruction list (packs and schedule read only what it reads and writes)."""
    return Compute(0, list(reads), list(writes), [], 0.0)


def test_a_reshard_that_reads_a_packs_result_does_not_join_it():
    gather = _reshards([ALL_GATHERS[0]])[0]
    ins = [gather,                                                            # 0: in0 -> out0
           _op([("out", 0)], [("r", 2)]),                                     # 1: reads it
           Reshard(("r", 2), ("out", 2), gather.move, gather.collectives),    # 2: depends on 0: a pack of its own
           Reshard(("in", 3), ("out", 3), gather.move, gather.collectives)]   # 3: independent: joins the open one
    assert packing.packs(ins) == [[2, 3]]
    # a pack runs where its last member is, after what it reads
    assert packing.schedule(ins, packing.packs(ins)) == [0, 1, (2, 3)]


def test_what_reads_an_earlier_member_runs_after_its_pack():
    gather = _reshards([ALL_GATHERS[0]])[0]
    ins = [gather,                                                            # 0: in0 -> out0
           _op([("out", 0)], [("y", 1)]),                                     # 1: reads it
           Reshard(("in", 2), ("out", 2), gather.move, gather.collectives)]   # 2: independent: packs with 0
    assert packing.packs(ins) == [[0, 2]]
    assert packing.schedule(ins, packing.packs(ins)) == [(0, 2), 1]


def test_packs_never_wait_on_each_other():
    # g1 and g2 are all-gathers, a1 and a2 all-to-alls: a1 reads g1's result and g2 reads a2's; packing g2 with
    # g1 and a2 with a1 would make each pack wait on the other, so g2 is left apart
    ag = _reshards([ALL_GATHERS[0]])[0]
    a2a = _reshards([ALL_TO_ALLS[0]])[0]
    ins = [Reshard(("x", 0), ("g", 1), ag.move, ag.collectives),      # g1
           Reshard(("g", 1), ("a", 1), a2a.move, a2a.collectives),    # a1, reads g1
           Reshard(("x", 1), ("a", 2), a2a.move, a2a.collectives),    # a2
           Reshard(("a", 2), ("g", 2), ag.move, ag.collectives)]      # g2, reads a2
    found = packing.packs(ins)
    assert found == [[1, 2]]
    assert packing.schedule(ins, found) == [0, (1, 2), 3]


def test_a_zero3_step_runs_its_gathers_and_scatters_packed():
    m = models.transformer()
    ins = m.init(jax.random.key(0))
    pf = pc.jit(m.step, MESH, schedules.schedule("BP+Z3", m, ins, mesh=MESH))
    low = pf.lower(*ins)
    args = [jax.device_put(x, xb.named_sharding(t)) for x, t in zip(jax.tree.leaves(ins), low.program.in_types)]
    text = low.program.executable().lower(*args).compile().as_text()
    compiled = [c for c in hlo.parse_hlo(text, MESH) if c.bytes_received > 0]
    kinds = [c.kind for c in low.collectives]
    assert kinds.count("reduce_scatter") > 4 and kinds.count("all_gather") > 4
    # the 29 gradients' reduce-scatters run as one, and so do the 29 parameters' gathers (a small model: one
    # pack holds them all)
    assert [c.kind for c in compiled].count("reduce_scatter") == 1
    assert [c.kind for c in compiled].count("all_gather") == 1
    assert_same(pf(*ins), m.step(*ins))


def test_key_arrays_pack_as_their_key_data():
    # a key array's plan moves its key data (u32, the key dims last and whole)
    reshards = _reshards([("u32[8{batch}, 2]", "u32[8, 2]"), ("u32[4, 6{batch}, 2]", "u32[4, 6, 2]")])
    assert packing.packs(reshards) == [[0, 1]]
    shapes = [r.move.plan.src.local_shape[:-1] for r in reshards]
    keys = [jax.random.split(jax.random.key(k), (MESH.size, *s)) for k, s in enumerate(shapes)]
    alone, packed = _run_both(reshards, keys, jax.random.key_data)  # key_data: only of key arrays
    for a, b in zip(alone, packed):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
