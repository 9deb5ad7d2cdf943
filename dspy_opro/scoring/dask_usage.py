"""Usage reported out of Dask workers as it is paid, so that an evaluation lost with its worker is still counted.

An evaluation's usage normally travels back inside its result (:class:`~dspy_opro.scoring.evaluation.ExampleResult`).
On a Dask cluster a result can be lost after the provider billed its LM calls: the worker dies mid-evaluation (Dask
reruns the task, or reports ``KilledWorker`` and the runner resubmits it), or it dies after finishing and Dask
computes the task again because the result was held in the dead worker's memory. The result that finally comes
back carries only its own attempt's usage.

So each attempt reports as it goes. When :func:`~dspy_opro.scoring.evaluation.run_example` runs on a Dask worker for
a job tagged with a :class:`UsageChannel`, an :class:`AttemptReporter` (an id made when the attempt starts) sends the
attempt's usage so far to the scheduler after every LM call it captured, with ``Client.log_event``: a synchronous
round trip, so the event is at the scheduler before the program goes on to its next step (``Worker.log_event``
only queues the message on a batched stream, which a crash loses). The event carries the attempt's running total
(a snapshot of the job's copy of the run's :class:`~dspy_opro.scoring.usage.UsageMeter`), numbered, so the last one
received is the attempt's whole usage, whatever the order its threads' messages arrive in.

In the run's process, the :class:`UsageLedger` is subscribed to the run's topic: the scheduler pushes each event on
the same stream that later reports the task finished or failed, so when a job's future is done every event its
attempts sent has been received. :meth:`UsageLedger.settle` then returns the usage of the job's other attempts,
once: everything but the attempt whose result is being recorded (all of them when the job finally failed).

Without Dask nothing changes and nothing is imported: ``distributed`` is an optional dependency, looked at only when
the executor is a Dask ``ClientExecutor`` and imported on a worker only by a job that was tagged for it.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import itertools
import logging
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

from dspy_opro.state import ModelUsage

logger = logging.getLogger(__name__)

TOPIC_PREFIX = "dspy-opro-usage-"


@dataclasses.dataclass(frozen=True)
class UsageChannel:
    """Where a job's attempts report their usage: the run's event topic and the job's number in the run."""

    topic: str
    job: int


class AttemptReporter:
    """One attempt of a job, reporting its running usage to the scheduler after each LM call.

    Args:
        channel: The job's channel.
        client: The worker's Dask client (``distributed.get_client()``), which sends ``log_event`` synchronously.
        snapshot: The attempt's usage so far, per model.
    """

    def __init__(self, *, channel: UsageChannel, client: Any, snapshot: Callable[[], dict[str, ModelUsage]]):
        self.channel, self.attempt = channel, uuid.uuid4().hex
        self._client, self._snapshot = client, snapshot
        self._lock = threading.Lock()
        self._sequence = 0
        self._broken = False

    @classmethod
    def on_this_worker(cls, channel: UsageChannel | None,
                       snapshot: Callable[[], dict[str, ModelUsage]]) -> AttemptReporter | None:
        """A reporter when this code runs as a task of a Dask worker for a tagged job; else None."""
        if channel is None:
            return None
        try:
            import distributed

            distributed.get_worker()  # raises ValueError outside a task
            client = distributed.get_client()
        except Exception:  # not on a worker (a job run in process), or no client to be had: nothing to report to
            return None
        return cls(channel=channel, client=client, snapshot=snapshot)

    def report(self) -> None:
        """Send the attempt's usage so far; called on the thread that just finished an LM call, which waits for it.

        The snapshot is taken and numbered under a lock, so a higher number is never an older total.
        """
        if self._broken:
            return
        try:  # inside DSPy's LM call: whatever happens here must not fail the program's call
            with self._lock:
                self._sequence += 1
                sequence, usage = self._sequence, self._snapshot()
            message = {"job": self.channel.job, "attempt": self.attempt, "seq": sequence,
                       "usage": {model: entry.model_dump() for model, entry in usage.items()}}
            self._client.log_event(self.channel.topic, message)
        except Exception as exc:  # the evaluation goes on; only a lost attempt's usage would be missed
            self._broken = True
            logger.warning("Could not report LM usage to the Dask scheduler (%s); an evaluation lost with its "
                           "worker will not be counted", exc)


def dask_client(executor: cf.Executor | None) -> Any | None:
    """The Dask client behind ``executor`` when it is a ``distributed`` ``ClientExecutor``; else None.

    ``distributed`` is looked at only when something already imported it (a Dask executor cannot exist otherwise).
    """
    if executor is None or "distributed" not in sys.modules:
        return None
    from distributed import Client
    from distributed.cfexecutor import ClientExecutor

    if not isinstance(executor, ClientExecutor):
        return None
    client = getattr(executor, "_client", None)  # ClientExecutor keeps its client there, with no public name
    return client if isinstance(client, Client) else None


