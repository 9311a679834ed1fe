"""Where the calibration benchmarks write: one section of a redist calibration profile.

``bench/calibrate_cpu_host.py`` measures the ``link`` section, ``bench/partitioning.py --calibrate`` the
``compute`` section of the ``cpu-host`` profile (schema: ``redist/profiles/cpu-host.json``). By default both
write the profile that the package reads in this checkout (:data:`PACKAGE_PROFILE`, the package data
``redist/profiles/cpu-host.json``: a later ``pip install .`` ships it); ``--out PATH`` writes a copy instead,
put in use with ``redist.cost.use_profile(PATH)``.
"""

from __future__ import annotations

import importlib.resources
import json
import os

from redist import cost

PACKAGE_PROFILE = str(importlib.resources.files("redist").joinpath(cost.PROFILE_RESOURCE))


def write_section(path: str, section: str, values: dict) -> cost.Profile:
    """Replace ``section`` (``"link"`` or ``"compute"``) of the profile at ``path`` (a new file starts from
    the package's profile) with ``values``, check that the result loads, write it, and put it in use."""
    base = path if os.path.exists(path) else PACKAGE_PROFILE
    with open(base) as f:
        data = json.load(f)
    data[section] = values
    profile = cost.load_profile(data)  # raises before anything is written
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    cost.use_profile(path)
    return profile
