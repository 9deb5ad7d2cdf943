"""The run record: its files, resuming it, and everything that reads it.

:mod:`~dspy_opro.state` holds the pydantic models of everything a run pays for and the one rule for the best
candidate; :mod:`~dspy_opro.record.files` writes and reads ``state.json``, the journal and the lock;
:mod:`~dspy_opro.record.recorder` decides when to write, what to replay and when a saved run continues. The reports
(:mod:`~dspy_opro.record.report`) and the plot (:mod:`~dspy_opro.record.plot`) only read the record.

May import: :mod:`dspy_opro.errors` and :mod:`dspy_opro.compat`; nothing else of the package (``state`` imports
nothing of it at all), so every other part can import the record's models.
"""
