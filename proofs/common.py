"""Shared helpers for the proof scripts and tests: every mesh, layout and pair up to a size (exhaustive
enumeration; random ones come from :mod:`redist.testing`), and a numpy oracle that runs a program on concrete
data. The oracle uses the library's own data helpers (``shard``/``unshard``) and the numpy backend: it is an
independent *witness*, not the verifier."""

from __future__ import annotations

import itertools
import math
import sys

import numpy as np

from redist import program as P
from redist.backends import numpy_backend
from redist.data import poison_padding, random_array, summands
from redist.mesh import Mesh
from redist.types import ShardingType


def synthesized_and_proved(src: ShardingType, dst: ShardingType, out: dict):
    """The plan of ``src -> dst``, synthesized and proved by ``redist.verify``; None where either fails, with
    ``out["error"]`` saying how. ``out["seconds"]``: verify's time."""
    from redist.synthesis import synthesize
    from redist.verify import verify

    try:
        plan = synthesize(src, dst)
    except Exception as e:  # noqa: BLE001 - any synthesis failure is a finding
        out["error"] = f"synthesize raised {type(e).__name__}: {e}"
        return None
    v = verify(plan)
    out["seconds"] = v.seconds
    if not v.ok:
        out["error"] = f"verify {v.status}: {v.reason}; counterexample {v.counterexample}"
        return None
    return plan, v


def progress(iterable=None, *, desc: str, total: int | None = None, unit: str = "it"):
    """A tqdm progress bar on stderr: redrawn in place on a terminal, a line every 30 s into a log file."""
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5 if sys.stderr.isatty() else 30)


# ----------------------------------------------------------------------------- meshes
def all_meshes(max_devices: int = 8, min_size: int = 2, max_axes: int = 3) -> list[Mesh]:
    """Every mesh (ordered axis sizes >= min_size) with at most ``max_devices`` devices."""
    out = []

    def rec(shape):
        if shape:
            out.append(Mesh({n: s for n, s in zip("xyzw", shape)}))
        if len(shape) == max_axes:
            return
        for s in range(min_size, max_devices + 1):
            if math.prod(shape) * s <= max_devices:
                rec(shape + (s,))

    rec(())
    return out


# ----------------------------------------------------------------------------- layouts
def all_layouts(mesh: Mesh, rank: int, partial: bool = True):
    """Every assignment of the mesh's whole axes to (ordered) dims, partial, or nowhere."""
    names = mesh.names
    slots = list(range(rank + (2 if partial else 1)))  # dims..., rank = unused, rank+1 = partial
    for assign in itertools.product(slots, repeat=len(names)):
        groups = {s: [a for a, g in zip(names, assign) if g == s] for s in slots}
        orders = [itertools.permutations(groups[i]) for i in range(rank)]
        part = tuple(groups.get(rank + 1, ())) if partial else ()
        for dims in itertools.product(*orders):
            yield tuple(tuple(d) for d in dims), part


def all_pairs(mesh: Mesh, rank: int, dtype: str = "f32", multiplier: int = 1, creating: bool = False):
    """Every (src, dst) pair of whole-axis layouts with dst.partial a subset of src.partial (with
    ``creating``: every pair whose dst.partial is not, so that the destination creates pending sums), each dim
    the smallest size both sides divide (``multiplier`` times that)."""
    layouts = list(all_layouts(mesh, rank))
    for d1, p1 in layouts:
        for d2, p2 in layouts:
            if (set(p2) <= set(p1)) == creating:
                continue
            shape = tuple(math.lcm(mesh.group_size(a), mesh.group_size(b)) * multiplier for a, b in zip(d1, d2))
            yield (ShardingType(mesh, shape, dtype, d1, p1), ShardingType(mesh, shape, dtype, d2, p2))


# ----------------------------------------------------------------------------- numpy oracle
def source_buffers(src: ShardingType, rng: np.random.Generator):
    """Per-device buffers of ``src`` and the global value. Elements are distinct integers (so a misplaced
    element shows); for a partial type every partial group gets its own random summands (docs/spec.md §4: any summands
    whose group sums are right), so dropping, doubling or mixing summands shows too. Every padding position
    of every buffer (uneven dims, docs/spec.md §2) is poisoned (:func:`redist.data.poison_padding`: NaN, or the largest
    integer), so a program that reads padding as data gives a wrong datum. For a pending product the
    elements are ``2 … N+1``: a product that takes its summands twice gives the square of the value, which
    1 (the one element of a scalar) would hide. Otherwise signed and float elements get random signs (still
    distinct): a claim of a pending max over buffers that hold the value on one member and zeros on the others
    is right for positive values only, and one of a pending min for negative ones."""
    value = random_array(rng, src.shape, src.np_dtype, distinct=True)
    if src.partial and src.reduction == "prod" and src.dtype != "bool":
        value = value + np.ones((), value.dtype)
    elif value.dtype.kind in "ifc":
        value = np.where(rng.random(value.shape) < 0.5, -value, value).astype(value.dtype)
    return poison_padding(src, summands(src, value, rng, low=-50, high=51)), value


