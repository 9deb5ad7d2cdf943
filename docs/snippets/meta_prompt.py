"""The meta-prompt of one step, built with the port of the authors' builder (the
defaults of OPROTeleprompter)."""

from dspy_opro.core.meta_prompt import gen_meta_prompt

history = [  # (instruction, training score in [0, 1], step); -1 is the program as given
    ("Given the fields `question`, produce the fields `answer`.", 0.25, -1),
    ("Let's think step by step.", 0.5833333333333334, 0),
    ("Read the problem carefully.", 0.4166666666666667, 0),
]
# (question, answer): the example's input fields, and its labels for the predictor's
# outputs
problems = [
    (
        "Ben earns 16 dollars per day for 2 days and spends 9 dollars. "
        "How many dollars does Ben save?",
        "23",
    ),
    (
        "A garden has 8 rows with 10 plants in each row. "
        "Then 3 more rows of 10 plants are added. "
        "How many plants are there in total?",
        "110",
    ),
]
print(
    gen_meta_prompt(
        history,
        problems,
        optimizer_family="gpt",
        instruction_pos="Q_begin",
        include_qa=False,
        score_threshold=0.0,
        max_num_instructions=20,
        num_score_buckets=100,
    )
)
