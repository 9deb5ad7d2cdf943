"""The evaluation engine's parts, without threads of chance or a cluster: the daemon pool, the runner's timeout and
retry, the budget, the usage meter, one dspy.Evaluate call per candidate, and the Dask usage ledger."""

import concurrent.futures as cf
import contextvars
import dataclasses
import threading
import time

import dspy
import pytest

from dspy_opro.scoring.dask_usage import AttemptReporter, UsageChannel, UsageLedger, dask_client
from dspy_opro.scoring.engine import Budget, CandidateEvaluate, RoundSlots, Runner, _DaemonPool
from dspy_opro.scoring.evaluation import ExampleJob, ExampleResult, run_example
from dspy_opro.scoring.usage import UsageMeter
from dspy_opro.state import Fingerprint, ModelUsage, RunState
from tests.fakes import chat_reply, make_lm


def job(index: int, **fields) -> ExampleJob:
    return ExampleJob(candidate_id=1, index=index, program=None, example=None, metric=None, failure_score=0.0,
                      settings={}, **fields)


def test_the_daemon_pool_reuses_its_threads_and_replaces_one_an_evaluation_holds():
    pool = _DaemonPool()
    names = [pool.submit(lambda: threading.current_thread().name).result(timeout=5) for _ in range(5)]
    assert names == ["opro-eval-1"] * 5  # one thread, reused: no thread per evaluation
    release = threading.Event()
    held = pool.submit(release.wait, 10)  # an evaluation that does not come back (until released)
    # The held thread is not waited for: a second thread takes the next job (either may hold the wait).
    assert pool.submit(lambda: threading.current_thread().name).result(timeout=5) in ("opro-eval-1", "opro-eval-2")
    assert pool._threads == 2
    assert threading.current_thread().daemon is False and all(
        t.daemon for t in threading.enumerate() if t.name.startswith("opro-eval-"))
    release.set()
    assert held.result(timeout=5) is True
    pool.shutdown()


class NoBar:
    def update(self, outcome):
        pass


def test_the_runner_abandons_an_overdue_evaluation_tries_it_once_more_then_reports_an_infra_failure(monkeypatch):
    calls = []
    release = threading.Event()

    def evaluation(job):
        calls.append(job.index)
        if job.index == 3:
            release.wait(10)
        return ExampleResult(job.candidate_id, job.index, "ok", score=1.0)

    monkeypatch.setattr("dspy_opro.scoring.engine.run_example", evaluation)
    runner = Runner(executor=None, timeout=0.2)
    began = time.monotonic()
    finished = runner.map([2, 3, 4], job, lambda item, result: (item, result.outcome, result.error), width=3,
                          context=contextvars.copy_context(), progress=NoBar())
    assert time.monotonic() - began < 5
    assert sorted(calls) == [2, 3, 3, 4]  # the overdue one, and its second try
    assert finished == [(2, "ok", None), (3, "infra", "TimeoutError: the evaluation did not finish within timeout=0.2 "
                                                      "s and was abandoned"), (4, "ok", None)]
    release.set()
    runner.close()


def test_the_feeding_stops_where_start_gives_no_job_and_an_error_of_finish_propagates(monkeypatch):
    monkeypatch.setattr("dspy_opro.scoring.engine.run_example",
                        lambda job: ExampleResult(job.candidate_id, job.index, "ok", score=0.5))
    runner = Runner(executor=None, timeout=30)
    started = []

    def start(item):
        started.append(item)
        return job(item) if item < 2 else None  # the budget is spent from the third on

    assert runner.map(list(range(5)), start, lambda item, result: item, width=1, context=contextvars.copy_context(),
                      progress=NoBar()) == [0, 1, None, None, None]
    assert started == [0, 1, 2]

    def finish(item, result):
        raise KeyError("the run stops")

    with pytest.raises(KeyError, match="the run stops"):
        runner.map([0, 1], job, finish, width=1, context=contextvars.copy_context(), progress=NoBar())


