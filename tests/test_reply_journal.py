"""Every optimizer reply is journaled as it arrives (issue 20, item 1): a kill during a step's optimizer calls costs at
most the request in flight, and the resumed step holds the replies the killed run received, in sample order.

The truth is the simulated endpoint's request log and its simulated model (which draws a new sample for each repeat
of an identical request at temperature 1, as a real provider does), not the run's own counters.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import json
import logging
import subprocess
import sys
from pathlib import Path

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.core.proposals import propose
from dspy_opro.errors import StateFileError
from dspy_opro.record.files import PROGRESS_FILE, ProgressJournal, load_state
from dspy_opro.record.recorder import RunRecorder, meta_prompt_md5
from dspy_opro.scoring.usage import UsageMeter
from dspy_opro.state import Fingerprint, ModelUsage, ReceivedReplies, RunState, Step
from dspy_opro.testing import FaultConfig, SimulatedEndpoint, simulated_dataset, simulated_metric
from dspy_opro.testing.simulated import simulated_reply
from tests.kill_job import OPTIMIZER, build, datasets

ROOT = Path(__file__).resolve().parent.parent
OPT = "openai/sim-opt"
META_PROMPT = ("Your task is to generate the instruction <INS>. Below are some previous instructions with their "
               "scores.\n\ntext:\nLet's solve the problem.\nscore:\n60\n\nGenerate an instruction that is different "
               "from all the instructions <INS> above, and has a higher score than all the instructions <INS> above.")


@pytest.fixture
def endpoint():
    with SimulatedEndpoint() as ep:
        yield ep


class ListLog:
    """A reply log that keeps what it is handed."""

    def __init__(self) -> None:
        self.records: list[tuple[int, list[str], dict[str, ModelUsage]]] = []

    def record(self, sample: int, replies: list[str], usage: dict[str, ModelUsage]) -> None:
        self.records.append((sample, replies, usage))


def sample_text(endpoint: SimulatedEndpoint, messages: list[dict], repeat: int) -> str:
    """The reply the endpoint serves to the ``repeat``-th identical single-choice request at temperature 1."""
    return simulated_reply(messages, sample=repeat, seed=endpoint.seed)[1]


def opro(endpoint: SimulatedEndpoint, status: int | None = 200) -> list:
    return [r for r in endpoint.requests if r.kind == "opro" and (status is None or r.status == status)]


def ask(endpoint, log, **options):
    arguments = {"num_candidates": 4, "step": 0, "seed": 0, "temperature": 1.0, "max_tokens": 200, "num_threads": 1,
                 **options}
    lm = endpoint.lm(OPT, num_retries=0)
    with UsageMeter().attached([lm]) as meter:  # the run's meter: each request takes what it was billed
        return propose(lm, META_PROMPT, reply_log=log.record, take_usage=meter.take, **arguments)


# ------------------------------------------------------------------------------------------------------ propose


def test_an_n_request_journals_its_choices_once_with_the_request_usage(endpoint):
    log = ListLog()
    proposals = ask(endpoint, log)
    (served,) = opro(endpoint)
    assert (served.n, served.choices) == (4, 4)
    assert [(sample, len(replies)) for sample, replies, _ in log.records] == [(0, 4)]
    assert log.records[0][1] == proposals.replies
    usage = log.records[0][2][OPT]
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, served.prompt_tokens,
                                                                         served.completion_tokens)


def test_propose_with_received_replies_asks_only_the_missing_samples_and_returns_all_in_sample_order(endpoint):
    log = ListLog()
    received = {0: "reply zero", 2: "reply two"}
    proposals = ask(endpoint, log, received=received)
    served = opro(endpoint)
    assert [(r.n, r.status) for r in served] == [(1, 200), (1, 200)]  # samples 1 and 3, one choice each
    messages = served[0].messages
    fresh = [sample_text(endpoint, messages, 0), sample_text(endpoint, messages, 1)]
    assert proposals.replies == ["reply zero", fresh[0], "reply two", fresh[1]]
    assert [(sample, replies) for sample, replies, _ in log.records] == [(1, [fresh[0]]), (3, [fresh[1]])]
    # Only the new requests are counted: the received replies' usage was counted when they were replayed.
    assert proposals.usage[OPT].calls == 2 == len(served)
    assert proposals.usage[OPT].prompt_tokens == sum(r.prompt_tokens for r in served)
    assert proposals.usage[OPT].completion_tokens == sum(r.completion_tokens for r in served)


def test_propose_with_every_sample_received_asks_nothing(endpoint):
    log = ListLog()
    proposals = ask(endpoint, log, received={0: "a", 1: "b", 2: "c", 3: "d", 7: "not asked: num_candidates is 4"})
    assert endpoint.count() == 0 and log.records == []
    assert proposals.replies == ["a", "b", "c", "d"] and proposals.usage == {}


# ------------------------------------------------------------------------------------ the journal's reply entries


def record_state(steps: int = 1, num_candidates: int = 4) -> RunState:
    state = RunState(fingerprint=Fingerprint(config="c", trainset="t", valset="v", program="p"),
                     config={"num_candidates": num_candidates}, predictors=["predict"], train_size=2, val_size=0)
    state.steps = [Step(step=s, predictor="predict", exemplar_indices=[], meta_prompt="old", temperature=1.0)
                   for s in range(steps)]
    return state


def usage(calls: int, prompt: int, completion: int, cost: float) -> dict[str, ModelUsage]:
    return {OPT: ModelUsage(calls=calls, prompt_tokens=prompt, completion_tokens=completion, cost=cost)}


def test_journaled_replies_are_replayed_onto_their_step_by_sample_and_counted_once(tmp_path):
    recorder = RunRecorder(str(tmp_path), num_steps=3, max_metric_calls=None, max_cost=None)
    log = recorder.reply_log(1, META_PROMPT)
    assert log is not None
    log(2, ["second"], usage(1, 100, 10, 0.001))
    log(0, ["zeroth"], usage(1, 100, 12, 0.002))
    recorder.journal_replies(step=0, sample=0, meta_prompt_md5="x", replies=["recorded"], usage=usage(1, 1, 1, 5.0))
    recorder.close()
    lines = ProgressJournal.read(tmp_path)
    assert lines[0] == {"k": "reply", "step": 1, "n": 2, "d": meta_prompt_md5(META_PROMPT), "r": ["second"],
                        "u": {OPT: usage(1, 100, 10, 0.001)[OPT].model_dump()}}

    state = record_state(steps=1)
    RunRecorder(str(tmp_path), num_steps=3, max_metric_calls=None, max_cost=None)._replay_journal(state)
    assert state.received_replies == ReceivedReplies(step=1, meta_prompt_md5=meta_prompt_md5(META_PROMPT),
                                                     replies={2: "second", 0: "zeroth"})
    # Step 0's entry is in the snapshot already (the record holds step 0): not counted again.
    assert (state.usage.optimizer.calls, state.usage.optimizer.completion_tokens) == (2, 22)
    assert state.usage.total_cost == pytest.approx(0.003)  # what max_cost's reservation takes as spent

    # Replayed again (a crash between the snapshot and the journal's clearing): the kept samples count once.
    RunRecorder(str(tmp_path), num_steps=3, max_metric_calls=None, max_cost=None)._replay_journal(state)
    assert state.usage.optimizer.calls == 2

    reader = RunRecorder(str(tmp_path), num_steps=3, max_metric_calls=None, max_cost=None)
    assert reader.received_replies(state, 1, META_PROMPT) == {0: "zeroth", 2: "second"}
    assert reader.received_replies(state, 2, META_PROMPT) == {}


def test_replies_to_another_meta_prompt_are_ignored_with_a_warning_and_their_cost_stays_counted(tmp_path, caplog):
    recorder = RunRecorder(str(tmp_path), num_steps=3, max_metric_calls=None, max_cost=None)
    recorder.journal_replies(step=1, sample=0, meta_prompt_md5=meta_prompt_md5("an earlier meta-prompt"),
                             replies=["a", "b"], usage=usage(1, 100, 20, 0.004))
    recorder.close()
    state = record_state(steps=1)
    reader = RunRecorder(str(tmp_path), num_steps=3, max_metric_calls=None, max_cost=None)
    reader._replay_journal(state)
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        assert reader.received_replies(state, 1, META_PROMPT) == {}
    assert ("Step 1: the 2 optimizer replies received before the run was killed answered another meta-prompt"
            in caplog.text)
    assert state.usage.optimizer.calls == 1 and state.usage.total_cost == pytest.approx(0.004)  # it was paid


def test_a_snapshot_before_the_step_is_recorded_keeps_its_journaled_replies(tmp_path):
    # Ctrl-C or an error during the optimizer calls: end() saves state.json, and the journal it starts afresh
    # still holds the replies of the step the record does not hold yet.
    recorder = RunRecorder(str(tmp_path), num_steps=3, max_metric_calls=None, max_cost=None)
    state = record_state(steps=1)
    log = recorder.reply_log(1, META_PROMPT)
    assert log is not None
    log(0, ["zeroth"], usage(1, 100, 12, 0.002))
    recorder.save(state)
    assert [entry["r"] for entry in ProgressJournal.read(tmp_path)] == [["zeroth"]]
    state.steps.append(Step(step=1, predictor="predict", exemplar_indices=[], meta_prompt=META_PROMPT,
                            temperature=1.0))
    recorder.save(state)  # the step is recorded: its replies are in the snapshot
    assert ProgressJournal.read(tmp_path) == []
    recorder.close()


def test_ctrl_c_after_an_n_request_answered_keeps_its_choices_and_the_resumed_step_asks_nothing(endpoint, tmp_path,
                                                                                               monkeypatch):
    # The window between an n request's answer and the step's snapshot: Ctrl-C there saves state.json (which does
    # not hold the step yet), and the journal keeps the request's choices.
    from dspy_opro.core import run as run_module

    real_triage, interrupted = run_module.step_candidates, []

    def interrupt_once(record, replies, *args, **kwargs):
        if not interrupted:
            interrupted.append(len(replies))
            raise KeyboardInterrupt
        return real_triage(record, replies, *args, **kwargs)

    monkeypatch.setattr(run_module, "step_candidates", interrupt_once)

    def compile_run():
        teleprompter = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(OPT, num_retries=0),
                                        task_model=endpoint.lm("openai/sim-task", num_retries=0), num_steps=1,
                                        num_candidates=4, num_threads=1, log_dir=str(tmp_path))
        return teleprompter.compile(dspy.Predict("question -> answer"), trainset=simulated_dataset(3)).opro_run

    with pytest.raises(KeyboardInterrupt):
        compile_run()
    assert interrupted == [4]
    saved = load_state(tmp_path)
    assert saved is not None and saved.status == "interrupted" and saved.steps == []
    assert [(entry["k"], entry["n"], len(entry["r"])) for entry in ProgressJournal.read(tmp_path)] == [("reply", 0, 4)]
    run = compile_run()
    (served,) = opro(endpoint, status=None)  # the one n request: the resumed step asked nothing
    assert (served.n, served.status, served.choices) == (4, 200, 4)
    assert [reply.text for reply in run.steps[0].replies] == [
        simulated_reply(served.messages, sample=sample, seed=endpoint.seed)[1] for sample in range(4)]
    optimizer = run.usage.optimizer
    assert (optimizer.calls, optimizer.prompt_tokens, optimizer.completion_tokens) == (
        1, served.prompt_tokens, served.completion_tokens)
    assert run.received_replies is None and run.status == "finished"


GOOD = {"k": "reply", "step": 1, "n": 0, "d": "0123abcd", "r": ["text"], "u": {}}


@pytest.mark.parametrize(
    ("forged", "field"),
    [
        ({"step": 2}, "field step: the record has 1 steps, so the step being asked is 1"),
        ({"step": "1"}, "field step"),
        ({"r": []}, "field r (replies): [] is not a non-empty list of texts"),
        ({"r": ["ok", 3]}, "field r (replies)"),
        ({"n": -1}, "field n (sample): -1 is not the sample of 1 replies"),
        ({"n": 3, "r": ["a", "b"]}, "field n (sample): 3 is not the sample of 2 replies (samples 0 to 3 with "
                                    "num_candidates=4)"),
        ({"d": None}, "field d (meta-prompt digest): None is not a digest"),
        ({"u": {OPT: {"calls": "many"}}}, "field u (usage): not a usage record"),
    ],
)
def test_a_forged_reply_line_is_refused_naming_the_file_the_line_and_the_field(tmp_path, forged, field):
    (tmp_path / PROGRESS_FILE).write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, **forged}) + "\n")
    with pytest.raises(StateFileError) as refused:
        RunRecorder(str(tmp_path), num_steps=3, max_metric_calls=None, max_cost=None)._replay_journal(record_state())
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / PROGRESS_FILE}, line 2: optimizer reply of step ")
    assert field in message and "delete that line" in message


# --------------------------------------------------------------------------------------- a kill among the replies


def kill_child(endpoint: SimulatedEndpoint, log_dir: Path, kill_at: int) -> None:
    child = subprocess.run([sys.executable, "-m", "tests.kill_job", endpoint.base_url, str(log_dir), "single_choice",
                            OPTIMIZER, "all", str(kill_at)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [1, 3, 7])
def test_a_kill_among_single_choice_replies_buys_only_the_reply_in_flight_again(tmp_path, kill_at):
    candidates = 8
    with SimulatedEndpoint() as endpoint:
        endpoint.faults = FaultConfig(n_cap=1)  # llama-server with one slot: every proposal is its own request
        kill_child(endpoint, tmp_path / "run", kill_at)
        killed = opro(endpoint)
        assert len(killed) == kill_at  # SIGKILL as the kill_at-th reply came back, before the run journaled it
        teleprompter, program = build(endpoint.base_url, str(tmp_path / "run"), "single_choice")
        trainset, valset = datasets()
        run = teleprompter.compile(program, trainset=trainset, valset=valset).opro_run
        served = opro(endpoint)
    step_0 = [r for r in served if r.messages == killed[0].messages]
    # Step 0: the kill_at - 1 journaled replies are not asked again; the one in flight at the kill is.
    assert len(step_0) == candidates + 1
    assert all(r.n == 1 for r in step_0)
    texts = [sample_text(endpoint, killed[0].messages, repeat) for repeat in range(candidates + 1)]
    lost = kill_at - 1  # the repeat the kill cut off
    assert [reply.text for reply in run.steps[0].replies] == texts[:lost] + texts[lost + 1:]
    assert len(run.steps) == 2 and [len(s.replies) for s in run.steps] == [candidates, candidates]
    # The record's optimizer usage is what the endpoint served, less the reply cut off by the kill, counted once.
    cut_off = step_0[lost]
    optimizer = run.usage.optimizer
    assert optimizer.calls == len(served) - 1 == 2 * candidates
    assert optimizer.prompt_tokens == sum(r.prompt_tokens for r in served) - cut_off.prompt_tokens
    assert optimizer.completion_tokens == sum(r.completion_tokens for r in served) - cut_off.completion_tokens
    saved = load_state(tmp_path / "run")
    assert saved is not None and saved.received_replies is None
