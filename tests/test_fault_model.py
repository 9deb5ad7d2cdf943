"""The simulated endpoint's fault model learns the real local servers' behaviour (issue 23, item 3).

Each behaviour seen when a small model was served by llama.cpp is a deterministic fault here, exercised through the
real DSPy/LiteLLM client and checked at the endpoint's request log: a 400 above an ``n`` cap (``llama-server``),
``n`` ignored (llama-cpp-python's server), ``usage`` counting the first choice only, OPRO replies whose closing tag
never comes (a 135M model), slow generation, and a 200 whose body is cut short.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
import pytest
from dspy.utils.exceptions import LMInvalidRequestError

from dspy_opro.errors import classify_exception
from dspy_opro.testing import FaultConfig, SimulatedEndpoint
from dspy_opro.testing.server import count_tokens

META_PROMPT = (
    "Your task is to generate the instruction <INS>. Below are some previous instructions with their scores. "
    "The score ranges from 0 to 100.\n\ntext:\nSolve the problem.\nscore:\n31\n\ntext:\nLet's think step by step."
    "\nscore:\n52\n\n\nGenerate an instruction that is different from all the instructions <INS> above, and has a "
    "higher score than all the instructions <INS> above. The instruction should begin with <INS> and end with "
    "</INS>. The instruction should be concise, effective, and generally applicable to all problems above."
)


@pytest.fixture
def endpoint():
    with SimulatedEndpoint() as ep:
        yield ep


def lm_of(endpoint, **kwargs):
    return endpoint.lm("openai/sim-opt", num_retries=0, **kwargs)


def test_n_above_the_cap_is_a_400_naming_n_and_n_within_it_is_served(endpoint):
    endpoint.faults = FaultConfig(n_cap=2)
    lm = lm_of(endpoint)
    with pytest.raises(LMInvalidRequestError) as info:
        lm(META_PROMPT, n=4, temperature=1.0)
    assert "n must be <= 2 (the server's slots), got n = 4 (simulated llama-server error)" in str(info.value)
    assert classify_exception(info.value) == "failed"  # a 400 is not an outage: nothing retries it blindly
    assert len(lm(META_PROMPT, n=2, temperature=1.0)) == 2
    assert [(r.n, r.status, r.fault, r.choices) for r in endpoint.requests] == [(4, 400, "n_cap", 0),
                                                                                (2, 200, None, 2)]


def test_a_server_ignoring_n_answers_one_choice(endpoint):
    endpoint.faults = FaultConfig(ignore_n=True)
    outputs = lm_of(endpoint)(META_PROMPT, n=3, temperature=1.0)
    assert len(outputs) == 1
    (record,) = endpoint.requests
    assert (record.n, record.choices, record.status) == (3, 1, 200)


def test_usage_of_the_first_choice_only_is_what_the_client_sees_and_the_log_keeps_the_truth(endpoint):
    endpoint.faults = FaultConfig(usage_first_choice_only=True)
    with dspy.track_usage() as tracker:
        outputs = lm_of(endpoint)(META_PROMPT, n=3, temperature=1.0)
    (record,) = endpoint.requests
    true_tokens = sum(count_tokens(output) for output in outputs)
    assert record.completion_tokens == true_tokens
    assert record.reported_completion_tokens == count_tokens(outputs[0]) < true_tokens
    assert tracker.get_total_tokens()["openai/sim-opt"]["completion_tokens"] == record.reported_completion_tokens


def test_unclosed_tags_leave_the_closing_tag_out_and_the_reply_runs_on(endpoint):
    endpoint.faults = FaultConfig(unclosed_tags=1.0)
    outputs = lm_of(endpoint)(META_PROMPT, n=3, temperature=1.0)
    assert all("<INS>" in output and "</INS>" not in output for output in outputs)
    assert all(len(output.split("<INS>", 1)[1]) > 150 for output in outputs)  # the model's musings follow
    (record,) = endpoint.requests
    assert (record.unclosed, record.choices) == (3, 3)
    endpoint.faults = FaultConfig(unclosed_tags=0.5)
    lm_of(endpoint)(META_PROMPT, n=8, temperature=1.0)
    lm_of(endpoint)(META_PROMPT, n=8, temperature=1.0)
    half = [r.unclosed for r in endpoint.requests[1:]]
    assert 0 < sum(half) < 16  # a share, drawn per request and choice
    lm_of(endpoint)("What is 2 + 3?", temperature=1.0)
    assert endpoint.requests[-1].unclosed == 0  # only OPRO replies


def test_slow_generation_waits_per_completion_token(endpoint):
    endpoint.faults = FaultConfig(seconds_per_token=0.01)
    lm_of(endpoint)(META_PROMPT, n=2, temperature=1.0)
    (record,) = endpoint.requests
    assert record.completion_tokens > 10
    assert record.finished - record.started >= 0.01 * record.completion_tokens


def test_a_body_cut_short_is_an_infrastructure_failure_and_the_next_request_is_served(endpoint):
    endpoint.faults = FaultConfig(fail_requests={0}, fail_kind="truncated_body")
    lm = lm_of(endpoint)
    with pytest.raises(Exception) as info:
        lm(META_PROMPT, temperature=1.0)
    assert classify_exception(info.value) == "infra"
    assert len(lm(META_PROMPT, temperature=1.0)) == 1
    assert [(r.status, r.fault) for r in endpoint.requests] == [(200, "truncated_body"), (200, None)]


def test_the_new_settings_are_checked():
    for bad, message in (({"n_cap": 0}, "n_cap must be a positive integer"),
                         ({"unclosed_tags": 1.5}, "unclosed_tags must lie in"),
                         ({"seconds_per_token": -1.0}, "seconds_per_token must be non-negative")):
        with pytest.raises(ValueError, match=message):
            FaultConfig(**bad)
