"""Optimizer calls that hold under real servers and budgets (issues 20 and 23): a server that caps ``n``, a
``max_cost`` that no optimizer request may exceed, and replies whose closing tag never comes.

Each compile drives OPRO through the real DSPy/LiteLLM client against :class:`SimulatedEndpoint`; the truth is the
endpoint's request log (and the bill computed from it at LiteLLM's list prices), not the run's own counters.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import logging

import dspy
import litellm
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.core.meta_prompt import MetaPromptOptions, extract_instruction, polish_sentence
from dspy_opro.core.proposals import is_unclosed, triage_replies
from dspy_opro.errors import rejects_n
from dspy_opro.record.files import load_state
from dspy_opro.record.report import REPORT_FILE
from dspy_opro.testing import FaultConfig, SimulatedEndpoint, simulated_dataset, simulated_metric

TASK, OPT = "openai/sim-task", "openai/sim-opt"
PRICED_TASK, PRICED_OPT = "openai/gpt-4o-mini", "openai/gpt-4o"


@pytest.fixture
def endpoint():
    with SimulatedEndpoint() as ep:
        yield ep


def compile_run(endpoint, *, trainset, opt=OPT, task=TASK, **options):
    teleprompter = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm(opt, num_retries=0),
                                    task_model=endpoint.lm(task, num_retries=0), **options)
    return teleprompter.compile(dspy.Predict("question -> answer"), trainset=trainset)


def opro(endpoint):
    return [r for r in endpoint.requests if r.kind == "opro"]


# ---------------------------------------------------------------------------------------- a server that caps n


@pytest.mark.slow
def test_a_400_above_the_n_cap_falls_back_to_single_choices_and_a_resumed_run_remembers_it(endpoint, tmp_path,
                                                                                           caplog):
    endpoint.faults = FaultConfig(n_cap=1)  # llama-server with one slot
    train = simulated_dataset(4)
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        run = compile_run(endpoint, trainset=train, num_steps=2, num_candidates=3, num_threads=1,
                          log_dir=tmp_path).opro_run
    # Step 0: the n=3 request is refused once (no retry), then three single-choice requests; step 1: single only.
    assert [(r.n, r.status, r.fault) for r in opro(endpoint)] == [(3, 400, "n_cap")] + [(1, 200, None)] * 6
    assert [len(s.replies) for s in run.steps] == [3, 3]
    assert [(s.failed_calls, s.errors) for s in run.steps] == [(0, []), (0, [])]
    assert list(run.optimizer_single_choice) == [OPT]
    assert run.optimizer_single_choice[OPT].startswith("it refused a request for 3 choices: LMInvalidRequestError")
    assert "n must be <= 1 (the server's slots), got n = 3" in run.optimizer_single_choice[OPT]
    notices = [r.getMessage() for r in caplog.records if "refused a request for 3 choices" in r.getMessage()]
    assert len(notices) == 1 and notices[0].startswith(f"The optimizer model {OPT!r}")
    assert load_state(tmp_path).optimizer_single_choice == run.optimizer_single_choice
    assert f"- Optimizer `{OPT}` asked one choice per request: it refused" in (tmp_path / REPORT_FILE).read_text()

    # A resumed run (two more steps) never sends the n request again, even to a server without the cap.
    endpoint.reset_log()
    endpoint.faults = FaultConfig()
    resumed = compile_run(endpoint, trainset=train, num_steps=4, num_candidates=3, num_threads=1,
                          log_dir=tmp_path).opro_run
    assert [(r.n, r.status) for r in opro(endpoint)] == [(1, 200)] * 6
    assert [len(s.replies) for s in resumed.steps] == [3, 3, 3, 3]


class _Refusal(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def test_only_a_400_naming_n_is_an_n_refusal():
    assert rejects_n(_Refusal("n must be <= 4 (the server's slots), got n = 8"))
    assert rejects_n(_Refusal("Only one completion choice is allowed"))  # llama-server's older wording
    assert not rejects_n(_Refusal("temperature must be between 0 and 2"))
    assert not rejects_n(_Refusal("n must be <= 4", status=500))
    wrapped = RuntimeError("the call failed")
    wrapped.__cause__ = _Refusal("'n' is not supported with this model")
    assert rejects_n(wrapped)


# -------------------------------------------------------------------------------------------------- max_cost


def bill(records) -> float:
    """What the endpoint served, at LiteLLM's list prices (the accounting tests' rule)."""
    total = 0.0
    for record in records:
        if record.status != 200:
            continue
        prices = litellm.model_cost[record.model]
        total += record.prompt_tokens * prices["input_cost_per_token"]
        total += record.completion_tokens * prices["output_cost_per_token"]
    return total


def start_bill(endpoint, train) -> float:
    """The bill of scoring the start alone (step -1), measured on a run without a budget."""
    compile_run(endpoint, trainset=train, opt=PRICED_OPT, task=PRICED_TASK, num_steps=0, num_threads=1)
    cost = bill(endpoint.requests)
    endpoint.reset_log()
    return cost


@pytest.mark.slow
@pytest.mark.parametrize("single_choice", [False, True])
def test_no_optimizer_request_is_sent_whose_worst_case_does_not_fit_in_max_cost(endpoint, single_choice, caplog):
    train = simulated_dataset(4)
    start = start_bill(endpoint, train)
    if single_choice:
        endpoint.faults = FaultConfig(ignore_n=True)  # the first request finds it; the rest go one by one
    max_tokens = 80
    prices = (litellm.model_cost["gpt-4o"]["input_cost_per_token"],
              litellm.model_cost["gpt-4o"]["output_cost_per_token"])
    # Room after step -1 for about three choices' worst case (700 prompt tokens, 3 x max_tokens completion tokens):
    # the n=8 request shrinks to the n that fits.
    max_cost = start + 700 * prices[0] + 3 * max_tokens * prices[1]
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        run = compile_run(endpoint, trainset=train, opt=PRICED_OPT, task=PRICED_TASK, num_steps=3, num_candidates=8,
                          num_threads=1, max_tokens=max_tokens, max_cost=max_cost).opro_run
    records = endpoint.requests
    asked = [r.n for r in opro(endpoint)]
    step = run.steps[0]
    assert len(run.steps) == 1 and 1 <= len(step.replies) < 8
    assert step.skipped_calls == 8 - (asked[0] if not single_choice else len(step.replies))
    assert step.skip_reason.startswith("max_cost: an optimizer request for ")
    assert run.status == "stopped" and run.stop_reason.startswith("max_cost")
    if not single_choice:
        assert asked == [8 - step.skipped_calls]  # the largest n that fits, in one request
    else:
        assert asked[0] > 1 and asked[1:] == [1] * (len(asked) - 1)
    # The optimizer's bill never passes what was left when its requests were sent; the whole bill passes max_cost
    # by at most the evaluation in flight (one task request).
    optimizer_bill = bill([r for r in records if r.kind == "opro"])
    assert optimizer_bill <= max_cost - start
    task_requests = [bill([r]) for r in records if r.kind == "task"]
    assert bill(records) <= max_cost + max(task_requests)
    assert run.usage.total_cost == pytest.approx(bill(records), rel=1e-9)
    assert any("optimizer proposals not asked for" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_an_optimizer_request_that_cannot_fit_at_all_is_not_sent_and_a_larger_budget_continues(endpoint, tmp_path):
    train = simulated_dataset(4)
    start = start_bill(endpoint, train)
    options = {"opt": PRICED_OPT, "task": PRICED_TASK, "num_steps": 2, "num_candidates": 4, "num_threads": 1,
               "max_tokens": 1024, "log_dir": tmp_path}
    run = compile_run(endpoint, trainset=train, max_cost=start * 1.01, **options).opro_run
    assert opro(endpoint) == []
    assert [(s.skipped_calls, s.replies) for s in run.steps] == [(4, [])]
    assert run.status == "stopped" and "step 0 asked for 0 of its 4 proposals" in run.stop_reason
    assert "- Optimizer proposals not asked for (max_cost): 4" in (tmp_path / REPORT_FILE).read_text()
    # Compiled again with room, the run goes on with step 1 (step 0's skipped proposals are not asked again).
    endpoint.reset_log()
    resumed = compile_run(endpoint, trainset=train, max_cost=1.0, **options).opro_run
    assert [(r.n, r.status) for r in opro(endpoint)] == [(4, 200)]
    assert resumed.status == "finished" and [len(s.replies) for s in resumed.steps] == [0, 4]


# ------------------------------------------------------------------------------------------ unclosed replies


def test_unclosed_replies_keep_the_authors_extraction_and_get_their_own_fate():
    options = {"optimizer_family": "gpt", "instruction_pos": "Q_begin",
               "meta_prompt_type": "both_instructions_and_exemplars"}
    replies = ["<INS>Think step by step.</INS>", "<INS>Think carefully.\nThis works because it is short.",
               "Solve it.", "<INS>Think step by step.</INS>"]
    verdicts = triage_replies(replies, set(), MetaPromptOptions(**options), max_instruction_chars=None)
    assert [(v.fate, v.unclosed) for v in verdicts] == [("new", False), ("unclosed", True), ("new", False),
                                                        ("duplicate", False)]
    assert verdicts[1].instruction == polish_sentence(extract_instruction(replies[1], **options))
    assert verdicts[1].instruction == "Think carefully.\nThis works because it is short."
    too_long = triage_replies(replies[1:2], set(), MetaPromptOptions(**options), max_instruction_chars=20)
    assert [(v.fate, v.unclosed) for v in too_long] == [("too_long", True)]
    # PaLM's brackets and the instructions_only <TEXT> tag: the authors' extraction gives "" and None.
    palm = triage_replies(["[Think step by step\nand check."], set(),
                          MetaPromptOptions(optimizer_family="palm", instruction_pos="Q_begin",
                                            meta_prompt_type="both_instructions_and_exemplars"),
                          max_instruction_chars=None)
    assert [(v.fate, v.instruction, v.unclosed) for v in palm] == [("empty", "", True)]
    text = triage_replies(["<TEXT>Think step by step."], set(),
                          MetaPromptOptions(optimizer_family="gpt", instruction_pos="Q_begin",
                                            meta_prompt_type="instructions_only"),
                          max_instruction_chars=None)
    assert [(v.fate, v.instruction, v.unclosed) for v in text] == [("no_instruction", None, True)]
    assert not is_unclosed("[Think.] and more [", MetaPromptOptions(optimizer_family="palm", instruction_pos="Q_begin",
                                                                    meta_prompt_type="both_instructions_and_exemplars"))


@pytest.mark.slow
def test_replies_without_their_closing_tag_are_recorded_as_unclosed_and_scored_as_the_authors_would(endpoint,
                                                                                                     tmp_path):
    endpoint.faults = FaultConfig(unclosed_tags=1.0)  # a 135M model: no reply closes <INS>
    train = simulated_dataset(4)
    run = compile_run(endpoint, trainset=train, num_steps=1, num_candidates=3, num_threads=1,
                      log_dir=tmp_path).opro_run
    (step,) = run.steps
    (request,) = opro(endpoint)
    assert (request.unclosed, request.choices) == (3, 3)
    assert [(reply.fate, reply.unclosed) for reply in step.replies] == [("unclosed", True)] * 3
    for reply in step.replies:
        candidate = run.candidates[reply.candidate_id]
        # The whole rest of the reply is the instruction (the authors' slicing), scored on every example.
        assert candidate.instruction == polish_sentence(reply.text.split("<INS>", 1)[1].strip())
        assert len(candidate.instruction) > 150 and candidate.status == "scored"
    task_after_step = [r for r in endpoint.requests if r.kind == "task" and r.index > request.index]
    assert len(task_after_step) == 3 * len(train)
    report = (tmp_path / REPORT_FILE).read_text()
    assert "- Optimizer replies without their closing tag: 3 of 3" in report
    step_report = (tmp_path / "steps" / "000" / "report.md").read_text()
    assert "- Optimizer replies: 3 (unclosed 3)" in step_report


# ------------------------------------------------------------------------------------- usage of the first choice


@pytest.mark.slow
def test_a_server_counting_only_the_first_choice_is_named_in_the_record(endpoint, tmp_path, caplog):
    endpoint.faults = FaultConfig(usage_first_choice_only=True)  # llama-server with n > 1
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        run = compile_run(endpoint, trainset=simulated_dataset(4), num_steps=1, num_candidates=3, num_threads=1,
                          log_dir=tmp_path).opro_run
    (request,) = opro(endpoint)
    assert request.reported_completion_tokens < request.completion_tokens
    # The record holds what the server reported, and names the server's undercount.
    assert run.usage.optimizer.completion_tokens == request.reported_completion_tokens
    why = run.optimizer_usage_undercount[OPT]
    assert why.startswith(f"its usage counted {request.reported_completion_tokens} completion tokens for 3 choices "
                          f"that hold at least {request.completion_tokens}")
    assert sum(f"The optimizer model {OPT!r}: {why}." == r.getMessage() for r in caplog.records) == 1
    assert f"- Optimizer `{OPT}` under-reports its usage: its usage counted" in (tmp_path / REPORT_FILE).read_text()


def test_step_candidates_reads_the_record_and_leaves_it_unchanged():
    from dspy_opro.core.meta_prompt import instruction_md5
    from dspy_opro.core.proposals import step_candidates
    from dspy_opro.state import Candidate, Fingerprint, RunState, Step, digest

    start = {"p": "Answer."}
    state = RunState(fingerprint=Fingerprint(config="c", trainset="t", valset="v", program="p"), config={},
                     predictors=["p"], train_size=2, val_size=0)
    state.candidates = [
        Candidate(id=0, step=-1, predictor=None, instruction="", instructions=start, md5=digest(start),
                  scores=[1.0, 0.0], score=0.5, status="scored"),
        Candidate(id=1, step=0, predictor="p", instruction="Be brief.", instructions={"p": "Be brief."},
                  md5=instruction_md5("Be brief."), scores=[1.0, 1.0], score=1.0, status="scored"),
    ]
    before = state.model_dump_json()
    records, new = step_candidates(
        Step(step=1, predictor="p", exemplar_indices=[], meta_prompt="", temperature=1.0),
        ["<INS>Answer.</INS>", "<INS>Be brief.</INS>", "<INS>Show work.</INS>", "<INS>Use INS tags.</INS>"],
        state, MetaPromptOptions(optimizer_family="gpt", instruction_pos="Q_begin",
                                 meta_prompt_type="both_instructions_and_exemplars"),
        max_instruction_chars=None)  # n_train is the state's train_size (2)
    assert state.model_dump_json() == before
    assert [(r.fate, r.candidate_id) for r in records] == [("duplicate", 0), ("duplicate", 1), ("new", 2),
                                                           ("contains_ins", 3)]
    assert [(c.id, c.step, c.status, c.instructions, c.scores) for c in new] == [
        (2, 1, "pending", {"p": "Show work."}, [None, None]),
        (3, 1, "skipped", {"p": "Use INS tags."}, []),
    ]


def test_replies_without_their_closing_tag_are_explained_once_per_run(endpoint, caplog):
    endpoint.faults = FaultConfig(unclosed_tags=1.0)
    with caplog.at_level(logging.WARNING, logger="dspy_opro"):
        run = compile_run(endpoint, trainset=simulated_dataset(3), num_steps=2, num_candidates=2,
                          num_threads=1).opro_run
    assert [[reply.fate for reply in step.replies].count("unclosed") for step in run.steps] == [2, 2]
    said = [m for m in caplog.messages if "never closed it" in m]
    assert said == ["Step 0: 2 optimizer replies opened the instruction's tag and never closed it; as the authors' "
                    "extraction does, each is taken from the tag to the end of the reply (whatever the model wrote "
                    "after its instruction included) and scored. Said once per run; the replies are in the run record "
                    "(fate 'unclosed')"]
