"""Real providers: which model strings get one request with n samples per step, and
what a run costs at a real price (gpt-4o-mini's, from LiteLLM's bundled price map)."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
import litellm

from dspy_opro import OPROTeleprompter
from dspy_opro.core.proposals import honours_n
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

# --8<-- [start:models]
# Building a dspy.LM makes no request; keys are read from the environment when it calls.
optimizer_models = {
    # OPENAI_API_KEY
    "OpenAI": dspy.LM("openai/gpt-4o-mini", engine="litellm"),
    # ANTHROPIC_API_KEY
    "Anthropic": dspy.LM("anthropic/claude-haiku-4-5", engine="litellm"),
    # vLLM's OpenAI-compatible server (vllm serve Qwen/Qwen2.5-7B-Instruct)
    "vLLM": dspy.LM(
        "openai/Qwen/Qwen2.5-7B-Instruct",
        api_base="http://localhost:8000/v1",
        api_key="local",
        engine="litellm",
    ),
    # Ollama through LiteLLM's own Ollama provider
    "Ollama": dspy.LM(
        "ollama_chat/llama3.1", api_base="http://localhost:11434", engine="litellm"
    ),
}
for name, lm in optimizer_models.items():
    calls = "1 request with n=8" if honours_n(lm) else "8 requests"
    print(f"{name:9} {lm.model:33} one step: {calls}")
# --8<-- [end:models]

# --8<-- [start:cost]
price = litellm.model_cost["gpt-4o-mini"]  # USD per token
p_in, p_out = price["input_cost_per_token"], price["output_cost_per_token"]
print(f"gpt-4o-mini: ${p_in * 1e6:.2f} in, ${p_out * 1e6:.2f} out per million tokens")

num_steps, num_candidates, n_train = 10, 8, 100
meta_prompt, reply = 1_500, 60  # tokens: one meta-prompt, one optimizer reply
task_in, task_out = 250, 150  # tokens of one program run (one ChainOfThought call)

# With n honoured, each step's meta-prompt is billed once for all its replies.
optimizer_cost = num_steps * (meta_prompt * p_in + num_candidates * reply * p_out)
program_runs = n_train * (1 + num_steps * num_candidates)  # at most: duplicates skip
task_cost = program_runs * (task_in * p_in + task_out * p_out)
print(f"optimizer: ${optimizer_cost:.4f}")
print(f"task: {program_runs:,} program runs, at most ${task_cost:.2f}")
# --8<-- [end:cost]
assert round(optimizer_cost, 5) == 0.00513 and round(task_cost, 2) == 1.03

# The formula's inputs, checked on a run against the simulated endpoint: the token
# counts the run records are the ones the endpoint served, and the optimizer sent one
# request with n=4 per step (its prompt billed once).
with SimulatedEndpoint() as endpoint:
    optimizer = OPROTeleprompter(
        metric=simulated_metric,
        prompt_model=endpoint.lm("openai/simulated-optimizer"),
        task_model=endpoint.lm("openai/simulated-task"),
        num_steps=2,
        num_candidates=4,
        num_threads=4,
    )
    program = dspy.ChainOfThought("question -> answer")
    run = optimizer.compile(program, trainset=simulated_dataset(10)).opro_run
    served = [r for r in endpoint.requests if r.status == 200]
    for role, kind in (("optimizer", "opro"), ("task", "task")):
        usage = getattr(run.usage, role)
        requests = [r for r in served if r.kind == kind]
        assert usage.calls == len(requests)
        assert usage.prompt_tokens == sum(r.prompt_tokens for r in requests)
        assert usage.completion_tokens == sum(r.completion_tokens for r in requests)
    assert [r.n for r in served if r.kind == "opro"] == [4, 4]
