"""Fault injection for the simulated endpoint: which requests fail, and how, decided deterministically.

:class:`FaultConfig` holds the shares of random faults (429 with Retry-After, 500, hangs, malformed JSON, empty
choices) and the request indices that get a chosen fault; :meth:`FaultConfig.choose` decides one request's fault
from the endpoint's seed and the request index, so a run repeats exactly. :data:`REFUSALS` are the faults no retry
can fix, with OpenAI's status and error body. The endpoint (:mod:`dspy_opro.testing.server`) acts on the choice.

It also holds the behaviours of real local servers, seen when a small model was served by llama.cpp: a 400 for an
``n`` above the server's slot count (``n_cap``, llama.cpp's ``llama-server``), one choice whatever ``n`` asked for
(``ignore_n``, llama-cpp-python's server), ``usage`` counting the first choice only (``usage_first_choice_only``,
``llama-server`` with ``n > 1``), OPRO replies whose closing tag never comes (``unclosed_tags``, a 135M model),
slow generation (``seconds_per_token``), and a 200 whose body is cut short (``fail_kind="truncated_body"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dspy_opro.testing.hashing import stable_unit

__all__ = ["FAULT_KINDS", "N_CAP_MESSAGE", "REFUSALS", "FaultConfig"]

FAULT_KINDS = (
    "rate_limit",
    "server_error",
    "malformed",
    "empty_choices",
    "hang",
    "auth_error",
    "permission_denied",
    "model_not_found",
    "one_choice",
    "odd_text",
    "invalid_utf8",
    "truncated_body",
    "malformed_usage",
    "null_content",
    "no_usage",
    "negative_usage",
)
# Refusals no retry can fix, with OpenAI's status and error body: (status, message, type, code).
REFUSALS = {
    "auth_error": (
        401,
        "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    "permission_denied": (
        403,
        "You are not allowed to use this model (simulated).",
        "invalid_request_error",
        "model_not_allowed",
    ),
    "model_not_found": (
        404,
        "The model does not exist or you do not have access to it (simulated).",
        "invalid_request_error",
        "model_not_found",
    ),
}
# The 400 a server that caps n sends for a request above its cap (simulated; llama.cpp's llama-server rejects n above
# its slot count with an OpenAI-style error body of this shape).
N_CAP_MESSAGE = "n must be <= {cap} (the server's slots), got n = {n} (simulated llama-server error)"


@dataclass
class FaultConfig:
    """Which requests fail, and how.

    The shares ``rate_limit``, ``server_error``, ``hang``, ``malformed`` and ``empty_choices`` are drawn with one
    deterministic uniform number per request (from the endpoint's seed and the request index), so they are
    exclusive and their sum must not exceed 1.

    Attributes:
        rate_limit: Share of requests answered 429 with ``Retry-After: <retry_after>`` and OpenAI's
            ``rate_limit_exceeded`` error body.
        retry_after: Seconds sent in the Retry-After header.
        server_error: Share of requests answered 500.
        hang: Share of requests that wait ``hang_seconds`` before answering normally. The wait ends at once when
            the endpoint stops; the connection is then closed without an answer.
        hang_seconds: How long a hanging request waits.
        malformed: Share of 200 answers whose body is not valid JSON.
        empty_choices: Share of 200 answers with ``"choices": []``.
        auth_error: Answer every request 401 with OpenAI's ``invalid_api_key`` error body.
        only_kinds: Apply faults (random and ``fail_requests``) only to requests of these kinds (``task``,
            ``opro``, ``judge``, ``unknown``, or a kind the endpoint's responders claim requests as).
        first_n: Apply the random faults only to requests with index < first_n.
        fail_requests: Request indices (0-based, counted since the start or the last ``reset_log()``) that get
            ``fail_kind``.
        fail_kind: One of ``rate_limit``, ``server_error``, ``malformed``, ``empty_choices``, ``hang``, or (only
            through ``fail_requests``) ``auth_error`` (401), ``permission_denied`` (403), ``model_not_found`` (404)
            and ``one_choice`` (a 200 answer with a single choice whatever ``n`` asked for, as providers that
            ignore ``n`` do), ``odd_text`` (each choice ends in an escaped lone surrogate and a NUL),
            ``invalid_utf8`` (each choice ends in two raw bytes that are not UTF-8), ``malformed_usage`` (a 200 body
            that is not JSON as a whole: its ``usage`` object arrives, its choices break off) and ``truncated_body``
            (a 200 whose ``Content-Length`` is the whole answer's but whose connection closes after half of it), and
            ``null_content`` (a 200 whose every choice has ``"content": null``, as a refusal or a tool call has),
            ``no_usage`` (a 200 without ``usage``, as some OpenAI-compatible servers send) and ``negative_usage`` (a
            200 whose ``usage`` counts -1000 prompt and -100 completion tokens, as a broken proxy may).
        n_cap: Answer a request whose ``n`` is above this with HTTP 400 and an OpenAI-style error body naming ``n``
            (``N_CAP_MESSAGE``), as llama.cpp's ``llama-server`` does above its slot count. None: no cap.
        ignore_n: Answer every request with one choice whatever ``n`` asked for, as llama-cpp-python's server does.
        usage_first_choice_only: When ``n > 1``, ``usage.completion_tokens`` counts the first choice only (a
            ``llama-server`` bug); the request log keeps the tokens truly served (``completion_tokens``) beside
            what ``usage`` said (``reported_completion_tokens``).
        unclosed_tags: Share of OPRO replies (drawn per request and choice) whose closing tag (``</INS>``,
            ``</Start>``, ``]``, ``</TEXT>``) never comes: the reply goes on with the model's musings, as a 135M model
            writes. Also limited by ``only_kinds`` and ``first_n``.
        seconds_per_token: Generation time: each answer waits this long per completion token it sends (slow
            generation on a CPU), on top of ``latency``; interrupted at once when the endpoint stops.
    """

    rate_limit: float = 0.0
    retry_after: float = 0.0
    server_error: float = 0.0
    hang: float = 0.0
    hang_seconds: float = 30.0
    malformed: float = 0.0
    empty_choices: float = 0.0
    auth_error: bool = False
    only_kinds: set[str] | None = None
    first_n: int | None = None
    fail_requests: set[int] | None = None
    fail_kind: str = "server_error"
    n_cap: int | None = None
    ignore_n: bool = False
    usage_first_choice_only: bool = False
    unclosed_tags: float = 0.0
    seconds_per_token: float = 0.0

    def __post_init__(self) -> None:
        shares = (self.rate_limit, self.server_error, self.hang, self.malformed, self.empty_choices)
        if any(share < 0 or share > 1 for share in shares) or sum(shares) > 1 + 1e-9:
            raise ValueError("fault shares must lie in [0, 1] and sum to at most 1")
        if self.fail_kind not in FAULT_KINDS:
            raise ValueError(f"fail_kind must be one of {FAULT_KINDS}, got {self.fail_kind!r}")
        if self.retry_after < 0 or self.hang_seconds < 0:
            raise ValueError("retry_after and hang_seconds must be non-negative")
        if self.n_cap is not None and (isinstance(self.n_cap, bool) or self.n_cap < 1):
            raise ValueError(f"n_cap must be a positive integer or None, got {self.n_cap!r}")
        if not 0 <= self.unclosed_tags <= 1:
            raise ValueError(f"unclosed_tags must lie in [0, 1], got {self.unclosed_tags!r}")
        if self.seconds_per_token < 0:
            raise ValueError(f"seconds_per_token must be non-negative, got {self.seconds_per_token!r}")
        if self.only_kinds is not None:
            self.only_kinds = set(self.only_kinds)
        if self.fail_requests is not None:
            self.fail_requests = set(self.fail_requests)

    def choose(self, index: int, kind: str, seed: int) -> str | None:
        """The fault for request ``index`` of ``kind`` (None for a normal answer); ``auth_error`` not included."""
        if self.only_kinds is not None and kind not in self.only_kinds:
            return None
        if self.fail_requests is not None and index in self.fail_requests:
            return self.fail_kind
        if self.first_n is not None and index >= self.first_n:
            return None
        u = stable_unit("fault", seed, index)
        for name, share in (
            ("rate_limit", self.rate_limit),
            ("server_error", self.server_error),
            ("hang", self.hang),
            ("malformed", self.malformed),
            ("empty_choices", self.empty_choices),
        ):
            if u < share:
                return name
            u -= share
        return None

    def leaves_unclosed(self, index: int, kind: str, seed: int, choice: int) -> bool:
        """Whether choice ``choice`` of request ``index`` (an OPRO reply) leaves its closing tag out."""
        if kind != "opro" or self.unclosed_tags <= 0:
            return False
        if self.only_kinds is not None and kind not in self.only_kinds:
            return False
        if self.first_n is not None and index >= self.first_n:
            return False
        return stable_unit("unclosed", seed, index, choice) < self.unclosed_tags
