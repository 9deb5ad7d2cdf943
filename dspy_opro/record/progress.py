"""What a person watching a run sees while it scores: a bar per scoring phase, and log lines that never break it.

A run spends its time scoring: the program as given (step -1), each step's new candidates, the validation
contenders, the label-free gate. :class:`Progress` gives each such phase its own ``tqdm`` bar. The description names
the phase ("start", "step 3: 8 candidates", "validation: 3 candidates", "label-free gate: candidate 7"), the total is
the evaluations the phase has to run, and the postfix is the best score so far on the 0-100 scale of the log lines
("best 72.5"; "best 72.5, val 70.0" once a validation score exists). The bar shows its final count and is removed
when the phase ends; the phase's log line keeps the result.

When bars show: ``display_progress=True`` (the default; DSPy's name for the switch) and stderr is a terminal or a
Jupyter kernel's stream. Written to a file, a pipe or a CI log, the bars stay off (tqdm's own ``disable=None``
rule, with notebooks let in), since a bar redrawn there is a line of text per refresh; ``dspy.Evaluate`` instead
draws wherever stdout goes. ``display_progress=False`` turns them off everywhere.

While bars are on, the console handlers of the ``dspy_opro`` and ``dspy`` loggers (and only theirs: DSPy's logging
stream, ``sys.stderr``, ``sys.stdout``) write through the open bar, as ``tqdm.write`` does for ``print``: the bar is
cleared, the line written whole, the bar drawn again. When the run ends, every handler it changed gets back exactly
the stream it had, unless something else replaced the stream meanwhile.

:func:`import_litellm_announced` explains the other silence of a run: LiteLLM's first import takes seconds.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

import tqdm

from dspy_opro.compat import dspy_logging_stream, lm_engine
from dspy_opro.record.state import START_ID, Candidate

logger = logging.getLogger(__name__)

ROUTED_LOGGERS = ("dspy_opro", "dspy")  # the loggers whose console handlers write around an open bar


def shows_bars(stream: Any) -> bool:
    """Whether a bar drawn on ``stream`` reaches a person: a terminal or a Jupyter kernel's output stream."""
    if stream is None:
        return False
    if type(stream).__module__.split(".")[0] == "ipykernel":
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def best_postfix(train: float | None, val: float | None = None) -> str:
    """The bar's postfix: the best training score so far and, once there is one, the best validation score."""
    if train is None:
        return ""
    text = f"best {100 * train:.1f}"
    return text if val is None else f"{text}, val {100 * val:.1f}"


class _ThroughBar:
    """A log handler's stream that writes around the open bar: clear it, write the line whole, draw it again."""

    def __init__(self, stream: Any, progress: Progress):
        self.stream = stream
        self._progress = progress

    def write(self, text: str) -> int | None:
        bar = self._progress.bar
        if bar is None or not getattr(self.stream, "enabled", True):  # DSPy's stream after dspy.disable_logging()
            return self.stream.write(text)
        with bar.get_lock():  # tqdm's lock: a refresh from another thread cannot land mid-line
            bar.clear(nolock=True)
            written = self.stream.write(text)
            self.stream.flush()
            bar.refresh(nolock=True)
        return written

    def flush(self) -> None:
        self.stream.flush()


