"""OPRO (Optimization by PROmpting, Yang et al., ICLR 2024) as a DSPy teleprompter.

OPRO treats a language model as the optimizer of a program's instruction. At every step the optimizer model reads a
meta-prompt: the best instructions found so far with their training scores, in ascending order on a 0-100 scale,
followed by a few training problems with their answers, and a request for a new instruction that scores higher.
The meta-prompt is sent ``num_candidates`` times at temperature 1.0; each reply's instruction is extracted, polished
and de-duplicated, then scored by running the whole program on every training example and applying the metric. The
new scores join the history, so the next meta-prompt shows the optimizer what worked. After ``num_steps`` steps the
best instruction on training (the paper's choice) or the best of the ``top_k`` on a validation set is returned as
part of the program.

In a program with several predictors, each step optimizes one of them, round-robin, keeping the others at the best
instructions found so far. The meta-prompt text, reply parsing, polishing and de-duplication are the authors' own,
ported byte for byte in :mod:`dspy_opro.core.meta_prompt` and checked against their outputs; the step loop is
:mod:`dspy_opro.core.run`.

Example:
    ```python
    optimizer = OPROTeleprompter(metric=my_metric, prompt_model="openai/gpt-4o")
    compiled = optimizer.compile(program, trainset=train, valset=val)
    compiled.save("compiled.json")
    ```
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import replace
from typing import Any, Literal, ParamSpec, TypeVar

import dspy
from dspy.teleprompt import Teleprompter

from dspy_opro.compat import logging_through_dspy
from dspy_opro.core import settings as s
from dspy_opro.core.initial import check_initial_instructions
from dspy_opro.core.plan import RunPlan, price_map_setting_restored
from dspy_opro.extensions import HardDiverse, Racing, ValGate
from dspy_opro.record.observers import catch_up_mlflow_autolog, log_settings_to_mlflow

logger = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
ExemplarSelection = Literal["random", "constant", "hard_diverse"]


def unknown_keyword_error(function: str, unknown: str, known: Iterable[str]) -> TypeError:
    """The ``TypeError`` of a mistyped keyword, suggesting the closest known name (``num_step`` -> ``num_steps``)."""
    import difflib  # only on a mistake: ``import dspy_opro`` stays cheap

    close = difflib.get_close_matches(unknown, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; the known arguments are {sorted(known)}"
    return TypeError(f"{function} got an unexpected keyword argument {unknown!r}{hint}")


def suggest_keywords(method: Callable[P, R]) -> Callable[P, R]:
    """Turn Python's bare "unexpected keyword argument" into an error that names the closest known argument."""
    parameters = inspect.signature(method).parameters
    known = [name for name, p in parameters.items()
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name != "self"]
    owner = method.__qualname__.replace(".__init__", "")

    @functools.wraps(method)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        for name in kwargs:
            if name not in known:
                raise unknown_keyword_error(f"{owner}()", name, known)
        return method(*args, **kwargs)

    return checked