def test_the_budget_counts_the_evaluations_in_flight():
    state = RunState(fingerprint=Fingerprint(config="", trainset="", valset="", program=""), config={},
                     predictors=["p"], train_size=3, val_size=0)
    budget = Budget(max_metric_calls=3, max_cost=None, state=state)
    assert [budget.reserve() for _ in range(3)] == [None, None, None]
    assert budget.reserve() == "max_metric_calls=3 reached"
    budget.in_flight -= 1  # one of the three finished: the record counts it as it leaves the flight
    state.metric_calls = 1
    assert budget.reserve() == "max_metric_calls=3 reached"
    budget.in_flight -= 1  # a second one abandoned uncounted
    assert budget.reserve() is None
    budget.halt()
    budget.in_flight = 0
    assert budget.reserve() == "the run is stopping"


def test_a_rounds_calls_take_their_places_in_order_and_an_error_halts_them_at_once():
    """Two calls share one place: the first call's three jobs run before the second's; then a third call whose
    record raises halts the round at once, though a fourth call's job hangs."""
    runner, slots, order = Runner(executor=None, timeout=None), RoundSlots(1), []
    budget = Budget(max_metric_calls=None, max_cost=None, state=RunState(
        fingerprint=Fingerprint(config="", trainset="", valset="", program=""), config={}, predictors=["p"],
        train_size=3, val_size=0))
    hang = threading.Event()

    def call(rank: int, started: threading.Event, fail: bool = False, hangs: bool = False):
        def job(item):
            return None if budget.reserve() else ExampleJob(candidate_id=rank, index=item, program=None, example=None,
                                                            metric=None, failure_score=0.0, settings={})

        def finish(item, result):
            with budget.lock:
                budget.in_flight -= 1
            order.append((rank, item))
            if fail:
                raise KeyError("the metric broke")
            return item

        def run():
            started.set()
            if hangs:
                hang.wait(30)
            return runner.map([0, 1, 2], job, finish, width=3, context=contextvars.copy_context(), progress=NoBar(),
                              slots=(slots, rank), halted=budget.halted)
        return run

    import dspy_opro.scoring.engine as engine

    real = engine.run_example
    engine.run_example = lambda job: ExampleResult(job.candidate_id, job.index, "ok", score=1.0)
    try:
        started = [threading.Event(), threading.Event()]
        assert runner.concurrently([call(0, started[0]), call(1, started[1])], started=started,
                                   halt=budget.halt) == [[0, 1, 2], [0, 1, 2]]
        assert order == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
        order.clear()
        slots, began = RoundSlots(2), time.monotonic()
        started = [threading.Event(), threading.Event()]
        with pytest.raises(KeyError, match="the metric broke"):
            runner.concurrently([call(0, started[0], fail=True), call(1, started[1], hangs=True)], started=started,
                                halt=budget.halt)
        assert time.monotonic() - began < 10 and budget.halted.is_set()
        # Call 0 holds both places, so its items 0 and 1 run together and either may finish first; the first
        # finish raises, and nothing is recorded after it.
        assert len(order) == 1 and order[0] in [(0, 0), (0, 1)]
    finally:
        hang.set()
        engine.run_example = real