class Progress:
    """The bars of one run: one per scoring phase.

    Args:
        display: ``display_progress``: False shows no bar anywhere.
        file: Where bars go; None: ``sys.stderr`` as it is when a phase starts.
    """

    def __init__(self, *, display: bool, file: TextIO | None = None):
        self.display = display
        self.file = file
        self.bar: tqdm.tqdm | None = None
        self._postfix = ""
        self._routed: list[tuple[logging.StreamHandler[Any], Any, _ThroughBar]] = []

    def start_phase(self, desc: str, total: int) -> None:
        """Open the bar of a phase that runs ``total`` evaluations (none for an empty phase or with bars off)."""
        self.end_phase()
        file = self.file if self.file is not None else sys.stderr
        if not self.display or total <= 0 or not shows_bars(file):
            return
        self._route_logs()
        self.bar = tqdm.tqdm(total=total, desc=desc, unit="eval", file=file, leave=False, dynamic_ncols=True,
                             disable=False, postfix=self._postfix or None)

    def advance(self) -> None:
        """One evaluation of the phase finished."""
        if self.bar is not None:
            self.bar.update(1)

    def set_best(self, train: float | None, val: float | None = None) -> None:
        """The best scores so far (0 to 1), shown in the postfix of this phase's bar and the next ones."""
        postfix = best_postfix(train, val)
        if postfix == self._postfix:
            return
        self._postfix = postfix
        if self.bar is not None:
            self.bar.set_postfix_str(postfix)

    def end_phase(self) -> None:
        """Show the phase's final count, then remove its bar."""
        bar, self.bar = self.bar, None
        if bar is not None:
            bar.refresh()
            bar.close()

    def close(self) -> None:
        """End the open phase and give the log handlers their streams back."""
        self.end_phase()
        for handler, stream, wrapper in self._routed:
            if handler.stream is wrapper:  # restore only what this run changed and nobody changed since
                handler.setStream(stream)
        self._routed = []

    def _route_logs(self) -> None:
        if self._routed:
            return
        consoles = [sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, dspy_logging_stream()]
        for name in ROUTED_LOGGERS:
            for handler in logging.getLogger(name).handlers:
                if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
                    continue
                if any(handler.stream is stream for stream in consoles):
                    original, wrapper = handler.stream, _ThroughBar(handler.stream, self)
                    handler.setStream(wrapper)
                    self._routed.append((handler, original, wrapper))


def import_litellm_announced(models: Iterable[tuple[str, Any]]) -> bool:
    """Import LiteLLM up front, saying so, when a run model uses it and this process has not imported it yet.

    LiteLLM's first import takes several seconds (more when it fetches its price map); without a word the run
    would seem to hang before its first line. Models on other engines (DSPy's native one, custom engines) never
    import it here.

    Args:
        models: (role, LM) pairs, e.g. ``("optimizer", lm)``; None LMs are skipped.

    Returns:
        Whether LiteLLM was imported here.
    """
    if "litellm" in sys.modules:
        return False
    users = [f"the {role} model {getattr(lm, 'model', '')!r}" for role, lm in models
             if lm is not None and lm_engine(lm) == "litellm"]
    if not users:
        return False
    logger.info("Importing LiteLLM for %s (its first use in this process takes a few seconds)", " and ".join(users))
    importlib.import_module("litellm")
    return True


def phase_name(candidates: list[Candidate], split: str, *, label_free: bool) -> str:
    """The progress bar's name of a scoring phase: the start, a step, validation or the label-free gate."""
    count = f"{len(candidates)} candidate{'s' if len(candidates) != 1 else ''}"
    if split == "val" and label_free and len(candidates) == 1:
        return "label-free gate: " + ("start" if candidates[0].id == START_ID else f"candidate {candidates[0].id}")
    if split == "val":
        return f"validation: {count}"
    steps = {c.step for c in candidates}
    if steps == {-1}:
        return "start"
    return f"step {steps.pop()}: {count}" if len(steps) == 1 else f"unscored again: {count}"


def evaluations_due(candidates: list[Candidate], split: str, *, n_examples: int, remaining_budget: int | None) -> int:
    """The evaluations a scoring phase runs: every missing score, within what the evaluation budget has left."""
    due = sum(n_examples if scores is None else scores.count(None)
              for scores in (c.scores if split == "train" else c.val_scores for c in candidates))
    return due if remaining_budget is None else min(due, max(remaining_budget, 0))


__all__ = ["ROUTED_LOGGERS", "Progress", "best_postfix", "evaluations_due", "import_litellm_announced", "phase_name",
           "shows_bars"]
