"""Z3 proofs that a plan's lowered buffer program computes its destination type.

Principle: *verify what you run*. :func:`verify` reads ``plan.stages`` — the instructions the backends execute
(semantics in :mod:`redist.program`): the plan's one program, or across meshes its programs and the transfers
between them — and nothing else of the plan except its source type (what the input buffers hold), its claimed
destination type, and its reported ``peak_bytes`` and ``bytes_received``. It never calls the synthesizer's
typing rules (:mod:`redist.steps`) nor the type class's block arithmetic (``block_index``, ``local_box``,
``local_shape``, ``Mesh.group_index``, ``Mesh.coords``): that independence is on purpose, so that a bug there
cannot prove itself right. Instruction axes are
:class:`redist.axes.Axis` values, which are their token strings; the verifier reads only their text, with the
token grammar the backends read it with (:func:`redist.axes.read_token`), so that it accepts exactly the
tokens they run, and re-derives name, pre-size and size independently. The meaning of a type is stated once,
below, in Z3 terms, from the contract (docs/spec.md §1 and §2):

    Mesh positions are numbered row-major over the mesh axes in mesh order (the last axis varies fastest),
    and ``device_ids[p]`` is the device at position p (default: device p); a device's coordinates are those
    of its position. A dim of size N with axes (a1 … ak), major → minor, on a device with coordinates c has
    block index
    b = ((c[a1]·s[a2] + c[a2])·s[a3] + …), L = ceil(N / (s[a1]·…·s[ak])); local index i of that dim is global
    index b·L + i, which is data if b·L + i < N and padding otherwise. A sub-axis ``name:(pre)size`` of an
    axis of size S has coordinate (c[name] // (S / (pre·size))) % size. Partial axes: the buffers of the
    devices that differ only on them are summands of the value, summand coordinate = the device's
    coordinates on the partial axes; the value is their sum, maximum, minimum or product (the type's
    ``reduction``; of ``bool`` values sum and maximum are the logical or, minimum and product the and).

The verifier, part by part (each module's header states its part):

- :mod:`~redist.verify.chain`: a plan's stages read as one sequence of instructions, each transfer one of them.
- :mod:`~redist.verify.wellformed`: what is checked before any query: every field of every instruction, the
  buffer shapes re-derived from the instructions, and the meshes, dtypes, shapes and reduction kinds of the
  programs, the transfers and the types.
- :mod:`~redist.verify.accounting`: ``peak_bytes`` and ``bytes_received``, counted from the instructions, and
  across meshes the plan's footprint: no device above the larger of its two buffers, none of neither mesh
  touched.
- :mod:`~redist.verify.encoding`: axis tokens, device orders, device coordinates as digits, and the meaning
  above, in Z3 terms.
- :mod:`~redist.verify.walk`: the backward walk of one element through the instructions, over the tables of
  :mod:`~redist.verify.tables`.
- :mod:`~redist.verify.queries`: the queries on the walks (numbered there: 1-3, and 1'-3' for a claim that
  creates pending sums), and their counterexamples.
- :mod:`~redist.verify.solver`: Z3, the deadline of a call (``timeout_s``), and solving a query;
  :mod:`~redist.verify.verdict`: the :class:`Verdict`, and the two ways a check ends the call early.

What is read, and where each field is checked
---------------------------------------------
Every field the verifier reads constrains the verdict; a claim that differs from what the program computes
in any of them is refuted (status ``"refuted"``, with a counterexample in the style of the value query:
``device``, ``coords``, ``index`` — ``None`` for a field that is the same at every index — ``holds`` and
``expected``, naming the field that differs). Arguments that are not what they should be at all raise
:class:`~redist.errors.ShardingError` naming the argument (:func:`_check_arguments`).

- ``plan`` must be a :class:`~redist.plan.Plan`. Read: ``stages``, ``src`` (the type of the input buffers),
  ``dst`` (the claim when none is given), ``peak_bytes`` and ``bytes_received``
  (:func:`~redist.verify.accounting.check_costs`).
- ``Plan.stages``: a program, or programs and transfers that alternate, beginning and ending with a program,
  else refuted (:meth:`~redist.verify.chain.Chain.read`). A transfer's ``src_mesh`` must be the ``dst_mesh`` of
  the program before it and its ``mesh`` the ``src_mesh`` of the program after it, its ``src_shape`` and
  ``shape`` their last and first buffers' shapes, and its copies (by device id) must go to devices of its
  ``mesh`` from devices of its ``src_mesh``, fit both buffers and not overlap on a device
  (:func:`~redist.verify.wellformed.derive_shapes`); the walk reads them as it reads an exchange's copy table.
- ``Mesh``: the source type's must be the first program's ``src_mesh`` and the claim's the last one's
  ``dst_mesh``, compared as whole values (axis names, sizes, their order and ``device_ids``) by the one helper
  ``_mesh_difference`` of :mod:`~redist.verify.wellformed`: a type on another arrangement of the same number
  of devices (axes in another order, other sizes, other names, other devices or another device order) is
  refuted, the counterexample naming a
  device whose position differs (``Mesh({"y": 2, "x": 4})`` against ``x=4,y=2``: device 1 is at ``{x: 0, y: 1}``
  on one and ``{y: 0, x: 1}`` on the other; ``device_ids=[1,0]`` against the default order: device 0 is at
  ``{x: 1}`` on one and ``{x: 0}`` on the other). Each program's own three meshes must have the same axes
  on the same devices (only their device orders may differ), else it is refuted. A type on another number of
  devices is no claim about these devices: ``ShardingError``. ``device_ids`` are read as data (any distinct
  device ids, inverted here; the default order, ``Mesh.is_row_major``, is the identity and is not listed:
  :class:`~redist.verify.encoding.DeviceOrder`); no method of ``Mesh`` is called.
- ``Program.dtype`` (each program's) must be the source type's dtype, and the claim's ``dtype`` the source's
  (:func:`~redist.verify.wellformed.check_fields`). The names' meaning is ``ShardingType.np_dtype``: the dtype
  table, not block arithmetic, is the one thing read from the type class beyond its fields.
- ``ShardingType.shape``: the claim's must be the source's (:func:`~redist.verify.wellformed.check_fields`).
- ``ShardingType.dims``: the value query, through the meaning above (and the local shapes, below).
- ``ShardingType.partial``: the sums query and its count of summands, or (creating) queries 1'-3'.
- ``Program.shapes``: re-derived from the instructions and compared
  (:func:`~redist.verify.wellformed.derive_shapes`); the first must be the source's local shape, the last the
  claim's.
- ``Program.instructions``: every field of every instruction is checked by
  :func:`~redist.verify.wellformed.derive_shapes` (dims in range, axes of the mesh that do not overlap, a
  permutation of the mesh's devices — a table by device id, or a coordinate map whose groups' two sides have equal
  sizes and cover the same factors of the mesh —, an exchange's segments that fit their buffers, name blocks
  that exist and do not overlap, and source axes that do not overlap) and read by the walk.
- ``ShardingType.reduction`` and the instructions' ``reduction``: every reduction instruction of the program
  must take one kind, the source's where the source is partial, and a partial claim must be of the
  source's kind (:func:`~redist.verify.wellformed.check_reductions`) — but for a source pending in another
  kind than a sum, reduced whole and then made pending sums: its reductions come first, then sums only, and
  a partial claim is a sum (two stages, queries 1''-4'' of :mod:`~redist.verify.queries`); the maximum or
  minimum of complex numbers is refuted. The kind decides query 2 (exactly once, or covered).
"""