def submit_to_dask(executor: cf.Executor, client: Any, fn: Callable[..., Any],
                   *args: Any) -> tuple[cf.Future[Any], Any]:
    """Submit ``fn(*args)`` as the Dask ``executor`` does, but as an impure task, and keep its Dask future.

    Impure: Dask would give a resubmitted job the key of its failed run and hand back the same ``KilledWorker``
    instead of running it again (and hashing every job for its key costs a pickling). The Dask future is returned
    so that the caller can release the task's key as soon as it has the result: a result Dask still holds is
    computed again, and paid again, whenever the worker that holds it dies.
    """
    options = {**getattr(executor, "_kwargs", {}), "pure": False}  # the executor's own options (resources, ...)
    dask_future = client.submit(fn, *args, **options)
    return executor._wrap_future(dask_future), dask_future  # type: ignore[attr-defined]


class UsageLedger:
    """The run's side: receives the attempts' usage events and says what each finished job's lost attempts cost.

    Args:
        client: The Dask client the evaluations are submitted with.
    """

    def __init__(self, client: Any):
        self.topic = TOPIC_PREFIX + uuid.uuid4().hex
        self._client = client
        self._jobs = itertools.count()
        self._lock = threading.Lock()
        # job number -> attempt id -> (sequence number, usage so far) of the latest event received
        self._attempts: dict[int, dict[str, tuple[int, dict[str, Any]]]] = {}
        # job number -> (its recorded attempt, the usage counted for it): calls that attempt's program left running
        # end later, and their events say so (:meth:`late_usage`)
        self._kept: dict[int, tuple[str, dict[str, ModelUsage]]] = {}
        # Sent before any job is submitted, on the stream that submits them: the scheduler knows of it first.
        client.subscribe_topic(self.topic, self._receive)

    def tag(self, job: Any) -> Any:
        """``job`` (an ``ExampleJob``) with a channel of its own; a job already tagged is returned as it is."""
        if getattr(job, "usage_channel", None) is not None:
            return job
        return dataclasses.replace(job, usage_channel=UsageChannel(self.topic, next(self._jobs)))

    def _receive(self, event: tuple[float, Any]) -> None:
        _, message = event
        try:
            job, attempt, sequence, usage = message["job"], message["attempt"], message["seq"], message["usage"]
        except (TypeError, KeyError):
            logger.warning("Ignored a malformed usage event on %s: %r", self.topic, message)
            return
        with self._lock:
            attempts = self._attempts.setdefault(job, {})
            if attempt not in attempts or attempts[attempt][0] < sequence:
                attempts[attempt] = (sequence, usage)

    def settle(self, channel: UsageChannel | None, kept_attempt: str | None,
               counted: dict[str, ModelUsage] | None = None) -> dict[str, ModelUsage]:
        """The usage of the job's attempts other than ``kept_attempt`` (whose result counts its own), once.

        Args:
            channel: The job's channel (None: an untagged job, nothing to settle).
            kept_attempt: The attempt whose result is recorded; None when the job failed (all attempts were lost).
            counted: The usage the kept attempt's result carried.
        """
        if channel is None or channel.topic != self.topic:
            return {}
        with self._lock:
            attempts = self._attempts.pop(channel.job, {})
            if kept_attempt is not None:
                self._kept[channel.job] = (kept_attempt, {m: u.model_copy() for m, u in (counted or {}).items()})
        lost: dict[str, ModelUsage] = {}
        for attempt, (_, usage) in attempts.items():
            if attempt == kept_attempt:
                continue
            for model, fields in usage.items():
                lost.setdefault(model, ModelUsage()).add(ModelUsage.model_validate(fields))
        if lost:
            calls = sum(entry.calls for entry in lost.values())
            logger.info("Evaluation job %d: counted as paid the %d LM calls of its lost attempts (%d)", channel.job,
                        calls, len(attempts) - (kept_attempt in attempts))
        return lost

    def late_usage(self) -> dict[str, ModelUsage]:
        """What recorded attempts were billed after their results came back (LM calls a program that raised left
        running on threads of its own), as their later events report it; each call once."""
        late: dict[str, ModelUsage] = {}
        with self._lock:
            for job, (attempt, counted) in self._kept.items():
                latest = self._attempts.get(job, {}).pop(attempt, None)
                if latest is None:
                    continue
                for model, fields in latest[1].items():
                    now, before = ModelUsage.model_validate(fields), counted.get(model, ModelUsage())
                    extra = ModelUsage(**{name: max(getattr(now, name) - getattr(before, name), 0)
                                          for name in ModelUsage.model_fields})
                    if extra.calls or extra.prompt_tokens or extra.completion_tokens:
                        late.setdefault(model, ModelUsage()).add(extra)
                        counted[model] = now
        return late

    def close(self) -> None:
        """Stop receiving the run's events."""
        try:
            self._client.unsubscribe_topic(self.topic)
        except Exception as exc:  # a client already closed
            logger.debug("Could not unsubscribe from %s: %s", self.topic, exc)


__all__ = ["AttemptReporter", "UsageChannel", "UsageLedger", "dask_client", "submit_to_dask"]
