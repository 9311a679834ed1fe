"""Accounting and per-device forms that do not grow with the device count.

The symbolic computations (lower bound, bytes of permutes, exchanges and whole plans, the cost model's axes,
the compact permute and exchange of the lowered program, XLA's replica groups read back as axes) are checked
against brute force written here, device by device, on small meshes; a few large meshes check that they stay
fast, with generous limits (the machine may be busy)."""

import itertools
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import redist
from redist import Mesh, Plan, ShardingType, cost, lower_bound_bytes, synthesize
from redist import program as P
from redist import steps as S
from redist.blocks import max_missing_elements, permute_groups
from redist.errors import ShardingError
from redist.hlo import _mesh_groups, groups_to_axes
from redist.lowering import lower_step
from redist.mesh import prime_factors
from redist.verify import verify_program
from tests.redist.strategies import layouts, meshes, type_pairs


# ---------------------------------------------------------------------- brute force, device by device
def _key(t: ShardingType, d: int):
    """What device ``d`` holds under ``t``: its block of every dim and its summand coordinates."""
    return (tuple(t.block_index(i, d) for i in range(t.rank)),
            tuple(t.mesh.group_index(d, (a,)) for a in t.partial))


def _missing(src: ShardingType, dst: ShardingType, d: int) -> int:
    have, want = src.local_box(d), dst.local_box(d)
    overlap = math.prod(max(0, min(s.stop, t.stop) - max(s.start, t.start)) for s, t in zip(have, want))
    return math.prod(t.stop - t.start for t in want) - overlap


def _varying(mesh: Mesh, pairs) -> tuple[str, ...]:
    """The mesh axes along which some pair of devices differs."""
    moved = {n for a, b in pairs for n in mesh.names if mesh.coords(a)[n] != mesh.coords(b)[n]}
    return tuple(n for n in mesh.names if n in moved)


def _p2p_device_bytes(step, t: ShardingType) -> list[int]:
    """Bytes each device receives in a permute or an exchange, from its lowered instruction."""
    (ins,) = lower_step(step, t) or (None,)
    mesh = t.mesh
    if ins is None:
        return [0] * mesh.size
    if isinstance(ins, P.CollectivePermute):
        return [t.local_bytes * (s != d) for d, s in enumerate(ins.source_table(mesh))]
    return [sum(math.prod(c.size) for c in ins.copies(mesh, d) if c.source != d) * t.itemsize
            for d in range(mesh.size)]


@st.composite
def permute_pairs(draw, max_rank=3):
    """A type and another with the same block count in every dim and the same partial axes: its dims' axes
    dealt out again, with free whole axes of the mesh among them."""
    mesh = draw(meshes(max_axes=4, max_devices=64, min_devices=2))
    rank = draw(st.integers(1, max_rank))
    dims, partial = draw(layouts(mesh, rank, sub_axes=0.3))
    shape = tuple(mesh.group_size(d) * draw(st.sampled_from([1, 2, 3])) for d in dims)
    src = ShardingType(mesh, shape, "f32", dims, partial)
    used = {a.name for a in src.used_axes} | {a.name for a in src.partial}
    pool = [a for d in src.dims for a in d] + [mesh.axis(n) for n in mesh.names if n not in used]
    pool = draw(st.permutations(pool))
    out = []
    for i in range(rank):
        got, k = [], 1
        for a in list(pool):
            if k < src.blocks(i) and src.blocks(i) % (k * a.size) == 0:
                got.append(a)
                pool.remove(a)
                k *= a.size
        assume(k == src.blocks(i))
        out.append(tuple(got))
    try:
        dst = src.replace(dims=tuple(out))
    except ShardingError:
        assume(False)
    return src, dst


# ---------------------------------------------------------------------- lower bound and bytes
@settings(max_examples=300, deadline=None)
@given(type_pairs(max_rank=4, sub_axes=0.3, uneven=True))
def test_lower_bound_is_the_most_any_device_lacks(pair):
    src, dst = pair
    mesh = src.mesh
    reduced = mesh.group_size([a for a in src.partial if a not in dst.partial]) > 1
    if reduced:
        want = max(math.prod(s.stop - s.start for s in dst.local_box(d)) for d in range(mesh.size))
    else:
        want = max(_missing(src, dst, d) for d in range(mesh.size))
    assert lower_bound_bytes(src, dst) == want * src.itemsize
    assert max_missing_elements(src, dst) == max(_missing(src, dst, d) for d in range(mesh.size))


