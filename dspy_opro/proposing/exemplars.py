"""Which training problems the meta-prompt shows: the authors' uniform draw, reproduced exactly.

OPRO shows the optimizer model a few training problems next to the scored instructions. The authors draw
``k`` of them uniformly at every step with ``np.random.seed(step)`` (criteria ``"random"``) or draw the step-0
set every time (``"constant"``); :func:`draw_exemplar_indices` reproduces both draws exactly for ``seed=0``
without touching numpy's global random state.

How a drawn example is shown (its question and answer) is :mod:`dspy_opro.task.data`'s and
:mod:`dspy_opro.proposing.step_inputs`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

# Spreads user seeds far apart so that seed s at step t never collides with seed s' at step t'.
_SEED_STRIDE = 100003


def draw_exemplar_indices(
    indices: Sequence[int], k: int, step: int, *, seed: int = 0, criteria: str = "random"
) -> list[int]:
    """Draw ``k`` distinct elements of ``indices`` for one step, sorted ascending.

    With ``seed=0`` the draw equals the authors': ``np.random.seed(step)`` followed by
    ``np.random.choice(indices, k, replace=False)`` for ``"random"``, and the step-0 draw at every step for
    ``"constant"``. Any other seed uses ``RandomState(seed * 100003 + step)``. numpy's global state is untouched.

    Args:
        indices: The candidates to draw from (for example the training-set positions).
        k: How many to draw; at most ``len(indices)``.
        step: The 0-based optimization step.
        seed: The run's seed.
        criteria: ``"random"`` (a new draw every step) or ``"constant"`` (the same draw every step).

    Raises:
        ValueError: On an unknown criteria or when ``k`` exceeds the number of indices.
    """
    if criteria not in ("random", "constant"):
        raise ValueError(f"criteria must be 'random' or 'constant', got {criteria!r}")
    if k < 0 or k > len(indices):
        raise ValueError(f"cannot draw {k} exemplars from {len(indices)} indices; lower num_exemplars")
    if k == 0:
        return []
    import numpy as np  # here, not at the top: ``import dspy_opro`` stays cheap

    draw_step = step if criteria == "random" else 0
    rng = np.random.RandomState(seed * _SEED_STRIDE + draw_step)
    chosen = rng.choice(np.asarray(list(indices)), k, replace=False)
    return sorted(int(i) for i in chosen)
