"""A plan's stages read as one sequence of instructions over buffers (:class:`Chain`).

A plan within one mesh lowers to one :class:`~redist.program.Program`; a plan across meshes to a program per run
of steps on one mesh and a :class:`~redist.program.Transfer` between each two (:attr:`redist.Plan.stages`: program,
transfer, program, …, in the order they run). The verifier reads either as one chain: the instructions of the
programs in order, each transfer one instruction between two of them, and the buffer shape before each
instruction and after the last. Instructions are numbered along the chain (a message's "instruction t" counts
the transfers too), and buffer ``t``, the one before instruction ``t``, belongs to one program: a transfer reads
the last buffer of the program before it and writes the first of the program after it. A walk writes a device
of buffer ``t`` by its coordinates on the mesh of that program (:meth:`Chain.program_at`), whose devices hold
it.
"""

from __future__ import annotations

from dataclasses import dataclass

from redist import program as P
from redist.verify.verdict import Refuted


@dataclass(frozen=True)
class Chain:
    """The stages of a plan as one sequence. ``programs``: the programs in order; ``instructions`` and
    ``shapes``: theirs, concatenated, each transfer an instruction between the last buffer of one program and
    the first of the next (``len(shapes) == len(instructions) + 1`` where each program lists a shape per buffer:
    checked by :func:`~redist.verify.wellformed.derive_shapes`); ``owner[t]``: the index in ``programs`` of the
    program buffer ``t`` belongs to."""

    programs: tuple
    instructions: tuple
    shapes: tuple
    owner: tuple[int, ...]

    @classmethod
    def read(cls, stages) -> "Chain":
        """The chain of ``stages``: a :class:`~redist.program.Program`, or programs and transfers that alternate,
        beginning and ending with a program (the form of :attr:`redist.Plan.stages`), else refuted. The kinds
        of the stages and of their fields are the caller's to check."""
        if isinstance(stages, P.Program):
            stages = (stages,)
        if not (len(stages) % 2 and all(isinstance(s, P.Transfer) == (i % 2 == 1) for i, s in enumerate(stages))):
            kinds = ", ".join(type(s).__name__ for s in stages)
            raise Refuted(f"the plan's stages ({kinds}) do not alternate programs and transfers, beginning and "
                          "ending with a program: a transfer moves the buffers of one program's mesh to the next "
                          "program's")
        programs = stages[::2]
        instructions, shapes, owner = [], [], []
        for k, program in enumerate(programs):
            if k:
                instructions.append(stages[2 * k - 1])
            instructions += program.instructions
            shapes += program.shapes
            owner += [k] * (len(program.instructions) + 1)
        return cls(tuple(programs), tuple(instructions), tuple(shapes), tuple(owner))

    @property
    def src_mesh(self):
        """The device order of the input buffers: the first program's ``src_mesh``."""
        return self.programs[0].src_mesh

    @property
    def dst_mesh(self):
        """The device order of the result: the last program's ``dst_mesh``."""
        return self.programs[-1].dst_mesh

    @property
    def dtype(self):
        return self.programs[0].dtype

    @property
    def crosses_meshes(self) -> bool:
        """Whether the chain has transfers (a plan across meshes)."""
        return len(self.programs) > 1

    def program_at(self, t: int):
        """The program buffer ``t`` belongs to."""
        return self.programs[self.owner[t]]

    def transfers(self):
        """``(t, transfer)`` for each transfer, ``t`` its instruction number."""
        return [(t, ins) for t, ins in enumerate(self.instructions) if isinstance(ins, P.Transfer)]

    def first_instruction(self, k: int) -> int:
        """The number of program ``k``'s first instruction (its first buffer's)."""
        return self.owner.index(k)
