"""Shared by the packaging tests: the project's wheel, built as ``pip install .`` builds it."""

import os
import shutil
import subprocess
import sys

import pytest
from tests import ROOT

# What a clean checkout holds that the build reads (proofs/ too: the wheel must leave it out).
SOURCES = ("redist", "partir_core", "proofs", "pyproject.toml", "README.md", "LICENSE")


def build_wheel(tmp_path):
    """Build the project's wheel from a copy of its sources (as ``pip install .`` would, in an isolated build
    environment unless this one can build it) into ``tmp_path / "dist"``; returns its path."""
    src = tmp_path / "src"
    for name in SOURCES:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(tmp_path / "dist")]
    proc = subprocess.run(cmd + ["--no-build-isolation"], capture_output=True, text=True, timeout=600)
    if proc.returncode:  # this environment's setuptools cannot build wheels: the isolated build fetches one
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode and ("No matching distribution" in proc.stderr or "connection" in proc.stderr.lower()):
            pytest.skip("building the wheel needs setuptools>=77 from a package index, which is out of reach")
        assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("redist-*.whl")
    return wheel
