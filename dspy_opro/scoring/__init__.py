"""Scoring: running the program on examples, within the budget, and saying what each candidate's scoring came to.

:mod:`~dspy_opro.scoring.evaluation` runs one evaluation (the program on one example, then the metric) and
classifies what went wrong; it also defines the ``AnchoredMetric`` seam of label-free OPRO.
:mod:`~dspy_opro.scoring.evaluator` fans evaluations out to threads or any executor and stops at the budget;
:mod:`~dspy_opro.scoring.scorer` decides which evaluations a group of candidates needs (the ``ScoringPolicy`` seam;
the paper's ``FullScoring`` by default) and returns the events the step loop records; :mod:`~dspy_opro.scoring.usage`
captures tokens and cost exactly under any threading. Scoring reads the run record and never writes it.

May import: :mod:`dspy_opro.errors`, :mod:`dspy_opro.compat`, :mod:`dspy_opro.checks`, :mod:`dspy_opro.record.state`,
:mod:`dspy_opro.task`, :mod:`dspy_opro.selection` (for a type) and :mod:`dspy_opro.proposing.exemplars` (how an answer
is rendered); never the configuration, the step loop, the teleprompter or an extension.
"""
