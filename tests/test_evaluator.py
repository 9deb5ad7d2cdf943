"""The evaluator's bookkeeping, and the Dask usage ledger, without threads of chance or a cluster."""

import concurrent.futures as cf

import dspy
import pytest

from dspy_opro.record.state import ModelUsage
from dspy_opro.scoring.dask_usage import AttemptReporter, UsageChannel, UsageLedger, dask_client
from dspy_opro.scoring.evaluation import ExampleJob, ExampleResult, run_example
from dspy_opro.scoring.evaluator import Evaluator
from dspy_opro.scoring.usage import UsageCapture
from tests.fakes import chat_reply, make_lm


def job(index: int, **fields) -> ExampleJob:
    return ExampleJob(candidate_id=1, index=index, program=None, example=None, metric=None, failure_score=0.0,
                      settings={}, **fields)


class PreparedFutures(cf.Executor):
    """An executor whose futures the test finishes by hand: nothing runs."""

    def __init__(self):
        self.futures: list[cf.Future] = []

    def submit(self, fn, /, *args, **kwargs):
        future = cf.Future()
        future.set_running_or_notify_cancel()
        self.futures.append(future)
        return future


def test_take_finished_hands_over_each_finished_unconsumed_evaluation_once():
    """Ctrl-C while a batch runs: the run records what finished but was never consumed, and nothing else."""
    executor = PreparedFutures()
    evaluator = Evaluator(executor=executor)
    futures = [evaluator.submit(job(i)) for i in range(6)]
    results = [ExampleResult(1, i, "ok", score=i / 10) for i in range(6)]
    futures[0].set_result(results[0])
    assert evaluator.consume(futures[0]) is results[0]  # consumed: recorded by the run already
    futures[1].set_result(results[1])
    futures[2].set_exception(OSError("the worker died"))  # no result to keep
    # futures[3] never finishes (still running when the run stops)
    futures[4].set_result(results[4])
    evaluator.abandon(futures[4])  # overdue and given up on before it came back: its result is never read
    futures[5].set_result(results[5])

    assert evaluator.take_finished() == [results[1], results[5]]
    assert evaluator.take_finished() == []  # once
    assert evaluator.abandoned == 1
    futures[3].set_result(results[3])  # finishes after the hand-over: not the run's any more
    assert evaluator.take_finished() == []


class FakeDaskClient:
    """The part of ``distributed.Client`` the ledger and the reporter use; events are delivered at once."""

    def __init__(self):
        self.handlers = {}
        self.unsubscribed = []

    def subscribe_topic(self, topic, handler):
        self.handlers[topic] = handler

    def unsubscribe_topic(self, topic):
        self.unsubscribed.append(topic)

    def log_event(self, topic, msg):
        self.handlers[topic]((0.0, msg))


def usage(calls: int, cost: float = 0.0) -> dict[str, ModelUsage]:
    return {"openai/task": ModelUsage(calls=calls, prompt_tokens=10 * calls, completion_tokens=5 * calls, cost=cost)}


def test_the_ledger_counts_each_lost_attempt_once_by_its_last_report():
    client = FakeDaskClient()
    ledger = UsageLedger(client)
    first, second = ledger.tag(job(0)), ledger.tag(job(1))
    assert (first.usage_channel, second.usage_channel) == (UsageChannel(ledger.topic, 0), UsageChannel(ledger.topic, 1))
    assert ledger.tag(first) is first  # a resubmission keeps its channel

    so_far = {"dead": usage(0), "kept": usage(0)}
    dead = AttemptReporter(channel=first.usage_channel, client=client, snapshot=lambda: so_far["dead"])
    kept = AttemptReporter(channel=first.usage_channel, client=client, snapshot=lambda: so_far["kept"])
    for calls in (1, 2):
        so_far["dead"] = usage(calls, cost=0.001 * calls)
        dead.report()
    so_far["kept"] = usage(2, cost=0.002)
    kept.report()
    ledger._receive((0.0, {"job": 0, "attempt": dead.attempt, "seq": 1, "usage": {}}))  # an older total, late
    ledger._receive((0.0, {"nonsense": True}))  # ignored

    lost = ledger.settle(first.usage_channel, kept.attempt)
    assert lost == usage(2, cost=0.002)  # the dead attempt's two calls; the kept one's are in its result
    assert ledger.settle(first.usage_channel, kept.attempt) == {}  # once

    for _ in range(2):  # the second job failed on both tries: every attempt was lost
        AttemptReporter(channel=second.usage_channel, client=client, snapshot=lambda: usage(1, cost=0.001)).report()
    assert ledger.settle(second.usage_channel, None) == usage(2, cost=0.002)
    assert ledger.settle(None, None) == {}
    ledger.close()
    assert client.unsubscribed == [ledger.topic]


def test_no_dask_no_ledger_and_no_report():
    """A thread pool or any executor that is not Dask's: jobs go out untagged, and a job run in this process
    (not a Dask task) reports nothing even when tagged."""
    with cf.ThreadPoolExecutor(max_workers=1) as pool:
        assert dask_client(pool) is None
        untagged = job(0)
        assert Evaluator(executor=pool).tag(untagged) is untagged
        assert Evaluator().tag(untagged) is untagged
    assert AttemptReporter.on_this_worker(UsageChannel("t", 0), dict) is None


@pytest.mark.parametrize("history", [True, False], ids=["history", "no-history"])
def test_the_capture_calls_on_call_after_each_lm_call_with_its_usage_counted(history):
    lm, engine = make_lm(lambda request: chat_reply(answer="4"), model="openai/task")
    capture = UsageCapture()
    seen: list[tuple[int, int]] = []
    capture.on_call = lambda: seen.append((capture.result()["openai/task"].calls,
                                           capture.result()["openai/task"].prompt_tokens))
    predict = dspy.Predict("question -> answer")
    with dspy.context(disable_history=not history), capture.active(lm=lm):
        predict(question="2 + 2?")
        predict(question="2 + 2, again?")
    assert len(engine.requests) == 2
    assert seen == [(1, 10), (2, 20)]


def test_an_evaluation_outside_a_dask_worker_names_no_attempt():
    lm, engine = make_lm(lambda request: chat_reply(answer="4"), model="openai/task")
    tagged = ExampleJob(candidate_id=0, index=0, program=dspy.Predict("question -> answer"),
                        example=dspy.Example(question="2 + 2?", answer="4").with_inputs("question"), metric=None,
                        failure_score=0.0, settings={"lm": lm}, usage_channel=UsageChannel("t", 0))
    result = run_example(tagged)
    assert (result.outcome, result.attempt, result.usage["openai/task"].calls) == ("ok", None, 1)
    assert len(engine.requests) == 1


def test_a_scheduler_that_cannot_be_reached_never_fails_the_lm_call(caplog):
    class Unreachable(FakeDaskClient):
        def log_event(self, topic, msg):
            self.sent = getattr(self, "sent", 0) + 1
            raise OSError("Timed out trying to connect to the scheduler")

    client = Unreachable()
    reporter = AttemptReporter(channel=UsageChannel("t", 0), client=client, snapshot=lambda: usage(1))
    with caplog.at_level("WARNING", logger="dspy_opro.scoring.dask_usage"):
        reporter.report()
        reporter.report()  # not tried again
    assert client.sent == 1
    assert [r.getMessage() for r in caplog.records] == [
        "Could not report LM usage to the Dask scheduler (Timed out trying to connect to the scheduler); an evaluation "
        "lost with its worker will not be counted"]
