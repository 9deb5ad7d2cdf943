"""What ``import dspy_opro`` adds to ``import dspy``: wall time (median of fresh interpreters) and modules pulled in.

Each run starts a fresh interpreter (``sys.executable``, ``LITELLM_LOCAL_MODEL_COST_MAP=True``) that times
``import dspy``, then ``import dspy_opro``, then ``from dspy_opro import OPROTeleprompter`` with
``time.perf_counter``, and lists the top-level packages the second import added. The aim (issue 14) is under
100 ms for ``import dspy_opro``. ``-X importtime`` of one more interpreter shows where the time goes.

    python benchmarks/import_time.py              # 9 runs; writes results/import_time.md
    python benchmarks/import_time.py --runs 5 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "import_time.md"
AIM_MS = 100.0

_PROBE = """
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import dspy
t1, c1 = time.perf_counter(), time.process_time()
before = set(sys.modules)
import dspy_opro
t2, c2 = time.perf_counter(), time.process_time()
added = sorted({m.split('.')[0] for m in set(sys.modules) - before})
from dspy_opro import OPROTeleprompter
t3 = time.perf_counter()
print(json.dumps({"dspy": t1 - t0, "dspy_opro": t2 - t1, "teleprompter": t3 - t2, "added": added,
                  "dspy_cpu": c1 - c0, "dspy_opro_cpu": c2 - c1}))
"""

HEAVY = ("numpy", "litellm", "matplotlib", "distributed", "scipy", "pandas")


def probe() -> dict:
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def importtime_rows(limit: int = 8) -> list[tuple[int, int, str]]:
    """The slowest ``dspy_opro`` modules under ``-X importtime`` (self us, cumulative us, name)."""
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import dspy; import dspy_opro"], env=env,
                         check=True, capture_output=True, text=True).stderr
    lines = err.splitlines()
    start = max(i for i, line in enumerate(lines) if line.rstrip().endswith("| dspy"))
    rows = []
    for line in lines[start + 1 :]:
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
    return sorted(rows, key=lambda row: -row[1])[:limit]


def _all(runs: list[dict], key: str, digits: int) -> str:
    return ", ".join(f"{1000 * run[key]:.{digits}f}" for run in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    runs = [probe() for _ in range(args.runs)]
    ms = {key: statistics.median(1000 * run[key] for run in runs)
          for key in ("dspy", "dspy_opro", "teleprompter", "dspy_cpu", "dspy_opro_cpu")}
    added = sorted({name for run in runs for name in run["added"]})
    heavy = [name for name in added if name in HEAVY]
    lines = [
        "# Import time of dspy_opro",
        "",
        f"Written by `python benchmarks/import_time.py`. Median of {args.runs} fresh interpreters "
        "(`time.perf_counter` around each import, and the process's CPU time, `time.process_time`, which a busy "
        "machine inflates less; `LITELLM_LOCAL_MODEL_COST_MAP=True`).",
        "",
        "| import | median ms | all runs ms |",
        "| --- | ---: | --- |",
        f"| `import dspy` | {ms['dspy']:.0f} | {_all(runs, 'dspy', 0)} |",
        f"| `import dspy_opro` (after dspy) | {ms['dspy_opro']:.1f} | {_all(runs, 'dspy_opro', 1)} |",
        f"| `import dspy`, CPU time | {ms['dspy_cpu']:.0f} | {_all(runs, 'dspy_cpu', 0)} |",
        f"| `import dspy_opro` (after dspy), CPU time | {ms['dspy_opro_cpu']:.1f} | {_all(runs, 'dspy_opro_cpu', 1)} |",
        f"| `from dspy_opro import OPROTeleprompter` (after that) | {ms['teleprompter']:.2f} | "
        f"{_all(runs, 'teleprompter', 2)} |",
        "",
        f"Aim: `import dspy_opro` under {AIM_MS:.0f} ms: {'met' if ms['dspy_opro'] < AIM_MS else 'NOT met'} in wall "
        f"time, {'met' if ms['dspy_opro_cpu'] < AIM_MS else 'NOT met'} in CPU time. "
        f"Top-level packages it adds: {', '.join(added)}; heavy ones among them ({', '.join(HEAVY)}): "
        f"{', '.join(heavy) or 'none'}.",
        "",
        "Slowest dspy_opro modules in one more interpreter (`-X importtime`, microseconds):",
        "",
        "| self us | cumulative us | module |",
        "| ---: | ---: | --- |",
        *[f"| {own} | {cumulative} | `{name.strip()}` |" for own, cumulative, name in importtime_rows()],
        "",
        f"Machine: python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
    return 0 if ms["dspy_opro"] < AIM_MS and not heavy else 1


if __name__ == "__main__":
    raise SystemExit(main())
