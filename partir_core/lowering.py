"""Lowering: from the propagated IR to one SPMD program of local ops and collectives, and running it.

:func:`analyze` fixes, for every equation, the factor axes it runs with (:class:`OpSharding`): the types its
operands must have and the types of its results (partial where a contracted factor is split). The propagated
state proposes one choice per op; where that choice needs communication, the op also tries the alternatives
made of the axes its operands and results carry and keeps the one that moves the fewest bytes (operands
resharded from their produced types, results resharded to the types wanted of them); a few passes refine what
results are wanted in from what their readers asked for, keeping the cheapest program. Values then have the
type their producer gives them (inputs: the tactics' types; outputs: the state's types).

:func:`lower` turns that into a :class:`LocalProgram`, a list of instructions on per-device buffers:

- ``Reshard``: an operand whose type does not fit what its op needs is moved by ``redist.synthesize(src, dst)``
  and run with ``redist.jax.run_program``; one buffer moved to one type is moved once and reused. Pending sums become ``all_reduce`` / ``reduce_scatter`` this way,
  when consumed by an op that needs a non-partial operand, and at the outputs. If a plan names sub-axes
  (``y:(2)2``) or cannot be synthesized, the reshard falls back to reducing, all-gathering to replicated and
  slicing locally (recorded in :attr:`LocalProgram.fallbacks`).
- ``Compute``: the primitive on local shards, through its registry rule's local form (local shapes, block
  offsets); ops with no rule run on replicated operands with their original parameters.
- ``Finish``: ``pmax``/``pmin`` after a max/min reduction over a split dim.

:meth:`LocalProgram.run` interprets the program inside one ``jax.shard_map`` over the whole mesh, with the
inputs' and outputs' ``partition_spec()`` as specs.

Arrays of random keys are typed by their key data (:mod:`partir_core.keys`, :func:`value_type`): buffers hold
key arrays, ops see key shapes (:func:`local_shapes`), and reshards and the ``shard_map`` boundary move key data.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import redist
from redist.bounds import check_pair
from redist.types import ShardingType

from partir_core import keys
from partir_core.ir import CONTROL_FLOW, Graph
from partir_core.propagation import State, dim_axes, fit_use, resolve
from partir_core.registry import LocalContext, Rule, _bind, flops


@dataclass
class OpSharding:
    """How one equation runs: factor axes, operand types it needs, result types it gives."""

    rule: Rule | None
    use: dict
    in_types: list
    out_types: list
    finish: list  # (kind "max"/"min", axes)
    new_partial: tuple


@dataclass
class Analysis:
    ops: list[OpSharding]
    types: dict[int, ShardingType]  # every value's type as produced
    unsupported: list[tuple[int, str, str]]  # (eqn, primitive, why)
    state: State | None = None  # the propagated state the choices were made from


def value_type(graph: Graph, v: int, mesh, dims, partial=()) -> ShardingType:
    """Value ``v``'s type with its dims split as ``dims``: a key array is typed by its key data, with the
    key-data dims replicated after ``dims`` (:func:`partir_core.keys.sharding_type`)."""
    return keys.sharding_type(mesh, graph.shape(v), graph.dtype(v), dims, partial)


def replicated(graph: Graph, v: int, mesh) -> ShardingType:
    return value_type(graph, v, mesh, ((),) * len(graph.shape(v)))


def local_shapes(graph: Graph, values, types) -> list[tuple[int, ...]]:
    """The local shapes of ``values`` of the given types, as their ops see them: a key array's without its
    key-data dims."""
    return [t.local_shape[: len(graph.shape(v))] for v, t in zip(values, types)]


def _analyze_once(graph: Graph, rules: list, state: State, mesh, choose: bool, targets) -> Analysis:
    """Fix every op's factor axes, in program order.

    The propagated state proposes one choice per op (:func:`resolve`, earliest decision wins a conflict).
    With ``choose``, an op whose proposed choice needs communication (an operand resharded, or a result
    that is not already what the state wants for it) also tries the alternatives made of the axes its
    operands and results carry (in the state or as actually produced), prefixes of those, and none, and
    keeps the one that moves the fewest bytes: operands resharded from their produced types, plus results
    resharded to the types they are wanted in (a pending sum reduced there). Ties keep the proposal.
    This is the local, cost-based choice XLA's partitioner makes per op (gather a small activation rather
    than a large weight, keep a contraction local, ...). ``targets``: None prices every result against the
    state's type for it; a dict prices result ``v`` against the types ``targets[v]`` (none: free);
    :data:`FOLLOW` prices no result, so each op takes the layout its operands arrive in where that is
    cheapest (a layout chosen at one op then carries along the values computed from it)."""
    types: dict[int, ShardingType] = {}
    for v in graph.invars:
        types[v] = value_type(graph, v, mesh, tuple(state.dims[v]))
    for v in graph.consts:
        types[v] = replicated(graph, v, mesh)
    ops, unsupported = [], []
    for i, (eqn, rule) in enumerate(zip(graph.eqns, rules)):
        if rule is None:
            why = ("control flow: kept replicated (operands gathered, results replicated)"
                   if eqn.name in CONTROL_FLOW else "no factor rule: kept replicated")
            unsupported.append((i, eqn.name, why))
            ins = [replicated(graph, v, mesh) for v in eqn.invars]
            outs = [replicated(graph, v, mesh) for v in eqn.outvars]
            ops.append(OpSharding(None, {}, ins, outs, [], ()))
            for v, t in zip(eqn.outvars, outs):
                types[v] = t
            continue
        use, _, _ = resolve(graph, rule, eqn, state, mesh, i)
        use = fit_use(mesh, rule, _drop_clashes(use))
        op = _op_sharding(graph, rule, eqn, use, types, mesh)
        if choose:
            cost = _op_cost(graph, eqn, op, types, state, mesh, targets)
            if cost > 0:
                for alt in _alternatives(graph, rule, eqn, state, types, mesh, use):
                    cand = _op_sharding(graph, rule, eqn, alt, types, mesh)
                    c = _op_cost(graph, eqn, cand, types, state, mesh, targets)
                    if c < cost:
                        op, cost = cand, c
                        if c == 0:
                            break
        ops.append(op)
        for v, t in zip(eqn.outvars, op.out_types):
            types[v] = t
    return Analysis(ops, types, unsupported, state)


FOLLOW = "follow"  # ``targets`` of a pass that prices no result (see :func:`_analyze_once`)


def analyze(graph: Graph, rules: list, state: State, mesh, choose: bool = True, passes: int = 3) -> Analysis:
    """Fix every op's factor axes (see :func:`_analyze_once`). With ``choose``, two starting passes are
    refined: one pricing results against the types the state gives them, one pricing no result
    (:data:`FOLLOW`: values keep the layout an op chose for them, so a per-op choice that differs from the
    state, e.g. a matmul keeping a sharded weight local, is not undone by a reshard at every reader). Each
    further pass prices results against the types their readers asked for in the pass before (and the
    outputs' types). Of all passes, the one whose program moves the fewest bytes is kept (the first one on
    ties, so the state-priced start wins unless another is strictly cheaper)."""
    first = _analyze_once(graph, rules, state, mesh, choose, None)
    if not choose:
        return first
    best, best_cost = first, program_bytes(graph, first, state, mesh)
    for start in (first, _analyze_once(graph, rules, state, mesh, True, FOLLOW)):
        cur = start
        c = program_bytes(graph, cur, state, mesh)
        if c < best_cost:
            best, best_cost = cur, c
        for _ in range(passes - 1):
            nxt = _analyze_once(graph, rules, state, mesh, True, _demands(graph, cur, state, mesh))
            c = program_bytes(graph, nxt, state, mesh)
            if c < best_cost:
                best, best_cost = nxt, c
            if nxt.types == cur.types:
                break
            cur = nxt
    return best


def _out_type(graph, analysis, state, v, mesh) -> ShardingType:
    if state is not None and v in state.dims and v not in graph.invars:
        return state_type(graph, state, v, mesh)
    return analysis.types[v].replace(partial=())


def _demands(graph, analysis, state, mesh) -> dict:
    """Per value: the distinct types its readers (and the outputs) want it in."""
    want: dict = {}
    for eqn, op in zip(graph.eqns, analysis.ops):
        for v, t in zip(eqn.invars, op.in_types):
            if v not in graph.consts:
                want.setdefault(v, set()).add(t)
    for v in graph.outvars:
        if v not in graph.consts:
            want.setdefault(v, set()).add(_out_type(graph, analysis, state, v, mesh))
    return {v: sorted(ts, key=str) for v, ts in want.items()}


def program_bytes(graph, analysis, state, mesh) -> float:
    """Bytes a device receives in the program lowered from ``analysis`` (each distinct reshard once)."""
    total = 0.0
    for v, ts in _demands(graph, analysis, state, mesh).items():
        total += sum(reshard_bytes(analysis.types[v], t) for t in ts)
    for op in analysis.ops:
        for _, axes in op.finish:
            k = mesh.group_size(tuple(axes))
            total += sum(2 * (k - 1) / k * t.local_bytes for t in op.out_types)
    return total


def _drop_clashes(use: dict) -> dict:
    """One mesh axis per op: a factor whose axes clash with an earlier-decided factor keeps the longest
    prefix that does not clash (rather than nothing)."""
    out, taken = {}, set()
    for f in sorted(use, key=lambda f: use[f][1]):
        axes, prov = use[f]
        keep = []
        for a in axes:
            if a in taken:
                break
            keep.append(a)
        if keep:
            out[f] = (tuple(keep), prov)
            taken.update(keep)
    return out


def _op_sharding(graph, rule, eqn, use, types, mesh) -> OpSharding:
    used = {a for axes, _ in use.values() for a in axes}
    new_partial = tuple(a for f, k in rule.reduce.items() if k == "sum" and f in use for a in use[f][0])
    finish = [(k, use[f][0]) for f, k in rule.reduce.items() if k in ("max", "min") and f in use]
    # pending sums that may pass through a linear op
    partials = [types[v].partial for v in eqn.invars]
    keep = [()] * len(partials)
    if rule.linear == "all" and partials and partials[0] and all(p == partials[0] for p in partials) \
            and not set(partials[0]) & used:
        keep = list(partials)
    elif rule.linear == "one" and sum(bool(p) for p in partials) == 1:
        j = next(k for k, p in enumerate(partials) if p)
        if not set(partials[j]) & used:
            keep[j] = partials[j]
    passed = next((p for p in keep if p), ())
    ins = [value_type(graph, v, mesh, tuple(dim_axes(mesh, rule, use, fs) for fs in dims), keep[k])
           for k, (v, dims) in enumerate(zip(eqn.invars, rule.operands))]
    outs = [value_type(graph, v, mesh, tuple(dim_axes(mesh, rule, use, fs) for fs in dims),
                       tuple(passed) + new_partial)
            for v, dims in zip(eqn.outvars, rule.results)]
    return OpSharding(rule, use, ins, outs, finish, new_partial)


def state_type(graph, state, v, mesh) -> ShardingType:
    """The (non-partial) type propagation gives value ``v``."""
    return value_type(graph, v, mesh, tuple(state.dims[v]))


def reshard_bytes(src: ShardingType, dst: ShardingType) -> float:
    """Bytes a device receives moving ``src`` to ``dst`` (the plan lowering would run); infinite when no
    redistribution can do it (``dst`` is partial over an axis ``src`` is not): a choice that needs it is
    never taken."""
    if src == dst:
        return 0.0
    try:
        check_pair(src, dst)
    except redist.ShardingError:
        return float("inf")
    return float(sum(b for _, _, b in _plan(src, dst)[1]))


def _op_cost(graph, eqn, op: OpSharding, types, state, mesh, targets=None) -> float:
    cost = sum(reshard_bytes(types[v], t) for v, t in zip(eqn.invars, op.in_types))
    for v, t in zip(eqn.outvars, op.out_types):
        if targets is FOLLOW:
            continue
        if targets is not None and v in targets:
            cost += sum(reshard_bytes(t, want) for want in targets[v])
        elif v in state.dims:
            cost += reshard_bytes(t, state_type(graph, state, v, mesh))
    for _, axes in op.finish:
        k = mesh.group_size(tuple(axes))
        cost += sum(2 * (k - 1) / k * t.local_bytes for t in op.out_types)
    return cost


def _alternatives(graph, rule, eqn, state, types, mesh, base, limit: int = 96):
    """Factor choices to compare with ``base``: per shardable factor, the axes its dims carry (in the
    state, or as operands are produced), their prefixes, or none; combinations with an axis used twice or
    blocks that do not compose are dropped (at most ``limit`` are returned)."""
    from partir_core.propagation import decompose

    opts: dict[str, set] = {}
    slots = [(types[v].dims, fs_list) for v, fs_list in zip(eqn.invars, rule.operands)]
    slots += [(tuple(state.dims[v]), fs_list) for v, fs_list in zip(eqn.invars, rule.operands)
              if v in state.dims]
    slots += [(tuple(state.dims[v]), fs_list) for v, fs_list in zip(eqn.outvars, rule.results)
              if v in state.dims]
    for dims, fs_list in slots:
        for axes, fs in zip(dims, fs_list):
            if not axes or not fs:
                continue
            parts = decompose(mesh, axes, fs, rule.sizes)
            if parts is None:
                continue
            for f, a in zip(fs, parts):
                if a and rule.shardable(f):
                    for j in range(1, len(a) + 1):
                        opts.setdefault(f, set()).add(tuple(a[:j]))
    for f, (a, _) in base.items():
        opts.setdefault(f, set()).add(tuple(a))
    factors = sorted(opts)
    choices = [[None] + sorted(opts[f]) for f in factors]
    out, seen = [], set()
    for combo in itertools.product(*choices):
        axes = [a for c in combo if c for a in c]
        if len(axes) != len(set(axes)):
            continue
        use = {f: (c, 0) for f, c in zip(factors, combo) if c}
        use = fit_use(mesh, rule, use)
        key = tuple(sorted((f, u[0]) for f, u in use.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(use)
        if len(out) >= limit:
            break
    return out


# ------------------------------------------------------------------------------------ the program
@dataclass(frozen=True)
class Collective:
    """One collective of the partitioned program: ``bytes`` received per device (redist's accounting)."""

    kind: str
    axes: tuple
    bytes: float
    where: str


@dataclass
class Reshard:
    src_buf: object
    dst_buf: object
    src: ShardingType
    dst: ShardingType
    plan: object  # redist.Plan or None (fallback)
    collectives: list


@dataclass
class Compute:
    """Run equation ``eqn_index`` on local shards. ``masks``: ``(operand, dim, kind)`` for every operand dim
    that is split unevenly and that the op reduces over (a contraction, a reduction, the summed dims of a
    scatter-add): its padding is replaced by the reduction's identity first (see :func:`_mask_padding`)."""

    eqn_index: int
    reads: list
    writes: list
    masks: list
    flops: float


@dataclass
class Finish:
    buf: object
    kind: str
    axes: tuple
    collectives: list


@dataclass
class LocalProgram:
    """Instructions over per-device buffers (value ids, or ``("r", n)`` for resharded copies)."""

    graph: Graph
    mesh: object
    analysis: Analysis
    instructions: list
    in_types: list
    out_types: list
    out_bufs: list
    buf_bytes: dict
    fallbacks: list = field(default_factory=list)

    @property
    def collectives(self) -> list[Collective]:
        return [c for ins in self.instructions if isinstance(ins, (Reshard, Finish)) for c in ins.collectives]

    def jax_mesh(self):
        devs = np.array(jax.devices()[: self.mesh.size])
        if devs.size < self.mesh.size:
            raise redist.ShardingError(f"the mesh {self.mesh} needs {self.mesh.size} JAX devices, "
                                       f"only {devs.size} are available")
        return jax.sharding.Mesh(devs.reshape(self.mesh.shape), self.mesh.names)

    def body(self, *xs):
        """The per-device program (call inside ``shard_map``)."""
        g = self.graph
        env = {v: keys.from_data(x, g.dtype(v)) for v, x in zip(g.invars, xs)}
        for v, c in g.consts.items():
            env[v] = c if keys.is_key(g.dtype(v)) else jnp.asarray(c, dtype=g.dtype(v))
        for ins in self.instructions:
            if isinstance(ins, Reshard):
                env[ins.dst_buf] = _reshard(env[ins.src_buf], ins)
            elif isinstance(ins, Compute):
                eqn = g.eqns[ins.eqn_index]
                op = self.analysis.ops[ins.eqn_index]
                vals = [env[b] for b in ins.reads]
                for i, d, kind in ins.masks:
                    vals[i] = _mask_padding(vals[i], op.in_types[i], d, kind)
                ctx = LocalContext(eqn, local_shapes(g, eqn.invars, op.in_types),
                                   local_shapes(g, eqn.outvars, op.out_types), [t.dims for t in op.out_types],
                                   self.mesh, op.new_partial)
                if op.rule is None or op.rule.local is None:
                    outs = _bind(ctx, *vals)
                else:
                    outs = op.rule.local(ctx, *vals)
                for b, x in zip(ins.writes, outs):
                    env[b] = x
            elif isinstance(ins, Finish):
                red = lax.pmax if ins.kind == "max" else lax.pmin
                env[ins.buf] = red(env[ins.buf], tuple(ins.axes))
        return tuple(keys.to_data(env[b]) for b in self.out_bufs)

    def run(self, *flat_args):
        return self.executable()(*flat_args)

    def executable(self):
        """The jitted program on global arrays. ``shard_map`` needs dims that divide their axes, so inputs
        with uneven dims are padded (with zeros) to their ``padded_shape`` first, whose blocks are exactly
        the padded local buffers, and outputs are cut back to their shape. Key arrays cross the boundary as
        their key data (their types' arrays)."""
        if not hasattr(self, "_exe"):
            mapped = jax.shard_map(self.body, mesh=self.jax_mesh(),
                                   in_specs=tuple(t.partition_spec() for t in self.in_types),
                                   out_specs=tuple(t.partition_spec() for t in self.out_types),
                                   check_vma=False)

            def run(*xs):
                xs = [keys.to_data(x) for x in xs]
                xs = [x if t.is_even() else jnp.pad(x, [(0, p - n) for n, p in zip(t.shape, t.padded_shape)])
                      for x, t in zip(xs, self.in_types)]
                outs = mapped(*xs)
                outs = [y if t.is_even() else y[tuple(slice(0, n) for n in t.shape)]
                        for y, t in zip(outs, self.out_types)]
                return tuple(keys.from_data(y, self.graph.dtype(v)) for y, v in zip(outs, self.graph.outvars))

            self._exe = jax.jit(run)
        return self._exe


_IDENTITY = {"sum": 0, "max": -np.inf, "min": np.inf}


def _mask_padding(x, t: ShardingType, dim: int, kind: str):
    """``x`` (a local buffer of type ``t``) with the padding of uneven dim ``dim`` set to the identity of a
    ``kind`` reduction (0 for sums, -inf / +inf or the dtype's extremes for max / min), so that reducing
    over the dim counts data only. Padding holds whatever the ops before computed there (never data)."""
    L = t.local_shape[dim]
    start = lax.axis_index(tuple(t.dims[dim])) * L
    valid = lax.broadcasted_iota(jnp.int32, x.shape, dim) + start < t.shape[dim]
    fill = _IDENTITY[kind]
    if jnp.issubdtype(x.dtype, jnp.integer) and fill:
        info = jnp.iinfo(x.dtype)
        fill = info.min if fill < 0 else info.max
    elif x.dtype == jnp.bool_:
        fill = kind == "min"
    return jnp.where(valid, x, jnp.asarray(fill, x.dtype))


_PLANS: dict = {}


def _plan(src: ShardingType, dst: ShardingType):
    """``(plan or None, collectives)``; None means: use the gather-and-slice fallback."""
    key = (src, dst)
    if key not in _PLANS:
        try:
            plan = redist.synthesize(src, dst)
            if any(":" in a for a in plan.program.axis_tokens()):
                raise redist.ShardingError("plan names sub-axes")
            cols = [(s.kind, tuple(getattr(s, "axes", ()) or src.mesh.names), float(b))
                    for s, b in zip(plan.steps, plan.step_bytes()) if s.kind != "all_slice"]
            _PLANS[key] = (plan, cols)
        except (redist.ShardingError, NotImplementedError, RecursionError) as e:
            _PLANS[key] = (None, _fallback_collectives(src, dst), str(e))
    return _PLANS[key]


def _fallback_collectives(src, dst):
    out = []
    t = src
    drop = tuple(a for a in src.partial if a not in dst.partial)
    if drop:
        k = src.mesh.group_size(drop)
        out.append(("all_reduce", drop, 2 * (k - 1) / k * t.local_bytes))
        t = t.replace(partial=dst.partial)
    for d, axes in enumerate(t.dims):
        if axes:
            k = src.mesh.group_size(axes)
            dims = list(t.dims)
            dims[d] = ()
            t = t.replace(dims=tuple(dims))
            out.append(("all_gather", tuple(axes), (k - 1) / k * t.local_bytes))
    return out


def _reshard(x, ins: Reshard):
    if keys.is_key(x.dtype):  # a key array's type is its key data's
        return keys.from_data(_reshard(keys.to_data(x), ins), x.dtype)
    if ins.plan is not None:
        from redist.jax import run_program

        return run_program(ins.plan.program, x)
    src, dst = ins.src, ins.dst
    drop = tuple(a for a in src.partial if a not in dst.partial)
    if drop:
        x = lax.psum(x.astype(jnp.int32), drop) != 0 if x.dtype == jnp.bool_ else lax.psum(x, drop)
    for d, axes in enumerate(src.dims):
        if axes:
            x = lax.all_gather(x, tuple(axes), axis=d, tiled=True)
    for d, axes in enumerate(dst.dims):
        if axes:
            n = dst.local_shape[d]
            x = lax.dynamic_slice_in_dim(x, lax.axis_index(tuple(axes)) * n, n, axis=d)
    return x


def _masks(op: OpSharding) -> list:
    """The operand dims of ``op`` whose padding must be masked: split unevenly and reduced over by the op."""
    if op.rule is None:
        return []
    out = []
    for i, (dims, t) in enumerate(zip(op.rule.operands, op.in_types)):
        for d, fs in enumerate(dims):
            kinds = {op.rule.reduce[f] for f in fs if f in op.rule.reduce and f in op.use}
            if kinds and not t.is_even(d):
                (kind,) = kinds
                out.append((i, d, kind))
    return out


def lower(graph: Graph, analysis: Analysis, mesh, state: State | None = None) -> LocalProgram:
    """The local program of ``analysis``. A reshard of one buffer to one type is made once and its result
    reused by every later reader. Outputs are given the type propagation gives them (``state``; without
    it, their producer's type with pending sums reduced)."""
    types = analysis.types
    state = analysis.state if state is None else state
    instructions: list = []
    buf_bytes = {v: t.local_bytes for v, t in types.items()}
    fallbacks = []
    counter = [0]
    made: dict = {}

    def move(buf, src, dst, where):
        if src == dst:
            return buf
        if (buf, dst) in made:
            return made[(buf, dst)]
        entry = _plan(src, dst)
        plan, cols = entry[0], entry[1]
        if plan is None:
            fallbacks.append((where, str(src), str(dst), entry[2]))
        counter[0] += 1
        new = ("r", counter[0])
        buf_bytes[new] = dst.local_bytes
        instructions.append(Reshard(buf, new, src, dst, plan,
                                    [Collective(k, a, b, where) for k, a, b in cols]))
        made[(buf, dst)] = new
        return new

    for i, (eqn, op) in enumerate(zip(graph.eqns, analysis.ops)):
        where = f"eqn {i} ({eqn.name})"
        reads = [move(v, types[v], t, where) for v, t in zip(eqn.invars, op.in_types)]
        f = flops(eqn.name, local_shapes(graph, eqn.invars, op.in_types),
                  local_shapes(graph, eqn.outvars, op.out_types), eqn.params)
        instructions.append(Compute(i, reads, list(eqn.outvars), _masks(op), f))
        for kind, axes in op.finish:
            k = mesh.group_size(tuple(axes))
            b = sum(2 * (k - 1) / k * t.local_bytes for t in op.out_types)
            instructions.append(Finish(eqn.outvars[0], kind, tuple(axes),
                                       [Collective("all_reduce_" + kind, tuple(axes), b, where)]))
    out_types, out_bufs = [], []
    for j, v in enumerate(graph.outvars):
        t = types[v]
        dst = _out_type(graph, analysis, state, v, mesh)
        out_bufs.append(move(v, t, dst, f"output {j}"))
        out_types.append(dst)
    in_types = [types[v] for v in graph.invars]
    return LocalProgram(graph, mesh, analysis, instructions, in_types, out_types, out_bufs, buf_bytes,
                        fallbacks)