def _creating_bound_by_group(src: ShardingType, dst: ShardingType) -> int:
    """The bound of a pair that creates pending sums, group by group of devices (the definition of docs/spec.md §3)."""
    mesh = src.mesh
    reduces = mesh.group_size([a for a in src.partial if a not in dst.partial]) > 1
    worst = 0
    for group in mesh.groups(dst.partial):
        block = dst.local_box(group[0])
        need = math.prod(b.stop - b.start for b in block)
        if not reduces:
            held = {tuple((b.start, b.stop) for b in src.local_box(d)) for d in group}
            need -= sum(math.prod(max(0, min(hi, b.stop) - max(lo, b.start)) for (lo, hi), b in zip(box, block))
                        for box in held)
        worst = max(worst, -(-need // len(group)))
    return worst * dst.itemsize


def test_the_creating_bound_is_computed_per_class_of_devices():
    """Pairs that create pending sums: the bound, computed per class of devices, is the group-by-group figure."""
    from proofs.step_rules import creating_pairs

    pairs = [(s, d) for s, d in creating_pairs(400, 11, max_devices=24) if s.mesh == d.mesh]
    assert len(pairs) > 300
    for src, dst in pairs:
        assert lower_bound_bytes(src, dst) == _creating_bound_by_group(src, dst), (src, dst)


@settings(max_examples=200, deadline=None)
@given(type_pairs(max_rank=3, sub_axes=0.3, uneven=True, partial=False))
def test_exchange_copies_are_exactly_what_each_device_lacks(pair):
    """Per device, the copies of the lowered exchange fill its block with the right elements, from devices that
    hold them (itself where it holds them), and bring from others exactly what it lacks; the copies a device
    sends (what an MPI rank computes alone) are those of the whole table whose source it is."""
    src, dst = pair
    mesh = src.mesh
    step = S.Exchange(dst.dims)
    (ins,) = lower_step(step, src)
    assert sum(len(s) for s in ins_segments(ins)) <= sum(src.blocks(i) + dst.blocks(i) for i in range(src.rank))
    sent: dict[int, list] = {d: [] for d in range(mesh.size)}
    for d in range(mesh.size):
        want, got = dst.local_box(d), 0
        for c in ins.copies(mesh, d):
            if c.source != d:
                sent[c.source].append((d, c))
            have = src.local_box(c.source)
            for s_lo, d_lo, n, h, w in zip(c.src_start, c.dst_start, c.size, have, want):
                assert h.start + s_lo == w.start + d_lo
                assert h.start + s_lo + n <= h.stop and w.start + d_lo + n <= w.stop
            assert _key(src, c.source)[1] == _key(src, d)[1]
            got += math.prod(c.size) * (c.source != d)
        assert got == _missing(src, dst, d)
    for s in range(mesh.size):
        assert ins.copies_from(mesh, s) == sent[s]
    assert step.bytes_received(src) == max(_p2p_device_bytes(step, src))


def ins_segments(ins):
    return [x.segments for x in ins.dims]


@settings(max_examples=200, deadline=None)
@given(permute_pairs())
def test_permute_map_is_a_permutation_that_delivers_every_block(pair):
    """The coordinate map of a permute is a permutation; each device's source holds its block and summand;
    a device moves only if its block changes or it makes room in a swap of unequal pieces; the step's bytes are
    the most any device receives."""
    src, dst = pair
    mesh = src.mesh
    step = S.Permute(dst.dims)
    cmap = P.CoordinateMap(permute_groups(src, dst))
    sources = cmap.sources(mesh, np.arange(mesh.size)).tolist()
    assert sorted(sources) == list(range(mesh.size))
    inverse = cmap.inverse().sources(mesh, np.arange(mesh.size)).tolist()
    for d, s in enumerate(sources):
        assert _key(src, s) == _key(dst, d)
        assert inverse[s] == d
    holders_stay = all(sources[d] == d for d in range(mesh.size) if _key(src, d) == _key(dst, d))
    sizes = [[a.size for a in d] for d in src.dims], [[a.size for a in d] for d in dst.dims]
    if all(a == b for a, b in zip(*sizes)) and set(src.used_axes) == set(dst.used_axes):
        assert holders_stay  # axes of equal sizes swapped: nobody who holds its block moves
    assert step.bytes_received(src) == max(_p2p_device_bytes(step, src))
    assert cost.step_axes(step, src) == _varying(mesh, [(d, s) for d, s in enumerate(sources) if s != d])


@settings(max_examples=100, deadline=None)
@given(permute_pairs(), st.data())
def test_plan_bytes_add_point_to_point_steps_per_device(pair, data):
    """A plan with a permute and an exchange receives the most that any one device receives over both, not
    the sum of the steps' maxima."""
    src, mid = pair
    dims, _ = data.draw(layouts(src.mesh, src.rank, partial=False, sub_axes=0.3))
    try:
        plan = Plan.from_steps(src, [S.Permute(mid.dims), S.Exchange(dims)])
    except ShardingError:  # sub-axes of two decompositions of one mesh axis
        assume(False)
    per_device = np.sum([_p2p_device_bytes(s, t) for s, t in zip(plan.steps, plan.types)], axis=0)
    assert plan.bytes_received == per_device.max()
    assert redist.verify(plan).ok


@settings(max_examples=100, deadline=None)
@given(type_pairs(max_rank=3, partial=False, uneven=True))
def test_exchange_axes_are_those_some_sender_differs_on(pair):
    src, dst = pair
    mesh = src.mesh
    (ins,) = lower_step(S.Exchange(dst.dims), src)
    pairs = [(d, c.source) for d in range(mesh.size) for c in ins.copies(mesh, d) if c.source != d]
    assert cost.step_axes(S.Exchange(dst.dims), src) == _varying(mesh, pairs)


# ---------------------------------------------------------------------- XLA's replica groups as axes
def _groups_to_axes_by_search(mesh: Mesh, groups):
    """The search over tuples of prime sub-axes that :func:`groups_to_axes` replaced, over every order of each
    axis's prime factors (6 = 2·3 = 3·2: a group may read the axis either way)."""
    from redist.axes import Axis, canonical_axes
    from redist.errors import ShardingError

    primes = set()
    for name, size in mesh.axes:
        for factors in set(itertools.permutations(prime_factors(size))):
            pre = 1
            for q in factors:
                primes.add(Axis(name, pre, q, size))
                pre *= q
    primes = sorted(primes)
    k = len(groups[0])
    if k == 1:
        return ()
    for r in range(1, len(primes) + 1):
        for order in itertools.permutations(primes, r):
            if mesh.group_size(order) != k:
                continue
            try:
                found = set(map(tuple, mesh.groups(order))) == set(groups)
            except ShardingError:  # factors of two decompositions of one axis
                continue
            if found:
                return canonical_axes(order)
    return None


@settings(max_examples=60, deadline=None)
@given(meshes(max_axes=3, max_devices=24, min_devices=2), st.data())
def test_groups_to_axes_reads_the_axes_back(mesh, data):
    primes = []
    for name, size in mesh.axes:
        pre = 1
        for q in prime_factors(size):
            primes.append((name, pre, q))
            pre *= q
    picked = data.draw(st.lists(st.sampled_from(primes), unique=True, max_size=3))
    groups = _mesh_groups(mesh.axes, np.arange(mesh.size), picked)
    assert groups_to_axes(mesh, groups) == _groups_to_axes_by_search(mesh, groups)
    shuffled = tuple(tuple(data.draw(st.permutations(g))) for g in groups)
    assert groups_to_axes(mesh, shuffled) == _groups_to_axes_by_search(mesh, shuffled)


# ---------------------------------------------------------------------- large meshes stay fast
def _timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def _rank8_on_16_axes(n: int, shift: int):
    mesh = Mesh({f"a{i}": 2 for i in range(16)})
    dims = [(f"a{2 * i}", f"a{2 * i + 1}") for i in range(8)]
    src = ShardingType(mesh, (n,) * 8, "f32", dims)
    return src, src.replace(dims=tuple(dims[(i + shift) % 8] for i in range(8)))


LARGE = [
    # (mesh, src, dst, the plan's one step): 65,536 devices, then 4,096 uneven, then rank 8 on 16 axes
    ("x=256,y=256", "f32[4096{x}, 4096{y}]", "f32[4096{y}, 4096{x}]", S.Permute),
    ("x=16,y=16,z=16", "f32[1000{x}, 1000{y,z}]", "f32[1000{y,z}, 1000{x}]", S.Exchange),
    ("x=16,y=16,z=16", "f32[4096{x:(1)4,y}, 64{z}, 16{x:(4)4}]", "f32[4096{y,z}, 64{x:(4)4}, 16{x:(1)4}]", S.Exchange),
    ("x=64,y=64", "f32[70000{x}]", "f32[70000{y,x}]", S.Exchange),  # 3,945 segments
    (None, 8, 1, S.Permute),
    (None, 9, 3, S.Exchange),
]


@pytest.mark.parametrize("mesh_text, a, b, kind", LARGE)
def test_large_meshes_account_lower_and_prove_in_seconds(mesh_text, a, b, kind):
    """The lower bound, the bytes received and the lowering are symbolic, not device by device: each takes
    seconds at most on 65,536 devices, an uneven exchange on 4,096 and rank 8 on 16 axes, and verify proves
    each plan within 30 s."""
    if mesh_text is None:
        src, dst = _rank8_on_16_axes(a, b)
    else:
        mesh = Mesh.parse(mesh_text)
        src, dst = ShardingType.parse(a, mesh), ShardingType.parse(b, mesh)
    plan = Plan.from_steps(src, [kind(dst.dims)])
    bound, t_bound = _timed(lambda: lower_bound_bytes(src, dst))
    received, t_bytes = _timed(lambda: plan.bytes_received)
    program, t_lower = _timed(lambda: plan.program)
    assert received == bound and bound > 0
    assert t_bound < 2 and t_bytes < 2 and t_lower < 2, (t_bound, t_bytes, t_lower)
    verdict = redist.verify(plan, timeout_s=120)
    assert verdict.ok and verdict.seconds < 30, (verdict.status, verdict.seconds)
    ins = program.instructions[0]
    if isinstance(ins, P.Exchange):  # what one MPI rank computes for itself
        _, t_rank = _timed(lambda: (ins.copies(src.mesh, 1234), ins.copies_from(src.mesh, 1234)))
        assert t_rank < 2, t_rank


def test_transpose_on_a_million_devices_is_bounded_and_lowered_at_once():
    """A transpose on x=1000,y=1000 is synthesized at the lower bound and lowered to one permute between
    groups of axes, within seconds: nothing is listed per device."""
    mesh = Mesh.parse("x=1000,y=1000")
    src, dst = ShardingType.parse("f32[4000{x}, 4000{y}]", mesh), ShardingType.parse("f32[4000{y}, 4000{x}]", mesh)
    (plan, program), seconds = _timed(lambda: (synthesize(src, dst), synthesize(src, dst).program))
    assert plan.bytes_received == lower_bound_bytes(src, dst) == src.local_bytes
    assert [str(g) for g in program.instructions[0].sources.groups] == ["(('x',), ('y',))", "(('y',), ('x',))"]
    assert seconds < 5, seconds


def test_groups_to_axes_on_1024_devices_is_linear():
    """``groups_to_axes`` reads a group's axes over the whole of x=4,y=16,z=16 without trying every subset and
    order of prime sub-axes with a pass over the devices each."""
    mesh = Mesh.parse("x=4,y=16,z=16")
    groups = _mesh_groups(mesh.axes, np.arange(mesh.size), [("z", 2, 8), ("x", 1, 4), ("y", 1, 16), ("z", 1, 2)])
    axes, seconds = _timed(lambda: groups_to_axes(mesh, groups))
    assert axes == ("z:(2)8", "x", "y", "z:(1)2") and seconds < 2, seconds


# ---------------------------------------------------------------------- the largest meshes, within 4 GiB
_UNDER_4_GIB = """if True:
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    import redist
    from redist import Mesh, Plan, ShardingType, cost
    from redist import steps as S
    mesh = Mesh.parse(sys.argv[1])
    T = lambda text: ShardingType.parse(text, mesh)
    try:
        print(repr(eval(sys.argv[2])))
    except redist.ShardingError as e:
        print("refused:", e)
"""

XY = "x=32768,y=32768"  # 2^30 devices
PRIME = "x=2147483647"  # 2^31 - 1 devices, the most a mesh may have
REFUSED = None
LARGEST = [
    # (mesh, what runs (T reads a type on the mesh), its repr, or REFUSED: a ShardingError naming the limit)
    # the permute of a swap: its axes from the groups, not from 2^30 classes of devices (16 GiB)
    (XY, "cost.step_axes(S.Permute((('y',), ('x',))), T('f32[65536{x}, 65536{y}]'))", "('x', 'y')"),
    (XY, "[str(s) for s in redist.synthesize(T('f32[65536{x}, 65536{y}]'), T('f32[65536{y}, 65536{x}]'), "
         "topology='2x8-nodes').steps]", "['permute(to [{y}, {x}])']"),
    ("x=1073741824", "[str(s) for s in redist.synthesize(T('f32[2147483648{x:(1)32768}]'), "
                     "T('f32[2147483648{x:(32768)32768}]'), topology='tpu-v4').steps]",
     "['permute(to [{x:(32768)32768}])']"),
    # the exchange candidate of an all-gather: its copies counted from three devices' blocks, not from segment
    # tables of 2^31 - 1 blocks (hours, then the memory)
    (PRIME, "[str(s) for s in redist.synthesize(T('f32[2147483647{x}]'), T('f32[2147483647]'), "
            "topology='tpu-v4').steps]", "['all_gather(dim 0, {x})']"),
    (PRIME, "cost.exchange_time_lower_bound(S.Exchange(((),)), T('f32[2147483647{x}]'), "
            "cost.topology('tpu-v4', mesh)) > 0", "True"),
    # a candidate whose bytes need 2^31 classes of devices (32 GiB) is passed over
    ("x=46341,y=46340", "[str(s) for s in redist.synthesize(T('f32[100000, 100000] partial{x}'), "
                        "T('f32[100000{y}, 100000{x}]')).steps]",
     "['reduce_scatter(dim 1, {x})', 'exchange(to [{y}, {x}])']"),
    # per class of devices or per device, where the classes are the devices: refused (16 or 8 GiB)
    (XY, "redist.lower_bound_bytes(T('f32[65536{x,y}]'), T('f32[65536{y,x}]'))", REFUSED),
    (XY, "redist.lower_bound_bytes(T('f32[65536{x}, 65536]'), T('f32[65536, 65536] partial{x,y}'))", REFUSED),
    (XY, "Plan.from_steps(T('f32[65536{x}, 65536{y}]'), [S.Permute((('y',), ('x',))), "
         "S.Exchange((('x',), ('y',)))]).bytes_received", REFUSED),
    (XY, "cost.exchange_time(S.Exchange((('y',), ('x',))), T('f32[65536{x}, 65536{y}]'), "
         "cost.topology('tpu-v4', mesh))", REFUSED),
]


@pytest.mark.parametrize("mesh_text, expression, expected", LARGEST)
def test_the_largest_meshes_are_accounted_or_refused_within_4_gib(mesh_text, expression, expected):
    """On meshes of 2^30 to 2^31 - 1 devices, the accounting stays symbolic where it can (a permute's axes, an
    exchange's copies per device, candidates it can count) and refuses with a ShardingError naming the limit
    where it would list the devices or classes of them one by one, which would take numpy arrays of 8 to 32
    GiB (a MemoryError) or tables of billions of segments. Each runs in a child capped at 4 GiB of address space,
    so that a regression fails rather than takes the machine's memory, and within the 120 s bound."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")  # no thread buffers under the cap
    out = subprocess.run([sys.executable, "-c", _UNDER_4_GIB, mesh_text, expression], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    if expected is REFUSED:
        assert out.stdout.startswith("refused: ") and "over the limit of 4,194,304 (redist.blocks.MAX_LISTED)" in \
            out.stdout, out.stdout
    else:
        assert out.stdout.strip() == expected


# ---------------------------------------------------------------------- the verifier reads the compact forms
def test_verifier_refuses_an_exchange_naming_a_size_1_source_axis_twice():
    """The backends refuse an exchange whose dims name one source axis twice, even one of size 1; the verifier
    proved it (a mutant of proofs/mutation.py's ``exchange_axes``, found at 300 plans)."""
    mesh = Mesh.parse("a0=2,a1=4,a2=1")
    src = ShardingType.parse("f32[4{a0}, 2{a2}, 5]", mesh)
    dst = ShardingType.parse("f32[4{a0,a2}, 2, 5{a1:(2)2}]", mesh)
    good = Plan.from_steps(src, [S.Exchange(dst.dims)]).program
    x = good.instructions[0]
    assert x.dims[0].source_axes == ("a0",) and x.dims[1].source_axes == ("a2",)
    swapped = P.ExchangeDim(x.dims[0].axes, x.dims[0].source_axes, x.dims[0].segments)  # reads (a0, a2)
    bad = P.Program(mesh, good.dtype, (P.Exchange(x.shape, (swapped,) + x.dims[1:]),), good.shapes)
    with pytest.raises(ShardingError, match="named twice"):
        P.shape_after(bad.instructions[0], good.shapes[0], mesh)
    assert verify_program(good, src, dst).ok
    verdict = verify_program(bad, src, dst)
    assert verdict.status == "refuted" and "overlap" in verdict.reason, verdict.reason


# ---------------------------------------------------------------------- device orders around the compact forms
ORDERED = Mesh({"x": 2, "y": 2, "z": 2}).reordered([5, 3, 7, 1, 4, 2, 0, 6])


@pytest.mark.parametrize("steps, lowered", [
    # an exchange to another order, then a collective there (on the program's mesh)
    (lambda ids: [S.Exchange((("y",), ()), ids), S.AllGather(0, ("y",))], ["copy table", "AllGather"]),
    # a collective, then an exchange to another order
    (lambda ids: [S.AllSlice(1, ("z",)), S.Exchange(((), ("x", "y")), ids)], ["Slice", "copy table"]),
    # a compact permute, an exchange to another order and a permute there (off the program's mesh: a table)
    (lambda ids: [S.Permute((("y",), ("x",))), S.Exchange((("x",), ("y",)), ids), S.Permute((("y",), ("x",)))],
     ["map", "copy table", "table"]),
])
def test_changes_of_device_order_lower_around_the_compact_forms(steps, lowered):
    """A permute or an exchange between two device orders, or on the order that is not the program's, lowers
    to a table over the devices (sources, copies per device), the others to the compact forms on the
    program's mesh; the plan's bytes are counted per device from the instructions, and the program runs and
    is proved."""
    from redist.data import summands, unshard
    from redist.program import point_to_point_bytes

    src = ShardingType.parse("f32[8{x}, 8{y}]", Mesh({"x": 2, "y": 2, "z": 2}))
    plan = Plan.from_steps(src, steps(ORDERED.device_ids))
    program = plan.program
    assert plan.dst.mesh == ORDERED and program.dst_mesh == ORDERED
    kinds = ["map" if isinstance(getattr(i, "sources", None), P.CoordinateMap)
             else "table" if isinstance(i, P.CollectivePermute)
             else "copy table" if isinstance(getattr(i, "dims", None), P.CopyTable)
             else type(i).__name__ for i in program.instructions]
    assert kinds == lowered
    assert redist.verify(plan).ok and plan.bytes_received > 0  # the verifier counts the program's bytes too
    mesh, brute = program.mesh, np.zeros(program.mesh.size, np.int64)
    for ins, shape in zip(program.instructions, program.shapes):
        for d in range(mesh.size):
            if isinstance(ins, P.CollectivePermute):
                brute[d] += (ins.source_of(mesh, d) != d) * math.prod(shape) * 4
            elif isinstance(ins, P.Exchange):
                brute[d] += sum(math.prod(c.size) for c in ins.copies(mesh, d) if c.source != d) * 4
    assert point_to_point_bytes(program).tolist() == brute.tolist()
    uniform = sum(s.bytes_received(t) for s, t in zip(plan.steps, plan.types)
                  if not isinstance(s, (S.Permute, S.Exchange)))
    assert plan.bytes_received == uniform + brute.max()
    value = np.arange(64, dtype=np.float32).reshape(8, 8)
    rng = np.random.default_rng(0)
    out = redist.execute(plan, summands(src, value, rng))
    np.testing.assert_array_equal(unshard(plan.dst, out), value)
