"""The one interpreter loop of a lowered program, and the interface a backend implements for it.

A backend is a :class:`Backend`: one short method per instruction kind of :mod:`redist.program`, named
after it (:class:`~redist.program.AllGather` runs as ``all_gather``), that takes the instruction and the
current state and returns the next state. What the state is belongs to the backend: every device's numpy
buffer (numpy), one device's traced buffer (JAX, under ``jax.shard_map``), one rank's buffer and whether it
may be overwritten (MPI). :func:`run` is the only place that sequences instructions (einops'
``_apply_recipe`` over its thin backends is the model), so that what a backend does per instruction stays
local to one method.

Inputs are checked by each entry point, once per call, before :func:`run` (:mod:`redist.buffers` for the
data, :func:`check_program` for the program); :func:`run` itself trusts its arguments.
"""

from __future__ import annotations

import abc
import math
from typing import TypeVar

import numpy as np

from redist import program as P
from redist.buffers import describe
from redist.errors import ShardingError

State = TypeVar("State")

#: The method of :class:`Backend` that runs each instruction kind.
METHODS: dict[type, str] = {
    P.Reshape: "reshape",
    P.Transpose: "transpose",
    P.Slice: "slice",
    P.AllGather: "all_gather",
    P.AllToAll: "all_to_all",
    P.ReduceScatter: "reduce_scatter",
    P.AllReduce: "all_reduce",
    P.KeepRoot: "keep_root",
    P.EmbedChunk: "embed_chunk",
    P.CollectivePermute: "collective_permute",
    P.Exchange: "exchange",
}


class Backend(abc.ABC):
    """One runtime's implementation of the instructions of :mod:`redist.program` (semantics there). Each
    method maps the state before an instruction to the state after it."""

    @abc.abstractmethod
    def reshape(self, ins: P.Reshape, x): ...

    @abc.abstractmethod
    def transpose(self, ins: P.Transpose, x): ...

    @abc.abstractmethod
    def slice(self, ins: P.Slice, x): ...

    @abc.abstractmethod
    def all_gather(self, ins: P.AllGather, x): ...

    @abc.abstractmethod
    def all_to_all(self, ins: P.AllToAll, x): ...

    @abc.abstractmethod
    def reduce_scatter(self, ins: P.ReduceScatter, x): ...

    @abc.abstractmethod
    def all_reduce(self, ins: P.AllReduce, x): ...

    @abc.abstractmethod
    def keep_root(self, ins: P.KeepRoot, x): ...

    @abc.abstractmethod
    def embed_chunk(self, ins: P.EmbedChunk, x): ...

    @abc.abstractmethod
    def collective_permute(self, ins: P.CollectivePermute, x): ...

    @abc.abstractmethod
    def exchange(self, ins: P.Exchange, x): ...


def check_program(program, entry: str) -> None:
    """Raise :class:`ShardingError` unless ``program`` is a :class:`~redist.program.Program` of instructions of
    :mod:`redist.program` whose buffer shapes are the ones its instructions make
    (:func:`redist.program.shape_after`) and whose reductions its dtype has (no maximum or minimum of complex
    numbers), so that no backend meets an instruction it cannot run; ``entry`` names the caller in the
    message."""
    if not isinstance(program, P.Program):
        raise ShardingError(f"{entry} needs a redist.program.Program (plan.program), got {describe(program)}")
    if len(program.shapes) != len(program.instructions) + 1:
        raise ShardingError(f"{entry}: the program has {len(program.instructions)} instructions but "
                            f"{len(program.shapes)} buffer shapes (one more than instructions expected)")
    shape = tuple(program.shapes[0])
    for t, ins in enumerate(program.instructions):
        if type(ins) not in METHODS:
            raise ShardingError(f"{entry}: instruction {t} of the program is {describe(ins)}, not an instruction "
                                "of redist.program")
        try:
            shape = P.shape_after(ins, shape, program.mesh)
        except ShardingError as e:
            raise ShardingError(f"{entry}: instruction {t} of the program: {e}") from None
        if shape != tuple(program.shapes[t + 1]):
            raise ShardingError(f"{entry}: instruction {t} of the program makes buffers of shape {shape}, the "
                                f"program says {tuple(program.shapes[t + 1])}")
        if getattr(ins, "reduction", None) in ("max", "min") and np.dtype(program.dtype).kind == "c":
            raise ShardingError(f"{entry}: instruction {t} of the program takes the {ins.reduction} of "
                                f"{np.dtype(program.dtype).name} values; complex numbers have none")