from __future__ import annotations

import math
import numbers
import time

import numpy as np

from redist import program as P
from redist.errors import ShardingError
from redist.mesh import Mesh
from redist.plan import Plan
from redist.types import ShardingType
from redist.verify import accounting
from redist.verify.accounting import program_bytes
from redist.verify.chain import Chain
from redist.verify.encoding import ChainDigits, ksize, type_meaning
from redist.verify.queries import creation_queries, sum_query, value_query
from redist.verify.solver import Deadline, new_context
from redist.verify.verdict import STATUSES, Refuted, Undecided, Verdict
from redist.verify.wellformed import IDEMPOTENT, check_fields, check_reductions, derive_shapes, field_cx, is_ints

__all__ = ["Verdict", "verify", "verify_program", "program_bytes", "STATUSES"]


def verify(plan, dst=None, timeout_s: float | None = None, *, check_costs: bool = True) -> Verdict:
    """Prove that ``plan.stages`` — the plan's program, or across meshes its programs and the transfers between
    them — turn buffers of type ``plan.src`` into buffers of type ``dst`` (default ``plan.dst``) on every device
    at every local index (group sums, for partial types), and that ``plan.peak_bytes`` / ``plan.bytes_received``
    agree with the instructions (unless ``check_costs`` is False). Across meshes it also proves the plan's
    footprint: no device holds more than the larger of its buffers under ``plan.src`` and under ``dst`` (0 on a
    mesh it is not in), so that a device of neither mesh is left alone.

    ``dst`` may be a :class:`~redist.types.ShardingType` or its text (read on the mesh of ``plan.dst``). A claim
    that differs from what the program computes in anything — layout, partial axes, dtype, shape, mesh — is
    refuted, with a counterexample (module header). ``timeout_s`` (seconds; None or ``inf``: no bound) bounds the
    wall time of the call; when it runs out the verdict is ``"undecided"``. (Z3's own timer counts to
    ``2**32 − 1`` ms, about 49.7 days: a longer bound still bounds building the queries, but not Z3.) Calls may run
    in several threads at once: each works in a Z3 context of its own.

    Raises :class:`~redist.errors.ShardingError` if ``plan`` is not a Plan, ``dst`` is not a type (or text
    that parses) on a mesh of as many devices as the plan's destination, ``timeout_s`` is not a number > 0 or
    None (NaN, a bool), or ``check_costs`` is not a bool."""
    start = time.perf_counter()
    if not isinstance(plan, Plan):
        raise ShardingError(f"verify: plan must be a redist.Plan (from redist.synthesize), got {_show(plan)}")
    timeout_s = checked_timeout(timeout_s)
    if not isinstance(check_costs, bool):
        raise ShardingError(f"verify: check_costs must be True or False, got {_show(check_costs)}")
    if isinstance(dst, str):
        try:
            dst = ShardingType.parse(dst, plan.dst.mesh)
        except ShardingError as e:
            raise ShardingError(f"verify: dst: {e}") from None
    claim = plan.dst if dst is None else dst
    stages = plan.stages
    _check_arguments(stages, plan.src, claim)
    costs = (plan.peak_bytes, plan.bytes_received) if check_costs else None
    return _run(stages, plan.src, claim, costs, Deadline(timeout_s, start))


