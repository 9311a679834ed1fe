"""Worker for tests/redist/test_mpi_backend.py and proofs/differential.py, run under ``mpiexec -n N`` (launched by
tests/redist/mpi_launch.py); each mode prints one summary line.

    windowed MODE ...  MODE with one shift per window of the personalised exchanges (mpi_backend.WINDOW = 1)
    cases SEED COUNT [UNEVEN [CREATE]]
                       classic and COUNT random (seeded) reshards on the meshes of size N, then UNEVEN
                       (default 0) random pairs with padding plus named uneven cases (uneven reduce-scatters
                       among them), then CREATE (default 0) random pairs whose destination may create pending
                       sums plus named creation cases, against the numpy backend:
                       ``ranks=N cases=C passed=P core_mismatch=M subcomms_stable=1``,
                       ``uneven cases=U passed=Q exchanges=E`` and ``creation cases=K passed=R created=S``
    errors             argument errors must raise ShardingError on every rank: ``errors=E all_raised=A``
    agreement          the full argument agreement runs once per combination (when asked, and after a
                       disagreement), and mismatches between agreed combinations still raise on every rank:
                       ``agreement full=F expected=X errors=E all_raised=A correct=C of N``
    exact_sums         pending sums of random fractional values scattered evenly, every reduction kind and float
                       or complex dtype, must equal the numpy backend's bit for bit:
                       ``exact sums cases=C equal=E``
    fresh              results are new arrays, lossless inputs are accepted:
                       ``fresh plans=P fresh=F lossless inputs=L accepted=A``
    memory             tracemalloc peak per reshard: ``memory cases=C within=W worst_ratio=R ...``
    fail               rank 0 raises in the middle of a plan; abort_on_error must end the job
    after_block MARKER RANK
                       RANK raises inside abort_on_error (-1: no rank); each rank past the block writes
                       MARKER.<rank>
    high_rank          rank-64 reshards (numpy's largest rank) on 4 ranks against the numpy backend, and a plan whose
                       program needs 65 dims refused on every rank: ``high_rank cases=C passed=P refused=R``
    exit_in_block RANK CODE
                       RANK calls sys.exit(CODE) inside abort_on_error ("none": sys.exit()), the others wait in
                       a barrier; abort_on_error must end the job
    differential SEED FIRST COUNT
                       cases FIRST... of ``python -m proofs.differential --mpi``: ``differential {json tally}``
    cross_mesh SEED COUNT
                       reshards between meshes of other devices or axes (named cases: stages on disjoint ranks,
                       overlapping ones, 8 -> 6, 4 -> 8, x=8 -> a=2,b=4, uneven dims, pending sums; then COUNT
                       random pairs on meshes of device ids below N), each twice (the second on the agreed
                       combination), every rank calling (None in, None out outside a mesh); then argument
                       errors: ``cross_mesh cases=C passed=P disjoint=D overlapping=O same_devices=S
                       other_sizes=Z partial=Q uneven=U idle=I errors=E all_raised=A``

Every rank derives the same cases from the same seed (:mod:`redist.testing`), computes every device's buffer
(:func:`redist.data.poisoned_source`: summands of a partial source, poisoned padding) and the numpy backend's
result, runs its own part through redist.mpi.reshard, and checks it exactly.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import tracemalloc

import numpy as np
from mpi4py import MPI

import redist
import redist.mpi
from redist import program as P
from redist.backends import interpreter, mpi_backend, mpi_channels, mpi_placement
from redist.data import poisoned_source
from redist.testing import SeededDraw, draw_cross_mesh_pair, draw_device_order, draw_mesh_pair, draw_pair
from redist.types import REDUCTIONS

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()

MESHES = {
    4: [(4,), (2, 2)],
    6: [(6,), (2, 3), (3, 2)],
    8: [(8,), (2, 4), (4, 2), (2, 2, 2)],
}
NAMES = ("x", "y", "z")
DTYPES = ("f64", "f64", "f64", "f32", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "bool", "c64", "c128")


def say(*args) -> None:
    if RANK == 0:
        print(*args, flush=True)


def all_true(flag: bool) -> bool:
    return bool(COMM.allreduce(int(flag), op=MPI.MIN))


# ------------------------------------------------------------------------------------ case generation
def make_mesh(shape) -> redist.Mesh:
    return redist.Mesh({n: s for n, s in zip(NAMES, shape)})


def random_pair(seed: int, i: int, mesh: redist.Mesh, uneven: bool = False, create: bool = False):
    """Random case ``i``: a pair on ``mesh`` or ``mesh`` in a random device order (sub-axes, partial sources of
    every reduction kind, every dtype of :data:`DTYPES`, destinations in another device order; with ``uneven``,
    padding on some side; with ``create``, pending sums that the destination creates, even or uneven), a
    function of the arguments alone, so that every rank draws it."""
    if create:  # drawn until the destination creates some: draw_pair creates over few axes
        draw = SeededDraw(f"mpi_worker:{seed}:{i}:create")
        while True:
            src, dst = draw_pair(draw, draw_device_order(draw, mesh, 0.3), partial=0.4, sub_axes=0.3, dtype=DTYPES,
                                 multipliers=(1, 2), uneven=0.3, reorder=0.3, create=1.0)
            if not set(dst.partial) <= set(src.partial):
                return src, dst
    draw = SeededDraw(f"mpi_worker:{seed}:{i}:{uneven}")
    return draw_pair(draw, draw_device_order(draw, mesh, 0.3), partial=0.4, sub_axes=0.3, dtype=DTYPES,
                     multipliers=(1, 2), uneven=uneven, reductions=REDUCTIONS, reorder=0.3)


def classic_pairs(mesh_shape) -> list[tuple[str, str, str]]:
    """(mesh, src, dst) texts: transposes, gathers, axis reorders, reductions, the sub-axis case."""
    n = math.prod(mesh_shape)
    out = [
        ("x=%d" % n, f"f32[{2 * n}{{x}}, 6]", f"f32[{2 * n}, 6]"),
        ("x=%d" % n, f"f32[{2 * n}{{x}}, {n}]", f"f32[{2 * n}, {n}{{x}}]"),
        ("x=%d" % n, f"f64[{n}, 4] partial{{x}}", f"f64[{n}{{x}}, 4]"),
        ("x=%d" % n, f"f64[{n}, 4] partial{{x}}", f"f64[{n}, 4]"),
        ("x=%d" % n, f"f32[{n}]", f"f32[{n}{{x}}]"),
    ]
    if len(mesh_shape) == 3:
        m = "x=%d,y=%d,z=%d" % mesh_shape
        out += [
            (m, f"f32[{n}{{x,y,z}}]", f"f32[{n}{{z,y,x}}]"),
            (m, "f32[4{x}, 4{y}, 4{z}]", "f32[4{z}, 4{x}, 4{y}]"),
            (m, f"f64[{n}, {n}] partial{{x,z}}", f"f64[{n}{{y}}, {n}{{x,z}}]"),
            (m, f"i32[{n}{{z}}, 6]", f"i32[{n}{{x,y,z}}, 6]"),
        ]
    if len(mesh_shape) == 2:
        a, b = mesh_shape[0], mesh_shape[1]
        m = f"x={a},y={b}"
        out += [
            (m, f"f32[{a * b}{{x}}, {a * b}{{y}}]", f"f32[{a * b}{{y}}, {a * b}{{x}}]"),   # transpose
            (m, f"f32[{2 * a * b}{{x,y}}, 3]", f"f32[{2 * a * b}{{y,x}}, 3]"),              # axis reorder
            (m, f"f32[{a * b}{{x,y}}, 4]", f"f32[{a * b}, 4]"),                             # gather all
            (m, f"f32[{a * b}{{x,y}}, {a * b}]", f"f32[{a * b}, {a * b}{{x}}]"),
            (m, f"f64[{a * b}, {a * b}] partial{{x,y}}", f"f64[{a * b}{{y}}, {a * b}{{x}}]"),
            (m, f"f64[{a * b}, {a * b}] partial{{x,y}}", f"f64[{a * b}, {a * b}] partial{{y}}"),
            (m, f"bf16[{a * b}{{x}}, {a * b}]", f"bf16[{a * b}, {a * b}{{x,y}}]"),
            (m, f"f32[{2 * b}{{y}}, {2 * a}{{x}}, {2 * a}, {b}]", f"f32[{2 * b}, {2 * a}, {2 * a}{{x}}, {b}{{y}}]"),
        ]
    if mesh_shape == (4, 2):  # P('y', None, 'x') -> P(None, ('x', 'y'), None)
        out.append(("x=4,y=2", "f32[8{y}, 16, 8{x}]", "f32[8, 16{x,y}, 8]"))
    if mesh_shape == (2, 4):  # a sub-axis case
        out.append(("x=2,y=4", "f32[4{x}]", "f32[4{y}]"))
        out.append(("x=2,y=4", "f32[8{y}, 4]", "f32[8{x}, 4{y}]"))
    return out


def uneven_pairs(seed: int, count: int) -> list[tuple[redist.ShardingType, redist.ShardingType]]:
    """``count`` random pairs with padding on the meshes of this size, then the named cases."""
    pairs = [random_pair(seed, i, make_mesh(MESHES[SIZE][i % len(MESHES[SIZE])]), uneven=True)
             for i in range(count)]
    for mtext, a, b in uneven_named_pairs():
        mesh = redist.Mesh.parse(mtext)
        pairs.append((redist.ShardingType.parse(a, mesh), redist.ShardingType.parse(b, mesh)))
    return pairs


def uneven_named_pairs() -> list[tuple[str, str, str]]:
    """(mesh, src, dst) texts with non-divisible dims, on a 1-d mesh of this size and, for 4 and 8, a 2-d one."""
    n = SIZE
    out = [
        (f"x={n}", f"f32[{2 * n + 5}{{x}}, 6]", f"f32[{2 * n + 5}, 6{{x}}]"),   # f32[13{x}, 6] on x=4
        (f"x={n}", "f32[5]", "f32[5{x}]"),
        (f"x={n}", "f32[5{x}]", "f32[5]"),
        (f"x={n}", f"i32[{n + 1}{{x}}, 3]", f"i32[{n + 1}, 3{{x}}]"),
        (f"x={n}", f"bool[{n - 1}{{x}}, 3]", f"bool[{n - 1}, 3{{x}}]"),
    ]
    if n in (4, 8):
        m = f"x=2,y={n // 2}"
        out += [
            (m, "f32[5{x}, 3]", "f32[5{y}, 3{x}]"),
            (m, "f32[7{x,y}]", "f32[7{y,x}]"),
            (m, "f64[5{x}, 3] partial{y}", "f64[5{y}, 3{x}]"),   # a reduced axis
            (m, "f64[3, 7{y}] partial{x}", "f64[3{x}, 7]"),
            (m, "bf16[5{x}, 9{y}]", "bf16[5{y,x}, 9]"),
            (m, "f32[7, 8] partial{x,y}", "f32[7{x}, 8{y}]"),   # two reduce-scatters, the first uneven
        ]
    # reduce-scatters with uneven counts: (4, 4, 4, 1) rows on x=4, and a dim shorter than the group
    out += [(f"x={n}", f"f32[{2 * n + 5}, 3] partial{{x}}", f"f32[{2 * n + 5}{{x}}, 3]"),
            (f"x={n}", f"i64[{n - 1}, 2] partial{{x}}", f"i64[{n - 1}{{x}}, 2]"),
            (f"x={n}", "bf16[5, 3] partial{x}", "bf16[5{x}, 3]"),
            (f"x={n}", f"f32[{2 * n + 5}, 3] partial(max){{x}}", f"f32[{2 * n + 5}{{x}}, 3]"),
            (f"x={n}", f"i32[{n + 1}, 2] partial(min){{x}}", f"i32[{n + 1}{{x}}, 2]")]
    return out


def creation_pairs(seed: int, count: int) -> list[tuple[redist.ShardingType, redist.ShardingType]]:
    """``count`` random pairs whose destination may create pending sums (on the meshes of this size), then
    named creation cases (Shardy's replicated and sharded to unreduced, onto a sub-axis, with a reduction)."""
    pairs = [random_pair(seed, i, make_mesh(MESHES[SIZE][i % len(MESHES[SIZE])]), create=True)
             for i in range(count)]
    n, (a, b) = SIZE, MESHES[SIZE][1]
    named = [
        (f"x={n}", f"f32[{2 * n}{{x}}, 4]", f"f32[{2 * n}, 4] partial{{x}}"),     # sharded to unreduced
        (f"x={n}", "f64[3, 4]", "f64[3, 4] partial{x}"),                          # replicated to unreduced
        (f"x={n}", "i32[5{x}, 2]", "i32[5, 2] partial{x}"),                       # uneven: placed in place
        (f"x={a},y={b}", f"f32[{2 * b}{{y}}, 8] partial{{x}}", f"f32[{2 * b}, 8] partial{{x,y}}"),
        (f"x={a},y={b}", "f64[8] partial{x}", "f64[8] partial{y}"),               # reduce one, create another
        (f"x={a},y={b}", f"bool[{2 * a}{{x}}, 3]", f"bool[{2 * a}, 3] partial{{x,y}}"),
    ]
    if b == 4:
        named.append((f"x={a},y=4", "f32[16, 8]", "f32[16, 8] partial{y:(1)2}"))  # onto a sub-axis
    for mtext, x, y in named:
        mesh = redist.Mesh.parse(mtext)
        pairs.append((redist.ShardingType.parse(x, mesh), redist.ShardingType.parse(y, mesh)))
    return pairs



# ------------------------------------------------------------------------------------ modes
KINDS: dict[str, int] = {}
FEATURES: dict[str, int] = {}  # features of the cases run (reduction kinds, device orders, complex)


def run_case(src, dst, rng, failures: list, label: str) -> tuple[bool, bool]:
    """(passed, core_ok) for one case: random integer values (summands for a partial source) with poisoned
    padding; this rank's result must equal the numpy backend's buffer (NaN padding included) and the numpy
    backend's result must unshard to the value. All ranks return the same."""
    plan = redist.synthesize(src, dst)
    for ins in plan.program.instructions:
        KINDS[type(ins).__name__] = KINDS.get(type(ins).__name__, 0) + 1
    program = plan.program
    moving = [ins for ins in program.instructions if not isinstance(ins, P.Reshape)]
    placed = mpi_placement.unpackings(program)
    unpacked = [type(ins) for ins in moving[:2]] == [P.AllToAll, P.Transpose] and id(moving[0]) not in placed
    packed = [type(ins) for ins in moving[:2]] == [P.Transpose, P.AllToAll]
    gathered = any(isinstance(ins, P.AllGather) and math.prod(shape[: ins.dim]) > 1
                   and mpi_placement.gathers_in_place(shape, ins.dim, np.dtype(program.dtype).itemsize)
                   for ins, shape in zip(program.instructions, program.shapes))
    ctx = mpi_channels.context(COMM)
    allgathered = any(isinstance(ins, P.AllGather) and math.prod(shape) > 0 and mpi_placement.gathers_with_allgather(
        ctx.ranks_per_core, math.prod(shape[: ins.dim]),
        math.prod(shape) * src.mesh.group_size(ins.axes) * src.itemsize)
        for ins, shape in zip(program.instructions, program.shapes))
    for feature in ([f"partial({src.reduction})"] * bool(src.partial) + ["device order"] * (src.mesh != dst.mesh)
                    + ["reordered mesh"] * (not src.mesh.is_row_major) + [src.dtype] * (src.dtype in ("c64", "c128"))
                    + ["own row unpacked from the input"] * unpacked + ["own row packed from the input"] * packed
                    + ["all-to-all rows received in place"] * bool(placed)
                    + ["all-gather chunks received in place"] * gathered
                    + ["all-gather by MPI's Allgather"] * allgathered):
        FEATURES[feature] = FEATURES.get(feature, 0) + 1
    value, shards = poisoned_source(src, rng)
    expected = redist.execute(plan, shards)
    core_ok = np.array_equal(redist.unshard(dst, expected), value)
    out = redist.mpi.reshard(shards[RANK].copy(), src, dst, COMM)
    mine = (out.shape == dst.local_shape and out.dtype == dst.np_dtype
            and np.array_equal(out, expected[RANK], equal_nan=True))
    ok = all_true(mine)
    if not ok and len(failures) < 5:
        failures.append(f"{label}: {src} -> {dst}\n{plan.program}")
    return ok, core_ok


def communicators() -> int:
    """How many communicators redist.mpi holds on COMM: the default channel's groups, every agreed
    combination's channel and groups."""
    ctx = mpi_channels.context(COMM)
    return len(ctx.default.groups) + sum(1 + len(getattr(c, "groups", ())) for a in ctx.agreed.values()
                                         for c in a.channels if c is not None)


def mode_cases(seed: int, count: int, uneven: int, create: int) -> None:
    t0 = time.time()
    cases = passed = mismatched = 0
    failures: list[str] = []
    for mshape in MESHES[SIZE]:
        for mtext, a, b in classic_pairs(mshape):
            mesh = redist.Mesh.parse(mtext)
            src, dst = redist.ShardingType.parse(a, mesh), redist.ShardingType.parse(b, mesh)
            ok, core_ok = run_case(src, dst, np.random.default_rng(seed), failures, "classic")
            cases, passed, mismatched = cases + 1, passed + ok, mismatched + (not core_ok)
    for i in range(count):
        mesh = make_mesh(MESHES[SIZE][i % len(MESHES[SIZE])])
        src, dst = random_pair(seed, i, mesh)
        ok, core_ok = run_case(src, dst, np.random.default_rng([seed, i]), failures, f"random {i}")
        cases, passed, mismatched = cases + 1, passed + ok, mismatched + (not core_ok)
    # Repeating reshards reuses the cached sub-communicators: the cache does not grow.
    mesh = make_mesh(MESHES[SIZE][-1])
    src, dst = random_pair(seed, count, mesh)
    run_case(src, dst, np.random.default_rng(0), failures, "repeat")
    before = communicators()
    for _ in range(3):
        run_case(src, dst, np.random.default_rng(0), failures, "repeat")
    stable = int(communicators() == before)
    u_cases = u_passed = exchanges = 0
    for i, (src, dst) in enumerate(uneven_pairs(seed, uneven)):
        before_ex = KINDS.get("Exchange", 0)
        ok, core_ok = run_case(src, dst, np.random.default_rng([seed, 7, i]), failures, f"uneven {i}")
        exchanges += KINDS.get("Exchange", 0) > before_ex
        u_cases, u_passed, mismatched = u_cases + 1, u_passed + ok, mismatched + (not core_ok)
    c_cases = c_passed = created = 0
    for i, (src, dst) in enumerate(creation_pairs(seed, create)):
        ok, core_ok = run_case(src, dst, np.random.default_rng([seed, 11, i]), failures, f"creation {i}")
        created += not set(dst.partial) <= set(src.partial)
        c_cases, c_passed, mismatched = c_cases + 1, c_passed + ok, mismatched + (not core_ok)
    for f in failures:
        say("FAILED", f)
    say("instructions run:", " ".join(f"{k}={v}" for k, v in sorted(KINDS.items())))
    say("features run:", " ".join(f"{k}={v}" for k, v in sorted(FEATURES.items())))
    say(f"uneven cases={u_cases} passed={u_passed} exchanges={exchanges}")
    say(f"creation cases={c_cases} passed={c_passed} created={created}")
    say(f"ranks={SIZE} cases={cases} passed={passed} core_mismatch={mismatched} subcomms_stable={stable} "
        f"seconds={time.time() - t0:.1f}")


def expect_error(label: str, fn) -> bool:
    try:
        fn()
        raised, msg = False, "no error"
    except redist.ShardingError as e:
        raised, msg = True, str(e)
    everyone = all_true(raised)
    say(f"{label}: all_raised={int(everyone)} rank0: {msg}")
    return everyone


def mode_errors() -> None:
    mesh = make_mesh(MESHES[SIZE][-1])
    src = redist.ShardingType.parse(f"f64[{2 * SIZE}{{x}}, 4]", mesh)
    dst = redist.ShardingType.parse(f"f64[{2 * SIZE}, 4{{{mesh.names[-1]}}}]", mesh)
    other = redist.ShardingType.parse(f"f64[{2 * SIZE}, 4]", mesh)
    good = np.zeros(src.local_shape)
    big = make_mesh((2 * SIZE,))
    bsrc, bdst = (redist.ShardingType.parse(t, big) for t in (f"f64[{2 * SIZE}{{x}}]", f"f64[{2 * SIZE}]"))
    gen = (x for x in good)
    f32 = [redist.ShardingType.parse(str(t).replace("f64", "f32"), mesh) for t in (src, dst)]
    checks = [
        ("wrong comm.size", lambda: redist.mpi.reshard(np.zeros(1), bsrc, bdst, COMM)),
        ('comm="x"', lambda: redist.mpi.reshard(good, src, dst, "x")),
        ("comm=42", lambda: redist.mpi.reshard(good, src, dst, 42)),
        ("comm=COMM_NULL", lambda: redist.mpi.reshard(good, src, dst, MPI.COMM_NULL)),
        ('run_program comm="x"', lambda: redist.mpi.run_program(redist.synthesize(src, dst).program, good, "x")),
        ("run_program of no program", lambda: redist.mpi.run_program("program", good, COMM)),
        ("run_program of an ill-formed program", lambda: redist.mpi.run_program(
            P.Program(mesh, np.dtype(np.float64), (P.AllToAll(mesh.names),), ((1, 4), (1, 4))), np.zeros((1, 4)),
            COMM)),
        ("src None", lambda: redist.mpi.reshard(good, None, dst, COMM)),
        ("src and dst text", lambda: redist.mpi.reshard(good, str(src), str(dst), COMM)),
        ("src object()", lambda: redist.mpi.reshard(good, object(), dst, COMM)),
        ("dst on another mesh", lambda: redist.mpi.reshard(good, src, bdst, COMM)),
        ("local None", lambda: redist.mpi.reshard(None, src, dst, COMM)),
        ("local text on rank 3", lambda: redist.mpi.reshard("abc" if RANK == 3 else good, src, dst, COMM)),
        ("local generator", lambda: redist.mpi.reshard(gen, src, dst, COMM)),
        ("complex local on rank 0",
         lambda: redist.mpi.reshard(good.astype(np.complex128) if RANK == 0 else good, src, dst, COMM)),
        ("f32 src, f64 local", lambda: redist.mpi.reshard(good, *f32, COMM)),
        ("mismatched dst across ranks", lambda: redist.mpi.reshard(good, src, other if RANK == 0 else dst, COMM)),
        ("mismatched src across ranks",
         lambda: redist.mpi.reshard(good, src if RANK != 1 else src.replace(dims=((), ())), dst, COMM)),
        ("wrong local shape on rank 2",
         lambda: redist.mpi.reshard(np.zeros((1, 4)) if RANK == 2 else good, src, dst, COMM)),
        ("lossy dtype on rank 1",
         lambda: redist.mpi.reshard(good.astype(np.int64) if RANK == 1 else good, src, dst, COMM)),
        ("masked local on rank 0",
         lambda: redist.mpi.reshard(np.ma.masked_array(good, mask=good == 0) if RANK == 0 else good, src, dst, COMM)),
        ("no plan (dst of another dtype)",
         lambda: redist.mpi.reshard(good, src, redist.ShardingType.parse(str(dst).replace("f64", "i32"), mesh), COMM)),
    ]
    raised = 0
    for label, fn in checks:
        raised += expect_error(label, fn)
        # The communicator is still usable afterwards.
        x = redist.shard(src, np.arange(2 * SIZE * 4, dtype=np.float64).reshape(2 * SIZE, 4))
        ok = all_true(np.array_equal(redist.mpi.reshard(x[RANK], src, dst, COMM),
                                     redist.execute(redist.synthesize(src, dst), x)[RANK]))
        raised -= not ok
    say(f"errors={len(checks)} all_raised={raised}")


def mode_agreement() -> None:
    mesh = make_mesh(MESHES.get(SIZE, [(SIZE,)])[-1])
    parse = lambda text: redist.ShardingType.parse(text, mesh)  # noqa: E731
    x, y = mesh.names[0], mesh.names[-1]
    k1 = (parse(f"f64[{4 * SIZE}{{{x}}}, 8]"), parse(f"f64[{4 * SIZE}, 8{{{y}}}]"))
    k2 = (k1[1], k1[0])
    k3 = (k1[0], parse(f"f64[{4 * SIZE}, 8]"))
    full = [0]
    agree_fully = redist.mpi._agree_fully

    def counted(*args):
        full[0] += 1
        return agree_fully(*args)

    redist.mpi._agree_fully = counted
    whole = np.arange(4 * SIZE * 8, dtype=np.float64).reshape(4 * SIZE, 8)
    results = []

    def reshard(pair, check=False, local=None):
        src, dst = pair
        shard = redist.shard(src, whole)[RANK] if local is None else local
        out = redist.mpi.reshard(shard, src, dst, COMM, check=check)
        results.append(np.array_equal(out, redist.shard(dst, whole)[RANK]))

    for _ in range(3):
        reshard(k1)  # the second looks the agreement up by value, the third finds it by identity (the last one)
    reshard(tuple(dataclasses.replace(t) for t in k1))  # equal, other objects: by value
    reshard(k2)
    reshard(k3)
    expected = 3  # once per combination
    # a gather run by Iallgather, without the interpreter
    direct = mpi_channels.context(COMM).agreed[k3].channels[0].direct is not None
    errors = [  # (what, the combinations agreed on again first: a disagreement forgets every agreement, the call)
        ("agreed combinations that differ", (), lambda: reshard(k1 if RANK == 0 else k2)),
        ("agreed combinations that differ, one run directly", (k1, k3), lambda: reshard(k3 if RANK == 0 else k1)),
        ("agreed and new combinations", (k1,), lambda: reshard(k1 if RANK == 0 else k3)),
        ("wrong local buffer on rank 1 (agreed combination)", (k1,),
         lambda: reshard(k1, local=np.zeros((1, 1)) if RANK == 1 else None)),
        ("check=True with differing arguments", (), lambda: reshard(k1 if RANK == 0 else k2, check=True)),
    ]
    raised, forgotten, ctx = 0, True, mpi_channels.context(COMM)
    for label, again, fn in errors:
        for pair in again:
            reshard(pair)
        raised += expect_error(label, fn)
        forgotten &= all(ctx.recall(*pair) is None for pair in (k1, k2, k3))  # by identity too
    # every agreeing again, and every disagreement, is a full agreement (which names the ranks)...
    expected += sum(len(again) for _, again, _ in errors) + len(errors)
    reshard(k1, check=RANK == 0)  # ...and forgets every agreement; the other ranks join rank 0's check
    reshard(k1, check=True)
    reshard(k1)
    reshard(k2)
    expected += 3
    correct = all_true(all(results))
    say(f"agreement full={COMM.allreduce(full[0], op=MPI.MAX)} expected={expected} errors={len(errors)} "
        f"all_raised={raised} correct={int(correct)} of {len(results)} direct={int(all_true(direct))} "
        f"forgotten={int(all_true(forgotten))}")


def mode_exact_sums() -> None:
    """Evenly scattered pending sums (a lone ``ReduceScatter``, along the leading dim or an inner one) of
    random fractional values, NaN among them for max and min: the result must be the numpy backend's exactly
    (both reduce in group order), not merely close."""
    mesh = make_mesh((SIZE,))
    rng = np.random.default_rng(5)
    cases = equal = 0
    for dtype in ("f32", "f64", "f16", "bf16", "c64"):
        for reduction in REDUCTIONS:
            if dtype == "c64" and reduction in ("max", "min"):
                continue
            for a, b in ((f"{dtype}[{8 * SIZE}, 24]", f"{dtype}[{8 * SIZE}{{x}}, 24]"),
                         (f"{dtype}[3, {4 * SIZE}, 5]", f"{dtype}[3, {4 * SIZE}{{x}}, 5]")):
                src = redist.ShardingType.parse(f"{a} partial({reduction}){{x}}", mesh)
                dst = redist.ShardingType.parse(b, mesh)
                plan = redist.synthesize(src, dst)
                assert [type(i) for i in plan.program.instructions if not isinstance(i, P.Reshape)] == \
                    [P.ReduceScatter], plan.program
                values = rng.uniform(0.5, 1.5, (SIZE,) + src.local_shape)
                if dtype == "c64":
                    values = values + 1j * rng.uniform(0.5, 1.5, values.shape)
                if reduction in ("max", "min"):
                    values[rng.random(values.shape) < 0.05] = np.nan
                shards = list(values.astype(src.np_dtype))
                expected = redist.execute(plan, shards)[RANK]
                out = redist.mpi.reshard(shards[RANK], src, dst, COMM)
                cases += 1
                equal += all_true(out.dtype == expected.dtype and np.array_equal(out, expected, equal_nan=True))
    say(f"exact sums cases={cases} equal={equal}")


def mode_fresh() -> None:
    """Results are new arrays: never ``local`` nor its memory, not on a rank whose buffer stays put (identity,
    permute-only, pad/unpad plans), not from ``run_program`` after a transpose that numpy makes as a view;
    writing into a result leaves ``local`` as it was. Lossless inputs (i8
    data and Python ints for an i32 type) are accepted and give the type's dtype."""
    mesh = make_mesh(MESHES[SIZE][-1])
    n = mesh.size
    x, y = mesh.names[0], mesh.names[-1]
    pairs = [(f"f64[{2 * n}{{{x}}}]", f"f64[{2 * n}{{{x}}}]"),                    # no step
             (f"f64[{2 * n}{{{x},{y}}}]", f"f64[{2 * n}{{{y},{x}}}]"),            # one permute
             (f"f64[{2 * n - 1}{{{x},{y}}}]", f"f64[{2 * n - 1}{{{y},{x}}}]"),    # pad, permute, unpad
             (f"f64[{n}{{{x}}}, 4]", f"f64[{n}, 4{{{x}}}]")]
    fresh = checked = 0
    for a, b in pairs:
        src, dst = redist.ShardingType.parse(a, mesh), redist.ShardingType.parse(b, mesh)
        value = np.arange(np.prod(src.shape), dtype=np.float64).reshape(src.shape)
        local = redist.shard(src, value)[RANK]
        kept = local.copy()
        out = redist.mpi.reshard(local, src, dst, COMM)
        ok = not np.shares_memory(out, local) and out.flags.writeable and out.flags.c_contiguous
        out[...] = -1
        ok = ok and np.array_equal(local, kept)
        fresh += all_true(ok)
        checked += 1
        say(f"  {a} -> {b}: {[s.kind for s in redist.synthesize(src, dst).steps]} fresh={int(all_true(ok))}")
    # run_program on the caller's own buffer: a transpose that only moves a dim of size 1 is a view in numpy,
    # and the all-reduce after it must still not sum into the caller's buffer.
    program = P.Program(mesh, np.dtype(np.float64), (P.Transpose((1, 0)), P.AllReduce(mesh.names)),
                        ((1, 4), (4, 1), (4, 1)))
    local = np.full((1, 4), float(RANK))
    out = redist.mpi.run_program(program, local, COMM)
    ok = np.array_equal(local, np.full((1, 4), float(RANK))) and np.array_equal(out, np.full((4, 1), n * (n - 1) / 2))
    fresh += all_true(ok and not np.shares_memory(out, local))
    checked += 1
    say(f"  run_program [Transpose of a unit dim, AllReduce] on the caller's buffer: fresh={int(all_true(ok))}")
    src, dst = (redist.ShardingType.parse(t, mesh) for t in (f"i32[{n}{{{x}}}, 4]", f"i32[{n}, 4{{{x}}}]"))
    value = np.arange(4 * n, dtype=np.int32).reshape(n, 4) - 2 * n
    want = redist.execute(redist.synthesize(src, dst), redist.shard(src, value))[RANK]
    local = redist.shard(src, value)[RANK]
    lossless = 0
    for given in (local.astype(np.int8), local.tolist()):
        out = redist.mpi.reshard(given, src, dst, COMM)
        lossless += all_true(out.dtype == np.int32 and np.array_equal(out, want))
    say(f"fresh plans={checked} fresh={fresh} lossless inputs=2 accepted={lossless}")


def mode_after_block(marker: str, failing_rank: int) -> None:
    """Rank ``failing_rank`` raises inside ``abort_on_error`` (-1: none does); every rank that gets past the
    block writes ``marker.RANK``. After an abort no rank may have written its file."""
    with redist.mpi.abort_on_error(COMM):
        if RANK == failing_rank:
            raise RuntimeError(f"injected failure on rank {RANK} inside abort_on_error")
        COMM.Barrier()
    with open(f"{marker}.{RANK}", "w") as f:
        f.write("after the block\n")
    say("after_block: every rank got past the block")


HIGH_RANK_PAIRS = [  # rank 64 on x=2,y=2: (source dims, destination dims), the others of size 1
    ({0: "3{x}", 7: "5{y}"}, {0: "3{y}", 7: "5{x}"}),          # an exchange
    ({0: "4{x}", 63: "4{y}"}, {0: "4{y}", 63: "4{x}"}),         # a permute
    ({0: "4{x,y}", 5: "2"}, {0: "4", 5: "2"}),                  # an all-gather
    ({0: "4", 1: "2", "partial": "{x,y}"}, {0: "4{x,y}", 1: "2"}),  # a reduce-scatter
]


def mode_high_rank() -> None:
    mesh = make_mesh((2, 2))

    def typed(dims):
        text = "f32[" + ", ".join(dims.get(i, "1") for i in range(64)) + "]"
        return redist.ShardingType.parse(text + (f" partial{dims['partial']}" if "partial" in dims else ""), mesh)

    passed = 0
    for a, b in HIGH_RANK_PAIRS:
        src, dst = typed(a), typed(b)
        value = np.arange(math.prod(src.shape), dtype=np.float32).reshape(src.shape)
        shards = [value] * SIZE if src.partial else redist.shard(src, value)
        want = redist.execute(redist.synthesize(src, dst), shards)[RANK]
        passed += all_true(np.array_equal(redist.mpi.reshard(shards[RANK], src, dst, COMM), want))
    src, dst = typed({0: "8{x:(1)2}", 1: "2{y}"}), typed({0: "8", 1: "2{x}"})  # the program reshapes to 65 dims
    refused = expect_error("a program of 65 dims", lambda: redist.mpi.reshard(np.zeros(src.local_shape, np.float32),
                                                                               src, dst, COMM))
    say(f"high_rank cases={len(HIGH_RANK_PAIRS)} passed={passed} refused={int(refused)}")


def mode_exit_in_block(exiting_rank: int, code: str) -> None:
    with redist.mpi.abort_on_error(COMM):
        if RANK == exiting_rank:
            sys.exit() if code == "none" else sys.exit(int(code))
        COMM.Barrier()
    say("exit_in_block: every rank got past the block")


MEMORY_PAIRS = [  # mesh x=2,y=2 (4 ranks); f64, local buffers of 2-8 MiB
    ("f64[1024{x}, 1024{y}]", "f64[1024{y}, 1024{x}]"),
    ("f64[1024{x,y}, 1024]", "f64[1024, 1024{x,y}]"),
    ("f64[1024{x}, 1024{y}]", "f64[1024, 1024]"),
    ("f64[1024, 1024{x,y}]", "f64[1024, 1024]"),
    ("f64[1024, 1024]", "f64[1024{x,y}, 1024]"),
    ("f64[1024, 1024] partial{x,y}", "f64[1024{x}, 1024{y}]"),
    ("f64[512, 1024{y}] partial{x}", "f64[512, 1024{y}]"),
    ("f64[1024{x}, 1024]", "f64[1024{y}, 1024]"),
    ("f64[1024{x}, 1024]", "f64[1024{y}, 1024{x}]"),
    # two size-preserving steps in a row: the second holds an intermediate and its result (2x)
    ("f64[1024{x}, 1024, 2{y}]", "f64[1024, 1024{y,x}, 2]"),
    ("f64[1024, 1024{y,x}]", "f64[1024{y}, 1024{x}]"),
    ("f64[2048{x}, 512] partial{y}", "f64[2048{y}, 512]"),
    # uneven dims: point-to-point exchanges (send and receive buffers, then receive buffer and output)
    ("f64[1023{x,y}, 1024]", "f64[1023, 1024]"),
    ("f64[1023{x}, 1024]", "f64[1023, 1024{x,y}]"),
    ("f64[1023, 1024] partial{x,y}", "f64[1023{x}, 1024{y}]"),
]
SLACK = 64 * 1024  # Python objects alive next to the buffers (arrays' headers, datatypes, frames)


def mode_memory() -> None:
    """Per pair, from an empty cache: a cold call, then a warm one. A call's extra memory is the peak of what
    it allocates (tracemalloc) plus the scratch buffer it found held from before (memory of ours all the
    same); the warm call's own allocations are reported apart (``allocated``)."""
    mesh = redist.Mesh.parse("x=2,y=2")
    tracemalloc.start()
    within, worst, lines = 0, 0.0, []
    for a, b in MEMORY_PAIRS:
        src, dst = (redist.ShardingType.parse(t, mesh) for t in (a, b))
        bound = 2 * max(src.local_bytes, dst.local_bytes)
        local = np.ones(src.local_shape, dtype=src.np_dtype)
        redist.mpi.clear_cache(COMM)
        allocated = []
        held = []
        for _ in range(2):  # cold (plan synthesis, communicators, scratch buffer), then warm
            out = None
            held.append(redist.mpi.held_bytes(COMM))
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            out = redist.mpi.reshard(local, src, dst, COMM)
            allocated.append(tracemalloc.get_traced_memory()[1] - base)
            del out
        extra = COMM.allreduce(allocated[1] + held[1], op=MPI.MAX)
        cold = COMM.allreduce(allocated[0] + held[0], op=MPI.MAX)
        warm_alloc = COMM.allreduce(allocated[1], op=MPI.MAX)
        scale = max(src.local_bytes, dst.local_bytes)
        ratio = max(extra, cold) / scale
        worst = max(worst, ratio)
        within += max(extra, cold) <= bound + SLACK
        steps = ",".join(type(i).__name__ for i in redist.synthesize(src, dst).program.instructions)
        lines.append(f"  {a} -> {b} [{steps}]: extra {extra} B = {extra / scale:.4f} x max(src, dst) local bytes "
                     f"(allocated {warm_alloc / scale:.4f} x, scratch held {held[1] / scale:.4f} x; cold first "
                     f"call {cold} B); bound 2x = {bound} B")
    for line in lines:
        say(line)
    say(f"memory cases={len(lines)} within={within} worst_ratio={worst:.4f}")


def mode_differential(seed: int, first: int, count: int) -> None:
    """Cases ``first …`` of ``proofs.differential``'s MPI run on meshes of this job's size; rank 0 prints the
    tally as ``differential {json}``."""
    import json
    from dataclasses import asdict

    from proofs.differential import mpi_cases

    tally = mpi_cases(seed, first, count, COMM)
    if tally is not None:
        print("differential " + json.dumps(asdict(tally)), flush=True)


CROSS_MESH_NAMED = [  # (source type, its mesh, destination type, its mesh), for 8 ranks
    ("f32[8{data}, 16{model}]", "data=2,model=2", "f32[8, 16{model}]", "model=4,device_ids=[4,5,6,7]"),
    ("f32[16{x}, 12]", "x=4", "f32[16{x}, 12]", "x=4,device_ids=[4,5,6,7]"),
    ("f32[64] partial{x}", "x=4", "f32[64{x}]", "x=4,device_ids=[4,5,6,7]"),
    ("f64[30{x}, 5] partial{y}", "x=2,y=3", "f64[30, 5{x}]", "x=6,device_ids=[2,3,4,5,6,7]"),
    ("f32[48{dp}, 4]", "dp=8", "f32[48{dp}, 4]", "dp=6"),
    ("f32[50{dp}, 3]", "dp=8", "f32[50{dp}, 3]", "dp=6"),
    ("f32[24{x}, 6]", "x=4", "f32[24, 6{x}]", "x=8"),
    ("f32[16{x}, 8]", "x=8", "f32[16{a,b}, 8]", "a=2,b=4"),
    ("f32[16{x}, 8]", "x=8", "f32[16{b}, 8{a}]", "a=2,b=4"),
    ("f32[16{a}, 12{b}]", "a=2,b=4", "f32[16, 12{x}]", "x=3"),
    ("f32[13{x}, 7]", "x=6", "f32[13{x}, 7{y}]", "x=2,y=3,device_ids=[2,3,4,5,6,7]"),
    ("i32[12, 6] partial{x}", "x=2,y=3", "i32[12{a}, 6] partial{b}", "a=2,b=2,device_ids=[4,5,6,7]"),
    ("f32[8, 4] partial(max){x}", "x=4", "f32[8{x}, 4]", "x=2,device_ids=[6,7]"),
    ("f32[8{x}]", "x=2", "f32[8]", "x=2,device_ids=[3,5]"),
]


def mode_cross_mesh(seed: int, count: int) -> None:
    """Reshards between two meshes of the ranks' devices (module docstring), against the numpy backend."""
    pairs = [(redist.ShardingType.parse(a, redist.Mesh.parse(ma)), redist.ShardingType.parse(b, redist.Mesh.parse(mb)))
             for a, ma, b, mb in CROSS_MESH_NAMED]
    draw = SeededDraw(f"mpi_worker:cross_mesh:{seed}")
    while len(pairs) < len(CROSS_MESH_NAMED) + count:
        meshes = draw_mesh_pair(draw, max_devices=SIZE)
        if max(m.id_bound for m in meshes) <= SIZE:
            pairs.append(draw_cross_mesh_pair(draw, meshes, partial=0.3, dst_partial=0.2, dtype=draw.choice(DTYPES),
                                              reductions=REDUCTIONS, uneven=0.3))
    tally = dict.fromkeys(("cases", "passed", "disjoint", "overlapping", "same_devices", "other_sizes", "partial",
                           "uneven", "idle"), 0)
    failures = []
    for i, (src, dst) in enumerate(pairs):
        plan = redist.synthesize(src, dst)
        value, shards = poisoned_source(src, np.random.default_rng([seed, i]))
        expected = redist.execute(plan, shards)
        mine = shards[RANK] if src.mesh.has_device(RANK) else None
        want = expected[RANK] if dst.mesh.has_device(RANK) else None
        ok = True
        for _ in range(2):  # the first call agrees in full, the second runs on while the verdict travels
            out = redist.mpi.reshard(None if mine is None else mine.copy(), src, dst, COMM)
            ok &= (out is None and want is None) or (out is not None and want is not None and out.dtype == want.dtype
                                                      and np.array_equal(out, want, equal_nan=True))
        ok = all_true(ok)
        a, b = set(src.mesh.devices), set(dst.mesh.devices)
        relation = ("same_devices" if a == b else "disjoint" if not a & b else
                    "overlapping" if len(a) == len(b) else "other_sizes")
        for key, on in (("cases", True), ("passed", ok), (relation, True), ("partial", bool(src.partial)),
                        ("uneven", not (src.is_even() and dst.is_even())), ("idle", len(a | b) < SIZE)):
            tally[key] += on
        if not ok and len(failures) < 5:
            failures.append(f"{src} on {src.mesh} -> {dst} on {dst.mesh}: {plan.steps}")
    for f in failures:
        say("FAILED", f)
    stage = redist.Mesh.parse(f"x=2,device_ids=[{SIZE},{SIZE + 1}]")  # device ids the communicator lacks
    src, dst = redist.ShardingType.parse("f32[8{x}]", make_mesh((2,))), redist.ShardingType.parse("f32[8]", stage)
    there = redist.ShardingType.parse("f32[8]", redist.Mesh.parse("x=2,device_ids=[2,3]"))
    good = np.zeros(4, np.float32) if RANK < 2 else None
    checks = [("a destination on device ids the communicator lacks", lambda: redist.mpi.reshard(good, src, dst, COMM)),
              ("a buffer on a rank that is no device of the source",
               lambda: redist.mpi.reshard(np.zeros(4, np.float32), src, there, COMM)),
              ("no buffer on a device of the source",
               lambda: redist.mpi.reshard(None if RANK == 1 else good, src, there, COMM))]
    raised = sum(expect_error(label, fn) for label, fn in checks)
    say("cross_mesh " + " ".join(f"{k}={v}" for k, v in tally.items()) + f" errors={len(checks)} all_raised={raised}")


def mode_fail() -> None:
    mesh = redist.Mesh.parse("x=2,y=2")
    src = redist.ShardingType.parse("f64[8{x}, 8] partial{y}", mesh)
    dst = redist.ShardingType.parse("f64[8, 8]", mesh)
    calls = [0]

    def failing(method):
        def wrapped(self, ins, buf):
            calls[0] += 1
            if RANK == 0 and calls[0] == 2:
                raise RuntimeError("injected failure on rank 0 before instruction 2")
            return method(self, ins, buf)
        return wrapped

    for name in interpreter.METHODS.values():
        setattr(mpi_backend.MpiBackend, name, failing(getattr(mpi_backend.MpiBackend, name)))
    say(redist.synthesize(src, dst).program)
    out = redist.mpi.reshard(np.ones(src.local_shape), src, dst, COMM)
    COMM.Barrier()
    say(f"fail: no failure happened ({out.shape})")


if __name__ == "__main__":
    while sys.argv[1] in ("windowed", "strided", "allgather"):  # the same mode, with one setting changed:
        setting = sys.argv.pop(1)
        if setting == "windowed":  # one shift per window of a personalised exchange, all-gathers included
            mpi_backend.WINDOW, mpi_placement.ALLGATHER_RANKS_PER_CORE = 1, 0
        elif setting == "strided":  # every strided place of a receive (all-gather chunks, unpacked rows) directly
            mpi_placement.STRIDED_RUN_MIN = 1
        else:  # every all-gather into contiguous places by MPI's Allgather, however many ranks share a core
            mpi_placement.ALLGATHER_RANKS_PER_CORE = math.inf
    mode = sys.argv[1]
    with redist.mpi.abort_on_error(COMM):
        if mode == "cases":
            mode_cases(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0,
                       int(sys.argv[5]) if len(sys.argv) > 5 else 0)
        elif mode == "errors":
            mode_errors()
        elif mode == "agreement":
            mode_agreement()
        elif mode == "memory":
            mode_memory()
        elif mode == "fail":
            mode_fail()
        elif mode == "exact_sums":
            mode_exact_sums()
        elif mode == "fresh":
            mode_fresh()
        elif mode == "after_block":
            mode_after_block(sys.argv[2], int(sys.argv[3]))
        elif mode == "high_rank":
            mode_high_rank()
        elif mode == "exit_in_block":
            mode_exit_in_block(int(sys.argv[2]), sys.argv[3])
        elif mode == "cross_mesh":
            mode_cross_mesh(int(sys.argv[2]), int(sys.argv[3]))
        elif mode == "differential":
            mode_differential(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        else:
            raise SystemExit(f"unknown mode {mode!r}")