def test_one_candidates_evaluation_is_a_dspy_evaluate_call_its_callbacks_see():
    seen = []

    class Probe(dspy.utils.callback.BaseCallback):
        def on_evaluate_start(self, call_id, instance, inputs):
            seen.append(("start", type(instance).__name__, isinstance(instance, dspy.Evaluate),
                         inputs["callback_metadata"]))

        def on_evaluate_end(self, call_id, outputs, exception=None):
            seen.append(("end", outputs.score, [score for _, _, score in outputs.results]))

    lm, engine = make_lm(lambda request: chat_reply(answer="4"), model="openai/task")
    program = dspy.Predict("question -> answer")
    examples = [dspy.Example(question=f"{i} + 2?", answer=str(i + 2)).with_inputs("question") for i in range(4)]
    state = RunState(fingerprint=Fingerprint(config="", trainset="", valset="", program=""), config={},
                     predictors=["p"], train_size=4, val_size=0)
    recorded = []

    def record(result):
        recorded.append((result.index, result.score))
        state.metric_calls += 1

    def make(index):
        return ExampleJob(candidate_id=0, index=index, program=program, example=examples[index],
                          metric=lambda e, p: float(e.answer == p.answer), metric_takes_trace=False,
                          failure_score=0.0, settings={"lm": lm})

    evaluate = CandidateEvaluate(devset=list(enumerate(examples)), jobs=make,
                                 runner=Runner(executor=None, timeout=30), budget=Budget(3, None, state),
                                 record=record, num_threads=2, display_progress=False, failure_score=0.0)
    with dspy.context(callbacks=[Probe()]):
        result = evaluate(program, callback_metadata={"metric_key": "eval"})
    assert seen == [("start", "CandidateEvaluate", True, {"metric_key": "eval"}), ("end", 25.0, [0.0, 0.0, 1.0, 0.0])]
    assert sorted(recorded) == [(0, 0.0), (1, 0.0), (2, 1.0)]  # the budget's three; the fourth never ran
    assert evaluate.stop_reason == "max_metric_calls=3 reached" and len(engine.requests) == 3
    assert [p.answer for _, p, _ in result.results[:3]] == ["4", "4", "4"] and result.results[3][1].keys() == []


def test_the_meter_counts_an_lms_calls_on_any_thread_with_the_usage_dspy_reports():
    lm, engine = make_lm(lambda request: chat_reply(answer="4"), model="openai/task", input_tokens=11,
                         output_tokens=3)
    meter = UsageMeter()
    seen = []
    meter.on_call = lambda: seen.append(threading.current_thread().name)
    predict = dspy.Predict("question -> answer")
    with meter.attached([lm, lm, None]):
        assert lm.callbacks.count(meter) == 1
        thread = threading.Thread(target=lambda: predict(question="2 + 2?", lm=lm), name="their-thread")
        thread.start()
        thread.join()
        with dspy.context(lm=lm):
            predict(question="2 + 2, again?")
    assert meter not in lm.callbacks  # the LM is left as it was
    assert seen == ["their-thread", "MainThread"] and len(engine.requests) == 2
    # The model has no price: its cost is unknown, not $0.
    assert meter.take() == {"openai/task": ModelUsage(calls=2, prompt_tokens=22, completion_tokens=6, unpriced_calls=2)}
    assert meter.take() == {}


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
        assert Runner(executor=pool, timeout=None)._tag(untagged) is untagged
        assert Runner(executor=None, timeout=None)._tag(untagged) is untagged
    assert AttemptReporter.on_this_worker(UsageChannel("t", 0), dict) is None


def test_an_evaluation_outside_a_dask_worker_names_no_attempt():
    lm, engine = make_lm(lambda request: chat_reply(answer="4"), model="openai/task")
    tagged = ExampleJob(candidate_id=0, index=0, program=dspy.Predict("question -> answer"),
                        example=dspy.Example(question="2 + 2?", answer="4").with_inputs("question"), metric=None,
                        failure_score=0.0, settings={"lm": lm}, usage_channel=UsageChannel("t", 0))
    result = run_example(tagged)  # no meter: the evaluation's own tracker counts the call
    assert (result.outcome, result.attempt, result.usage) == (
        "ok", None, {"openai/task": ModelUsage(calls=1, prompt_tokens=10, completion_tokens=5, unpriced_calls=1)})
    meter = UsageMeter()
    with meter.attached([lm]):  # in a run, the meter counts the task LM's calls and the result only what it missed
        assert run_example(dataclasses.replace(tagged, meter=meter)).usage == {}
    assert meter.take()["openai/task"].calls == 1 and len(engine.requests) == 2


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


def test_an_executor_gets_twice_max_num_threads_8_evaluations_in_flight_the_runs_threads_num_threads():
    with cf.ThreadPoolExecutor(1) as pool:
        assert [Runner(executor=pool, timeout=None).places(n) for n in (1, 8, 32)] == [16, 16, 64]
    assert [Runner(executor=None, timeout=None).places(n) for n in (1, 8, 32)] == [1, 8, 32]