class OPROTeleprompter(Teleprompter):
    """Optimize the instructions of a DSPy program's predictors with OPRO.

    The settings are plain attributes (``optimizer.num_threads = 8`` works, as for DSPy's optimizers), checked when the
    optimizer is made and again at ``compile``, before any LM call.

    Args:
        metric: ``metric(example, prediction, trace=None)`` or ``metric(example, prediction)`` (as for
            ``dspy.Evaluate``; ``trace`` is passed only where the metric takes it) returning a float in [0, 1], a bool,
            or a ``dspy.Prediction(score=..., feedback=...)``. For label-free OPRO (no labels, no metric) pass
            ``dspy_opro.PairwisePreference(judge_model=...)``.

        prompt_model: The optimizer model: a ``dspy.LM`` or a LiteLLM model string (which becomes ``dspy.LM(model,
            engine="litellm")``). ``None``: ``dspy.settings.lm``.
        task_model: The model that runs the program while scoring: a ``dspy.LM`` or a LiteLLM model string. ``None``:
            ``dspy.settings.lm``.

        initial_instructions: Extra starting instructions, scored on the training set at step -1 beside the program's
            own (the authors' list of initial instructions): each enters the meta-prompt history with its score and can
            be selected like any candidate. A list is for a program with one target predictor; with several, a mapping
            ``{predictor name: [instructions]}``. A repeat of the predictor's own instruction or of an earlier text is
            recorded as skipped, not scored. None: only the program's own.
        auto: ``"light"``, ``"medium"`` or ``"heavy"``: a preset of ``num_steps`` and ``num_candidates`` scaled by the
            training set's size (see the table of presets in the documentation), resolved at ``compile`` and recorded;
            an explicit ``num_steps`` or ``num_candidates`` wins over it. A preset races (unless ``racing=False``)
            and spends what racing saves on more steps: twice the steps, within the ``max_metric_calls`` that full
            evaluation of its steps would make (ours, not the paper's setting). None: no preset.
        num_steps: Optimization steps; each sends the meta-prompt ``num_candidates`` times. None: 10, or the ``auto``
            preset's.
        num_candidates: Optimizer samples per step (the authors' 8). None: 8, or the ``auto`` preset's.
        num_exemplars: Training problems shown in each meta-prompt (the authors' 3); 0 shows none.
        exemplar_selection: ``"random"`` (the authors' default: a new draw per step), ``"constant"`` (the same draw
            every step) or ``"hard_diverse"`` (problems the instructions fail, spread out by a DPP);
            ``HardDiverse(theta=...)`` sets the DPP's trade-off (0: diversity alone, 1: difficulty alone; the default
            0.7).

        max_num_instructions: How many of the best instructions the meta-prompt shows (the authors' 20).
        score_threshold: Instructions scoring below this (0 to 1) are not shown; 0 disables it.
        num_score_buckets: Scores are shown as integers from 0 to this number; ``math.inf`` shows them rounded to three
            decimals.
        optimizer_family: ``"gpt"`` or ``"palm"``: which of the authors' meta-prompt wordings to use.
        instruction_pos: Where the instruction sits, in the meta-prompt's problems and in the program alike:
            ``"Q_begin"`` or ``"before_Q"`` (the predictor's instructions, before the inputs; ``"before_Q"`` needs
            ``include_qa=True``) or ``"Q_end"`` (an input field after the inputs). The authors' ``"A_begin"`` (the start
            of the answer) is refused: DSPy cannot start a model's answer with a given text.
        include_qa: Render exemplars with ``Q:``/``A:`` markers.
        meta_prompt_type: ``"both_instructions_and_exemplars"`` (the paper) or ``"instructions_only"``.
        task_description: The task words of an ``instructions_only`` meta-prompt, e.g. ``"grade school math"``.
        max_instruction_chars: Skip proposed instructions longer than this (the authors use 500); None: no limit.
        temperature: Sampling temperature of the optimizer model (the authors' 1.0).
        max_tokens: Maximum tokens of one optimizer reply.

        predictors: Names (as in ``program.named_predictors()``) of the predictors to optimize; None: all.

        select: ``"train"`` returns the best training score (the paper's setting); ``"validation"`` scores the ``top_k``
            best on training on the valset and returns the best validation mean; ``"auto"`` is ``"validation"`` when
            ``compile`` gets a valset and ``"train"`` otherwise (as MIPROv2 and GEPA use a valset); the log says which.
        top_k: Candidates scored on the valset by ``select="validation"`` and ``val_gate``.
        val_gate: Return the best candidate only if it beats the starting program on the valset (``True``, or
            ``ValGate(min_delta=...)`` to ask for a margin, in [0, 1]: 0, the default, asks for strictly better);
            otherwise return the starting program unchanged.

        max_metric_calls: Budget in evaluations (one program run plus its metric on one example), training and
            validation together; the run stops cleanly when the next evaluation would exceed it.
        max_cost: Budget in USD, from the recorded cost of both models; the run stops cleanly once reached.
        racing: Score a step's new candidates block by block in one seeded order of the training examples and stop a
            candidate once an exact sequential test says its training mean is below the bar: the best at the start of
            its step, raised by the step's leaders (the front-runners after the third and fourth looks, run in full
            first). ``True``, or ``Racing(alpha=...)`` for the test's level (the probability of stopping a
            candidate at least as good as every bar; the default 0.05). A stopped candidate is recorded ``raced_out``
            with its partial mean, which the meta-prompts show; only fully scored candidates can be returned.
            None (the default): racing under an ``auto`` preset, full evaluation (the paper's) otherwise.

        num_threads: Parallel evaluations (and optimizer calls); None: ``dspy.settings.num_threads`` or 1.
        executor: A ``concurrent.futures.Executor`` to run evaluations on instead of threads (for example
            ``distributed.Client(...).get_executor()``).
        timeout: Seconds an evaluation (the program and its metric on one example) may take before it is abandoned
            as an infrastructure failure: retried once, then its candidate is left unscored, and compiling again
            scores it. The default, 15 minutes, lets a long agent run (dozens of tool-calling turns, each LM call
            bounded by the client's own request timeout, LiteLLM's 10 minutes) finish, and still ends a hung request
            or a program that never returns. None: no limit.
        failure_score: The score of a run whose program raised (other than an infrastructure failure).
        max_errors: How many errors one candidate's evaluation tolerates before the run stops, counted as
            ``dspy.Evaluate`` counts them, per evaluation of one program (and with its default, 10): exceptions of the
            metric and of the program, except a task model's answer DSPy could not parse (the instruction's doing,
            scored ``failure_score`` like any wrong answer). A tolerated error scores ``failure_score`` and is logged
            and recorded; one more in the same evaluation stops the run with everything kept. A flaky metric (a
            missing label, an odd input) costs a score now and then instead of a paid run, while a systematic bug
            stops within a few evaluations; 0 stops at the first; None: no limit.

        log_dir: Folder for the run record (``state.json``), step reports and the final report; compiling again with the
            same folder resumes the run.
        seed: Seeds exemplar draws and optimizer rollout ids; 0 reproduces the authors' exemplar draws.

        display_progress: Show DSPy's progress bar for each candidate's evaluation (``dspy.Evaluate``'s switch).
        track_stats: Attach the whole run record to the returned program wherever it goes (as GEPA's
            ``detailed_results``): ``program.save(path, save_program=True)`` then carries every meta-prompt and score.
            False: the saved program carries a short summary (``OPRORunSummary``: the selected candidate, its score and
            step, the record's folder), and the record stays in ``log_dir``.
    """

    @suggest_keywords
    def __init__(
        self,
        metric: Callable[..., Any],
        *,
        # models
        prompt_model: dspy.BaseLM | str | None = None,
        task_model: dspy.BaseLM | str | None = None,
        # search
        initial_instructions: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
        auto: Literal["light", "medium", "heavy"] | None = None,
        num_steps: int | None = None,
        num_candidates: int | None = None,
        num_exemplars: int = 3,
        exemplar_selection: ExemplarSelection | HardDiverse = "random",
        # meta-prompt
        max_num_instructions: int = 20,
        score_threshold: float = 0.0,
        num_score_buckets: int | float = 100,
        optimizer_family: Literal["gpt", "palm"] = "gpt",
        instruction_pos: Literal["before_Q", "Q_begin", "Q_end"] = "Q_begin",
        include_qa: bool = False,
        meta_prompt_type: Literal["both_instructions_and_exemplars", "instructions_only"] = (
            "both_instructions_and_exemplars"
        ),
        task_description: str = "",
        max_instruction_chars: int | None = None,
        temperature: float = 1.0,
        max_tokens: int = 1024,
        # targets
        predictors: Sequence[str] | None = None,
        # final selection
        select: Literal["auto", "train", "validation"] = "auto",
        top_k: int = 3,
        val_gate: bool | ValGate = False,
        # budget
        max_metric_calls: int | None = None,
        max_cost: float | None = None,
        racing: bool | Racing | None = None,
        # execution
        num_threads: int | None = None,
        executor: cf.Executor | None = None,
        timeout: float | None = 900.0,
        failure_score: float = 0.0,
        max_errors: int | None = 10,
        # record
        log_dir: str | os.PathLike[str] | None = None,
        seed: int = 0,
        # observing
        display_progress: bool = True,
        track_stats: bool = False,
    ):
        super().__init__()
        self.metric = metric
        self.prompt_model, self.task_model = prompt_model, task_model
        # Frozen (a tuple, or a dict of tuples): a list the caller changes afterwards does not change the run.
        self.initial_instructions = check_initial_instructions(initial_instructions)
        self.auto = auto
        self.num_steps, self.num_candidates, self.num_exemplars = num_steps, num_candidates, num_exemplars
        self.exemplar_selection = exemplar_selection
        self.max_num_instructions, self.score_threshold = max_num_instructions, score_threshold
        self.num_score_buckets, self.optimizer_family = num_score_buckets, optimizer_family
        self.instruction_pos, self.include_qa, self.meta_prompt_type = instruction_pos, include_qa, meta_prompt_type
        self.task_description, self.max_instruction_chars = task_description, max_instruction_chars
        self.temperature, self.max_tokens = temperature, max_tokens
        self.predictors = predictors
        self.select, self.top_k, self.val_gate = select, top_k, val_gate
        self.max_metric_calls, self.max_cost, self.racing = max_metric_calls, max_cost, racing
        self.num_threads, self.executor, self.timeout = num_threads, executor, timeout
        self.failure_score, self.max_errors = failure_score, max_errors
        self.log_dir, self.seed = log_dir, seed
        self.display_progress, self.track_stats = display_progress, track_stats
        s.check_settings(self)  # a bad setting fails here, before any LM call
        catch_up_mlflow_autolog(type(self), _PLAIN_COMPILE)

    @classmethod
    def setting_names(cls) -> list[str]:
        """The settings, in the constructor's order."""
        return [name for name in inspect.signature(cls.__init__).parameters if name != "self"]

    def get_params(self) -> dict[str, Any]:
        """The settings by name, as DSPy's teleprompters return theirs: the metric, the models and the executor as
        given, every other setting JSON-serialisable (an option such as ``Racing(alpha=0.1)`` as its fields).
        ``num_steps`` and ``num_candidates`` are None where the default or an ``auto`` preset sets them at
        ``compile``."""
        return {name: getattr(self, name) if name in s.OBJECTS else s.setting_value(name, getattr(self, name))
                for name in self.setting_names()}

    def compile(
        self,
        student: dspy.Module,
        *,
        trainset: Sequence[dspy.Example],
        teacher: dspy.Module | None = None,
        valset: Sequence[dspy.Example] | None = None,
        **kwargs: Any,
    ) -> dspy.Module:
        """Optimize ``student``'s instructions on ``trainset``; the student itself is never changed.

        Args:
            student: The program to optimize.
            trainset: Examples (with inputs set by ``with_inputs``) that score every candidate instruction and supply
                the meta-prompt's problems.
            teacher: Not used by OPRO; must be None.
            valset: Held-out examples for ``select="validation"``, ``val_gate`` and the label-free gate; they never
                reach the meta-prompt.

        Returns:
            A copy of the program with the selected instructions, carrying ``candidate_programs`` (best first) and
            ``opro_run`` (the run record; a pickled save keeps an ``OPRORunSummary`` of it unless
            ``track_stats=True``).
        """
        if teacher is not None:
            raise ValueError("OPRO optimizes instructions only and takes no teacher; call compile(..., teacher=None)")
        if kwargs:
            raise unknown_keyword_error("compile()", sorted(kwargs)[0], ["student", "trainset", "teacher", "valset"])
        s.check_settings(self)  # settings changed since the optimizer was made are checked too
        from dspy_opro.core.run import OPRORun  # here, not at the top: ``import dspy_opro`` stays cheap

        with logging_through_dspy("dspy_opro"), price_map_setting_restored():
            if self.auto is not None:
                n_train = len(trainset) if isinstance(trainset, Sized) else 0
                steps, candidates = s.resolved_search(self, n_train)
                logger.info("auto=%r for %d training examples: %d steps x %d candidates%s", self.auto, n_train,
                            steps, candidates, ", racing (racing=False evaluates every candidate in full), within "
                            "the evaluations full evaluation of half the steps would make"
                            if s.races_a_preset(self) else "")
            log_settings_to_mlflow(self.get_params())
            return OPRORun(self, student, trainset, valset).execute()

    @suggest_keywords
    @price_map_setting_restored()
    def estimate(
        self,
        student: dspy.Module,
        trainset: Sequence[dspy.Example],
        valset: Sequence[dspy.Example] | None = None,
        *,
        tokens_per_evaluation: tuple[int, int] | None = None,
    ) -> RunPlan:
        """The plan ``compile`` would log, in LM calls and (where it can tell) dollars, without any LM call.

        The program and the data are checked as ``compile`` checks them, so a mistake fails here for free.

        Args:
            student: The program to optimize.
            trainset: The training examples.
            valset: The validation examples, if any (``select="auto"`` then selects on them).
            tokens_per_evaluation: ``(prompt, completion)`` task-model tokens of one program run with its metric, for a
                cost estimate; None: no cost (``compile`` logs one measured on step -1's first evaluations).

        Returns:
            The `RunPlan`: optimizer requests, evaluations, and the cost with its assumption.
        """
        from dspy_opro.core.initial import initial_by_predictor, initial_candidates
        from dspy_opro.core.plan import plan_run, use_local_price_maps_offline
        from dspy_opro.scoring.evaluation import AnchoredMetric
        from dspy_opro.state import CandidateStatus
        from dspy_opro.task.data import RunData
        from dspy_opro.task.programs import predictor_map, read_instructions

        s.check_settings(self)
        data = RunData.build(student, trainset, valset, predictors=self.predictors,
                             label_free=isinstance(self.metric, AnchoredMetric),
                             valset_needed_by=s.valset_needed_by(self), num_exemplars=self.num_exemplars,
                             max_metric_calls=self.max_metric_calls)
        steps, candidates = s.resolved_search(self, len(data.trainset))  # as compile resolves an auto preset
        models = s.Models.resolve(self)
        use_local_price_maps_offline([models.prompt, models.task, models.judge])
        initial = initial_by_predictor(check_initial_instructions(self.initial_instructions), targets=data.targets,
                                       all_predictors=list(predictor_map(student)))
        start = read_instructions(student, data.targets, instruction_pos=self.instruction_pos)
        count = sum(c.status != CandidateStatus.SKIPPED
                    for c in initial_candidates(initial, start=start, first_id=1, n_train=len(data.trainset)))
        selection = s.selection_policy(self, has_valset=bool(data.valset))
        budget = s.resolved_budget(self, len(data.trainset),
                                   selection.planned_evaluations(len(data.valset)) if data.valset else 0)
        plan = plan_run(num_steps=steps, num_candidates=candidates, models=models, data=data, selection=selection,
                        max_metric_calls=budget, initial=count)
        if tokens_per_evaluation is None:
            return replace(plan, cost_assumption="pass tokens_per_evaluation=(prompt, completion) to estimate it; "
                                                 "compile logs one measured on step -1")
        prompt, completion = tokens_per_evaluation
        return plan.with_cost(prompt_tokens=prompt, completion_tokens=completion, measured="stated")


_PLAIN_COMPILE = OPROTeleprompter.__dict__["compile"]  # as defined; MLflow's autolog replaces it when it patches

OPRO = OPROTeleprompter

__all__ = ["OPRO", "OPROTeleprompter"]
