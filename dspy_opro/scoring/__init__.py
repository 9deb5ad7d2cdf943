"""Scoring: running the program on examples, on DSPy's own evaluation machinery, and counting what it costs.

:mod:`~dspy_opro.scoring.evaluation` runs one evaluation (the program on one example, then the metric) and classifies
what went wrong; it also defines the ``AnchoredMetric`` seam of label-free OPRO. :mod:`~dspy_opro.scoring.engine`
makes each candidate's scoring one ``dspy.Evaluate`` call, with the budget, the hard timeout and the executor OPRO
needs; :mod:`~dspy_opro.scoring.scorer` decides which evaluations a group of candidates needs, in which rounds (the
``ScoringPolicy`` seam; the paper's ``FullScoring`` by default), and what each candidate's came to;
:mod:`~dspy_opro.scoring.usage` counts tokens and cost where each LM call happens;
:mod:`~dspy_opro.scoring.dask_usage` carries usage out of Dask workers as it is paid.

May import: :mod:`dspy_opro.errors`, :mod:`dspy_opro.compat`, :mod:`dspy_opro.state`, :mod:`dspy_opro.task` and the
selection policies' type; never the teleprompter, the step loop, the settings or an extension.
"""
