"""``import dspy_opro`` stays cheap: it pulls in no heavy package on top of ``import dspy``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = """
import json, sys
import dspy
before = set(sys.modules)
import dspy_opro
from dspy_opro import OPRO, OPROTeleprompter, RunState
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_import_adds_no_heavy_package():
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True, capture_output=True, text=True)
    added = json.loads(out.stdout.strip().splitlines()[-1])
    assert {name.split(".")[0] for name in added} == {"dspy_opro"}  # no numpy, litellm, matplotlib, tqdm, ...
    # The run, the DPP, racing and the test server load when a compile (or a test) needs them.
    assert not {"dspy_opro.run", "dspy_opro.diversity", "dspy_opro.racing", "dspy_opro.testing"} & set(added)
