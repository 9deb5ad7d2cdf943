"""Racing variants replayed on recorded full compiles of the simulated task: the landscapes real runs produce.

First, per training-set size and seed, one real ``OPROTeleprompter.compile`` with ``racing=False`` (full
evaluation) on the simulated task, exactly as ``racing_runs.py`` compiles it; every candidate's per-example scores
are saved (JSON, one file per run, in ``--cache``; a run already there is not compiled again). Then every variant
of ``racing_variants.VARIANTS`` races those recorded steps (each step's proposals against the best fully scored
candidate before the step, as the library does) and the full calls / racing calls ratios are printed, over all
seeds and on the worst. A replay keeps full evaluation's trajectory (the proposals full evaluation's meta-prompts
produced), so it measures racing's decisions, not what a raced-out candidate's partial mean does to later steps.

    python benchmarks/racing_recorded.py --n 100 --seeds 6 --cache /tmp/racing-recorded
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from racing_simulation import Landscape  # noqa: E402
from racing_variants import VARIANTS, run  # noqa: E402


def record(*, n: int, seed: int, steps: int, candidates: int, cache: Path) -> Path:
    """Compile once with full evaluation and save every scored candidate's per-example scores by step."""
    path = cache / f"full-n{n}-seed{seed}-{steps}x{candidates}.json"
    if path.exists():
        return path
    import dspy

    from dspy_opro import OPROTeleprompter
    from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

    trainset = simulated_dataset(n, seed=seed)
    with SimulatedEndpoint(seed=seed) as endpoint:
        connection = {"api_base": endpoint.base_url, "api_key": "offline", "engine": "litellm", "cache": False,
                      "num_retries": 0}
        compiled = OPROTeleprompter(
            simulated_metric, prompt_model=dspy.LM("openai/sim-opt", **connection),
            task_model=dspy.LM("openai/sim-task", **connection), num_steps=steps, num_candidates=candidates,
            num_threads=8, racing=False, seed=seed).compile(dspy.Predict("question -> answer"), trainset=trainset)
    scored = [c for c in compiled.opro_run.candidates if c.status == "scored"]
    data = {"n": n, "seed": seed, "start": [c.scores for c in scored if c.step == -1][0],
            "steps": [[c.scores for c in scored if c.step == s] for s in range(steps)]}
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def load(path: Path) -> Landscape:
    data = json.loads(path.read_text())
    steps = [np.array(step, dtype=float).reshape(len(step), data["n"]) for step in data["steps"] if step]
    return Landscape(start=np.array(data["start"], dtype=float), steps=steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=str, default="100")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/racing-recorded"))
    parser.add_argument("--variants", type=str, default="", help="comma-separated indexes into VARIANTS (all)")
    args = parser.parse_args(argv)
    names = list(VARIANTS)
    chosen = [names[int(i)] for i in args.variants.split(",")] if args.variants else names
    sizes = [int(v) for v in args.n.split(",")]
    runs = {n: [load(record(n=n, seed=s, steps=args.steps, candidates=args.candidates, cache=args.cache))
                for s in range(args.seeds)] for n in sizes}
    print("| variant | " + " | ".join(f"n = {n}: ratio (worst), winner = full's" for n in sizes) + " |")
    print("| --- |" + " ---: |" * len(sizes))
    for name in chosen:
        cells = []
        for n, landscapes in runs.items():
            full = [n * (1 + sum(len(p) for p in ls.steps)) for ls in landscapes]
            best = [max([ls.start.mean(), *(p.mean(axis=1).max() for p in ls.steps)]) for ls in landscapes]
            outs = [run(ls, seed=s, alpha=args.alpha, options=VARIANTS[name]) for s, ls in enumerate(landscapes)]
            calls = [o[0] for o in outs]
            same = sum(abs(o[1] - b) < 1e-12 for o, b in zip(outs, best, strict=True))
            worst = min(a / b for a, b in zip(full, calls, strict=True))
            cells.append(f"{sum(full) / sum(calls):.2f}x ({worst:.2f}x), {same} of {len(outs)}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