def check_stages(stages, entry: str) -> None:
    """Raise :class:`ShardingError` unless ``stages`` is a plan's stages (:attr:`redist.Plan.stages`): a non-empty
    tuple of programs (each :func:`check_program`) and :class:`~redist.program.Transfer` s (each with a copy
    table that fits its buffers, :func:`redist.program.check_copy_table`), beginning and ending with a program;
    ``entry`` names the caller in the message."""
    if not (isinstance(stages, tuple) and stages):
        raise ShardingError(f"{entry} needs a plan's stages (plan.stages: programs and the transfers between "
                            f"them), got {describe(stages)}")
    for stage in stages:
        if isinstance(stage, P.Transfer):
            P.check_copy_table(stage.copies.copies, stage.src_shape, stage.shape, stage.src_mesh, stage.mesh,
                               f"{entry}: {stage}")
        else:
            check_program(stage, entry)
    if isinstance(stages[0], P.Transfer) or isinstance(stages[-1], P.Transfer):
        raise ShardingError(f"{entry}: a plan's stages begin and end with a program, a transfer between two")


def check_numbered_from_zero(program, entry: str) -> None:
    """Raise :class:`ShardingError` unless the checked ``program``'s meshes hold the devices ``0 … size−1`` (in
    any order): the JAX and MPI backends take device ids as JAX devices' ranks and MPI ranks, and run no other
    numbering yet (the numpy backend runs any); ``entry`` names the caller in the message."""
    mesh = next((m for m in (program.mesh, program.src_mesh, program.dst_mesh) if m.id_bound != m.size), None)
    if mesh is not None:
        raise ShardingError(f"{entry}: the program runs on mesh {mesh}, whose device ids are not 0 to "
                            f"{mesh.size - 1}; this runtime takes device ids as ranks 0 to size-1 (the numpy "
                            "backend runs any numbering)")


#: The most dims a numpy array has (numpy 2's ``NPY_MAXDIMS``): the numpy and MPI backends hold every buffer as one.
NUMPY_MAX_RANK = 64


def check_numpy_rank(program: P.Program, entry: str) -> None:
    """Raise :class:`ShardingError` where a buffer of the checked ``program`` has more dims than a numpy array
    can (a program splits dims, so an array of numpy's largest rank may need more); ``entry`` names the
    caller in the message."""
    rank = max(len(s) for s in program.shapes)
    if rank > NUMPY_MAX_RANK:
        raise ShardingError(f"{entry}: the program holds buffers of {rank} dims (it splits dims of the rank-"
                            f"{len(program.shapes[0])} array), more than numpy's {NUMPY_MAX_RANK}; the JAX backend "
                            "runs it: redist.execute(plan, shards, backend='jax')")


def run(program: P.Program, backend: Backend, x: State) -> State:
    """Run ``program``'s instructions in order on the state ``x`` with ``backend``'s methods; returns the
    state after the last one.

    A program whose buffers hold no elements (a dim of size 0) moves no data: it runs as one reshape to the
    result's shape (XLA refuses some collectives of empty operands, and no runtime need send nothing).
    """
    if all(math.prod(shape) == 0 for shape in program.shapes):
        return backend.reshape(P.Reshape(tuple(program.shapes[-1])), x)
    return run_instructions(program.instructions, backend, x)


def run_instructions(instructions, backend: Backend, x: State) -> State:
    """Run ``instructions`` (some of a program's, in its order) on the state ``x`` with ``backend``'s methods;
    returns the state after the last one."""
    for ins in instructions:
        x = getattr(backend, METHODS[type(ins)])(ins, x)
    return x
