"""Launch tests/redist/mpi_worker.py under the virtual environment's ``mpiexec``: the one launcher of the MPI tests
and of ``proofs.differential``. It imports no MPI itself, so the launching process stays outside the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from tests import ROOT

WORKER = os.path.join(ROOT, "tests", "redist", "mpi_worker.py")
MPIEXEC = os.path.join(sys.prefix, "bin", "mpiexec")


def mpirun(n: int, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float, bool]:
    """Run ``mpiexec -n n python tests/redist/mpi_worker.py *args`` from the repository root.

    Returns ``(completed process with text stdout and stderr, seconds, hung)``. A job still running after
    ``timeout`` seconds is killed whole (``mpiexec`` and every rank, which share a session of their own) and
    comes back with ``hung`` true and the output it had written."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [MPIEXEC, "-n", str(n), sys.executable, WORKER, *args]
    t0 = time.monotonic()
    hung = False
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            hung = True
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), time.monotonic() - t0, hung
