"""Fault injection for the simulated endpoint: which requests fail, and how, decided deterministically.

:class:`FaultConfig` holds the shares of random faults (429 with Retry-After, 500, hangs, malformed JSON, empty
choices) and the request indices that get a chosen fault; :meth:`FaultConfig.choose` decides one request's fault
from the endpoint's seed and the request index, so a run repeats exactly. :data:`REFUSALS` are the faults no retry
can fix, with OpenAI's status and error body. The endpoint (:mod:`dspy_opro.testing.server`) acts on the choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspy_opro.testing.hashing import stable_unit

__all__ = ["FAULT_KINDS", "REFUSALS", "FaultConfig"]

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
            ignore ``n`` do), ``odd_text`` (each choice ends in an escaped lone surrogate and a NUL) and
            ``invalid_utf8`` (each choice ends in two raw bytes that are not UTF-8).
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

    def __post_init__(self) -> None:
        shares = (self.rate_limit, self.server_error, self.hang, self.malformed, self.empty_choices)
        if any(share < 0 or share > 1 for share in shares) or sum(shares) > 1 + 1e-9:
            raise ValueError("fault shares must lie in [0, 1] and sum to at most 1")
        if self.fail_kind not in FAULT_KINDS:
            raise ValueError(f"fail_kind must be one of {FAULT_KINDS}, got {self.fail_kind!r}")
        if self.retry_after < 0 or self.hang_seconds < 0:
            raise ValueError("retry_after and hang_seconds must be non-negative")
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
