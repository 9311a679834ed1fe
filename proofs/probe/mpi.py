"""MPI failure scenarios, under the virtual environment's ``mpiexec`` (tests/mpi_launch.py): a rank that leaves
``redist.mpi.abort_on_error`` by ``sys.exit(0)``, and in the full run a rank that fails mid-plan. Every rank
aborts with the message that names the cause, and nothing hangs. tests/redist/test_mpi_backend.py covers the other
scenarios (argument mismatches on some ranks, exits with other statuses, failures inside the block)."""

from __future__ import annotations

import os

from proofs.probe.tally import Tally

SCENARIOS = [  # (ranks and tests/redist/mpi_worker.py arguments, the words of the output, the full run only)
    ((2, "exit_in_block", "1", "0"), ("rank 1 left the block by sys.exit with status 0", "aborting all 2 ranks"),
     False),
    ((4, "fail"), ("injected failure on rank 0 before instruction 2", "aborting all 4 ranks"), True),
]


def probe(seed: int, quick: bool) -> Tally:
    from tests.redist.mpi_launch import MPIEXEC, mpirun

    tally = Tally("mpi")
    if not os.path.exists(MPIEXEC):
        tally.notes.append(f"mpi: no mpiexec at {MPIEXEC}: nothing tried")
        return tally
    for (n, *args), words, full_only in SCENARIOS:
        if quick and full_only:
            continue
        proc, _, hung = mpirun(n, *args, timeout=120)
        out = proc.stdout + proc.stderr
        ok = not hung and proc.returncode != 0 and all(w in out for w in words)
        tally.add("every rank aborted" if ok else "hang" if hung else "wrong", None if ok else
                  f"mpiexec -n {n} python tests/redist/mpi_worker.py {' '.join(args)}: exit {proc.returncode}, hung {hung}: "
                  f"{out[-800:]}")
    return tally