def verify_program(program, src, dst, *, costs=None, timeout_s: float | None = None) -> Verdict:
    """:func:`verify` for a bare program, or a plan's stages (a tuple of programs and the transfers between them,
    as :attr:`redist.Plan.stages`): ``src`` is what its input buffers hold, ``dst`` the claim. ``costs``:
    optional ``(peak_bytes, bytes_received)`` to check against the instructions. Raises
    :class:`~redist.errors.ShardingError` if ``program`` is not a :class:`~redist.program.Program` (with tuples of
    instructions and shapes, a mesh and a dtype) or such stages, ``src`` or ``dst`` is not a type on a mesh of
    as many devices as the first program's and the last program's, or ``timeout_s`` is not a number > 0 or
    None (as for :func:`verify`)."""
    start = time.perf_counter()
    timeout_s = checked_timeout(timeout_s)
    _check_arguments(program, src, dst)
    return _run(program, src, dst, costs, Deadline(timeout_s, start))


def _show(x) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def checked_timeout(timeout_s) -> float | None:
    """``timeout_s`` in seconds, None for no bound (None or infinity; an integer too large for a float is
    infinity too); ShardingError for anything else than a real number > 0 (NaN, a bool). Every verifier's
    ``timeout_s`` is read so (``Partitioned.verify``'s too)."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not timeout_s > 0:
        raise ShardingError(f"verify: timeout_s must be a number of seconds > 0, or None (or inf) for no bound; "
                            f"got {_show(timeout_s)}")
    try:
        seconds = float(timeout_s)
    except OverflowError:
        return None
    return None if seconds == math.inf else seconds


def _check_arguments(stages, src, dst) -> None:
    """Arguments that are not a program (or stages of programs and transfers) and two types about its devices at
    all: ShardingError (a type on another arrangement of the same number of devices is a claim, refuted later by
    :func:`~redist.verify.wellformed.check_fields`; stages in another order than program, transfer, program, …
    are refuted by :meth:`~redist.verify.chain.Chain.read`)."""
    if isinstance(stages, P.Program):
        stages = (stages,)
    if not (isinstance(stages, tuple) and stages and all(isinstance(s, (P.Program, P.Transfer)) for s in stages)):
        raise ShardingError(f"verify: program must be a redist.program.Program, or a plan's stages (a tuple of "
                            f"programs and transfers), got {_show(stages)}")
    for stage in stages:
        if isinstance(stage, P.Transfer):
            _check_transfer_meshes(stage)
        else:
            _check_program(stage)
    programs = [s for s in stages if isinstance(s, P.Program)]
    if not programs:
        raise ShardingError("verify: a plan's stages begin and end with a program, got transfers only")
    for name, t, kind, mesh, where in (("src", src, "a redist.ShardingType", programs[0].mesh, "reads its input on"),
                                       ("dst", dst, "a redist.ShardingType or its text", programs[-1].mesh,
                                        "leaves its result on")):
        if not isinstance(t, ShardingType) or not isinstance(t.mesh, Mesh):
            raise ShardingError(f"verify: {name} must be {kind}, got {_show(t)}")
        if t.mesh.size != mesh.size:
            raise ShardingError(f"verify: {name} {t} is on mesh {t.mesh} of {t.mesh.size} devices, but the plan "
                                f"{where} mesh {mesh} of {mesh.size}: the types must be about the devices the plan "
                                "runs on")


def _check_program(program) -> None:
    """A program's fields of the kinds the verifier reads (tuples, meshes, a dtype), else ShardingError."""
    if not (isinstance(program.instructions, tuple) and isinstance(program.shapes, tuple) and program.shapes
            and all(is_ints(s) for s in program.shapes)):
        raise ShardingError("verify: the program's instructions and shapes must be tuples (shapes: one tuple of "
                            f"sizes per buffer), got {_show(program.instructions)} and {_show(program.shapes)}")
    for name in ("mesh", "src_mesh", "dst_mesh"):
        if not isinstance(getattr(program, name), Mesh):
            raise ShardingError(f"verify: the program's {name} must be a redist.Mesh, got "
                                f"{_show(getattr(program, name))}")
    try:
        np.dtype(program.dtype)
    except TypeError:
        raise ShardingError(f"verify: the program's dtype {program.dtype!r} is not a numpy dtype") from None


