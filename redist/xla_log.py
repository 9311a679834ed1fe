"""XLA's log on standard error while redist compiles a program of its own.

To choose between its plan and XLA's resharding, :func:`redist.jax_programs.route` compiles XLA's resharding of
an array. Where XLA would gather the whole array, its SPMD partitioner logs "[SPMD] Involuntary full
rematerialization ... which is inefficient" while compiling, about a program that redist then does not run
(it runs its plan instead). :func:`without_rematerialization_warning` keeps that line off standard error.

XLA logs from C++ (absl logging), on its compiler threads, straight to file descriptor 2: Python's
``logging`` and ``warnings`` never see the line, and absl's threshold (``TF_CPP_MIN_LOG_LEVEL``,
``jax_logging_level``) is one setting for the whole process that cannot be read back to be restored. So for
the duration of the block, descriptor 2 is pointed at a temporary file; at the end it is restored (also when
the block raises) and everything captured is written back to it except the rematerialization lines. What
other threads write to standard error meanwhile comes out whole, at the block's end; a rematerialization
line that a compile of another thread logs meanwhile is dropped with redist's. Blocks of several threads
share one capture, restored when the last of them ends. Where descriptor 2 cannot be redirected (it is closed),
the block runs as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading

__all__ = ["without_rematerialization_warning", "REMATERIALIZATION"]

#: The words that identify XLA's warning in a line of its log.
REMATERIALIZATION = b"Involuntary full rematerialization"

_lock = threading.Lock()
_blocks = 0  # blocks open, in any thread
_capture: tuple | None = None  # (the temporary file, a descriptor of the real standard error) while redirected


@contextlib.contextmanager
def without_rematerialization_warning():
    """A block (any thread, nested or not) whose XLA rematerialization warnings do not reach standard error;
    everything else written to descriptor 2 within it does, when the last open block ends."""
    _open()
    try:
        yield
    finally:
        _close()


def _open() -> None:
    global _blocks, _capture
    with _lock:
        if _blocks == 0:
            _capture = _redirect()
        _blocks += 1


def _close() -> None:
    global _blocks, _capture
    with _lock:
        _blocks -= 1
        if _blocks == 0 and _capture is not None:
            capture, _capture = _capture, None
            _restore(*capture)


def _redirect() -> tuple | None:
    """Point descriptor 2 at a new temporary file: ``(the file, a descriptor of what descriptor 2 was)``, or
    None where that cannot be done."""
    _flush_python_stderr()
    try:
        saved = os.dup(2)
    except OSError:
        return None
    try:
        log = tempfile.TemporaryFile()
        os.dup2(log.fileno(), 2)
    except OSError:
        os.close(saved)
        return None
    return log, saved


def _restore(log, saved: int) -> None:
    """Point descriptor 2 back at ``saved`` and write to it what ``log`` captured, less the warning's lines."""
    _flush_python_stderr()
    with log:
        try:
            os.dup2(saved, 2)
        finally:
            os.close(saved)
        log.seek(0)
        kept = b"".join(line for line in log if REMATERIALIZATION not in line)
    with contextlib.suppress(OSError):  # standard error went away: nowhere to say it
        while kept:
            kept = kept[os.write(2, kept):]


def _flush_python_stderr() -> None:
    """What Python holds in ``sys.stderr``'s buffer, written to the descriptor it was written for."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()