def oracle(program, src: ShardingType, dst: ShardingType, seed: int = 0, trials: int = 2) -> tuple[bool, str]:
    """Run ``program`` (a program, or a plan's stages: programs and the transfers between them, in which each
    transfer must read the buffers the program before it leaves and make those the program after it reads,
    as lowering makes them) with the numpy backend on random data of type ``src`` (padding filled by
    :func:`source_buffers`); True iff the result is the same value laid out as ``dst`` (group sums for
    partial ``dst``; replicas must agree), compared at the data positions of ``dst`` only: ``unshard`` reads
    no padding, which may hold anything. A program that raises at run time, or gives the wrong local shape,
    is wrong. So is a result whose dtype is not ``dst``'s, and a ``dst`` on another mesh than the program's
    result (``program.dst_mesh``; docs/spec.md §1: another mesh, device order included, is another type, even where
    the data happen to sit on the same devices); ``dst``'s layout is read on its own mesh, so a misplaced
    block shows as wrong values first. Group reductions are ``dst``'s kind (``unshard``), and summands are
    made for ``src``'s kind (:func:`redist.data.summands`); a partial ``dst`` of another kind than a partial
    ``src`` is wrong whatever the values (another kind is another type, and no step converts kinds: on some
    data a max of a product's summands happens to equal the product), but for pending sums, which a program
    may create once it has reduced the source whole (SPEC 3)."""
    from redist.data import unshard

    stages = (program,) if isinstance(program, P.Program) else tuple(program)
    joint = _broken_joint(stages)
    if joint:
        return False, joint
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        bufs, value = source_buffers(src, rng)
        try:
            out = numpy_backend.run_stages(stages, bufs)
            held = [x for x in out if x is not None]
            if any(tuple(x.shape) != dst.local_shape for x in held):
                return False, "wrong local shape"
            if any(x.dtype != dst.np_dtype for x in held):
                return False, f"the result is {held[0].dtype}, not {dst.dtype}"
            got = unshard(dst, out)
        except Exception as e:  # noqa: BLE001 - a program that raises at run time is wrong
            return False, f"raised {type(e).__name__}: {e}"
        if not np.array_equal(got, value):
            return False, "wrong values"
    if dst.mesh != stages[-1].dst_mesh:
        return False, f"the result is on mesh {stages[-1].dst_mesh!r}, not {dst.mesh!r}"
    # no program converts kinds (docs/spec.md §3); a pending sum may follow a source of another kind reduced whole
    if src.partial and dst.partial and src.reduction != dst.reduction != "sum":
        return False, f"the result is a pending {src.reduction}, not a pending {dst.reduction}"
    return True, "equal"


def _broken_joint(stages) -> str | None:
    """Where a transfer of ``stages`` does not fit the programs around it (the buffers' shape or mesh), the numpy
    backend would copy boxes of buffers it does not describe: what is wrong, else None."""
    for before, transfer, after in zip(stages[::2], stages[1::2], stages[2::2]):
        if (before.shapes[-1], before.dst_mesh) != (transfer.src_shape, transfer.src_mesh):
            return f"{transfer} reads buffers of shape {transfer.src_shape} on {transfer.src_mesh}, not those " \
                   "the program before it leaves"
        if (after.shapes[0], after.src_mesh) != (transfer.shape, transfer.mesh):
            return f"{transfer} makes buffers of shape {transfer.shape} on {transfer.mesh}, not those the program " \
                   "after it reads"
    return None


# ----------------------------------------------------------------------------- device orders
def device_orders(mesh: Mesh) -> list[Mesh]:
    """Other device orders of ``mesh``'s axes (docs/spec.md §1), for exhaustive checks: the devices reversed, numbered
    column-major (the first axis fastest), and rotated by one position (none for a mesh of one device)."""
    n = mesh.size
    if n < 2:
        return []
    column_major = np.arange(n).reshape(mesh.shape[::-1]).transpose().reshape(-1)
    orders = [list(range(n - 1, -1, -1)), column_major.tolist(), [(p + 1) % n for p in range(n)]]
    out = []
    for ids in orders:
        m = mesh.reordered(ids)
        if m != mesh and m not in out:
            out.append(m)
    return out