def _check_transfer_meshes(transfer) -> None:
    """A transfer's meshes must be meshes (its other fields are checked with the instructions), else
    ShardingError."""
    for name in ("src_mesh", "mesh"):
        if not isinstance(getattr(transfer, name), Mesh):
            raise ShardingError(f"verify: a transfer's {name} must be a redist.Mesh, got "
                                f"{_show(getattr(transfer, name))}")


def _run(stages, src, dst, costs, deadline: Deadline) -> Verdict:
    details: dict = {}
    try:
        chain = Chain.read(stages)
        _verify(chain, src, dst, costs, deadline, details)
    except Refuted as e:
        return Verdict("refuted", e.reason, e.counterexample, deadline.elapsed(), details)
    except Undecided as e:
        return Verdict("undecided", e.reason, None, deadline.elapsed(), details)
    return Verdict("proved", "proved: every device holds the destination's elements at every local index"
                   + (" (group sums of partial axes)" if src.partial else "")
                   + ("; no device holds more than the larger of its buffers under the source and the claim"
                      if chain.crosses_meshes else "")
                   + ("; peak_bytes and bytes_received agree with the instructions" if costs else ""),
                   None, deadline.elapsed(), details)


def _verify(chain: Chain, src, dst, costs, deadline: Deadline, details: dict) -> None:
    check_fields(chain, src, dst, deadline)
    src_sizes, dst_sizes = dict(chain.src_mesh.axes), dict(chain.dst_mesh.axes)
    _, src_local, _, src_partial, _ = type_meaning(src_sizes, src)
    _, dst_local, _, dst_partial, _ = type_meaning(dst_sizes, dst)
    if tuple(chain.shapes[0]) != src_local:
        raise Refuted(f"the program starts from local shape {tuple(chain.shapes[0])}, but {src} is {src_local}",
                      field_cx(chain.src_mesh, "local_shape", tuple(chain.shapes[0]), src_local))
    shapes = derive_shapes(chain, deadline)
    if shapes[-1] != dst_local:
        raise Refuted(f"the program ends with local shape {shapes[-1]}, but {dst} has local shape {dst_local}",
                      field_cx(chain.dst_mesh, "local_shape", shapes[-1], dst_local))
    accounting.check_costs(chain, shapes, costs, details, deadline)
    accounting.check_footprint(chain, shapes, deadline)
    kind, cut = check_reductions(chain, src, dst)
    if any(n == 0 for n in dst_local):
        return  # no elements: nothing to prove
    digits = ChainDigits(chain, src, dst, new_context())
    idempotent = kind in IDEMPOTENT or np.dtype(chain.dtype) == np.dtype(np.bool_)
    if cut is not None:  # two stages: the source's pending value reduced whole before `cut`, sums from it on
        value_query(chain, digits, src, dst, dst_local, deadline, details, zeros_from=cut)
        creation_queries(chain, digits, src, dst, dst_local, deadline, details, stop=cut)
        sum_query(chain, digits, src, dst, dst_local, deadline, details, idempotent, cut=cut)
        return
    zeros = _creates(chain, src, src_partial, dst, dst_partial) or any(
        isinstance(ins, (P.KeepRoot, P.EmbedChunk)) for ins in chain.instructions)
    created = kind or (dst.reduction if dst.partial else "sum")
    if zeros and created != "sum":
        raise Refuted(f"the program or the claim {dst} creates pending values (zeros where a summand lacks "
                      f"data), but zeros are the identity of a sum only, and its values are a pending {created}",
                      field_cx(chain.dst_mesh, "reduction", created, "sum"))
    if not zeros:
        try:
            value_query(chain, digits, src, dst, dst_local, deadline, details)
        except Refuted as e:
            # A zero (an exchange, a transfer or a padded chunk writes none there) is wrong for every kind but a
            # sum, and for a sum that nothing adds to others: else queries 1'-3' decide.
            unwritten = (e.counterexample or {}).get("holds", {}).get("unwritten")
            if not (unwritten and created == "sum" and (kind or dst.partial)):
                raise
            zeros = True
    if zeros:
        value_query(chain, digits, src, dst, dst_local, deadline, details, zeros_from=0)
        creation_queries(chain, digits, src, dst, dst_local, deadline, details)
        return
    sum_query(chain, digits, src, dst, dst_local, deadline, details, idempotent)


def _creates(chain: Chain, src, src_partial, dst, dst_partial) -> bool:
    """Whether the claim ``dst`` creates pending sums (zeros where a summand lacks data). Within one mesh: it is
    partial over some factor of a mesh axis that ``src`` is not, a partial axis's factor range ``[pre,
    pre·size)`` not covered by the ranges of the source's partial axes of that mesh axis. Across meshes, whose
    axes are not compared: its summand groups are of more than one device, and of another size than the
    source's (summands are handed over only between groups of one size)."""
    if chain.crosses_meshes:
        return ksize(dst_partial) > 1 and ksize(dst_partial) != ksize(src_partial)
    have: dict[str, list] = {}
    for a in src_partial:
        have.setdefault(a.name, []).append((a.lo, a.hi))
    for a in dst_partial:
        at = a.lo
        while at < a.hi:
            at = next((hi for lo, hi in have.get(a.name, ()) if lo <= at < hi), None)
            if at is None:
                return True
    return False
