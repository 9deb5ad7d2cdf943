"""The errors an OPRO run raises, and the classification of what a model call or a program run raised.

Every failure of a run falls into one of four classes, decided here from the exception's type (and the types in its
``__cause__`` chain), never from its message alone:

* ``fatal``: no retry can fix it: authentication (401), permission (403), an unknown model (404), billing, missing
  credentials, an unknown provider or another configuration error. DSPy 3.3 and later raise ``LMAuthError``,
  ``LMUnsupportedModelError``, ``LMBillingError`` and ``LMConfigurationError`` (``LMNotConfiguredError`` for a
  missing key on its native engine) for most of them, DSPy 3.1 and 3.2 LiteLLM's own exceptions
  (:func:`dspy_opro.compat.lm_error_kind` reads both). Two reach DSPy 3.4.1 misfiled, as probed here: through
  LiteLLM, a missing OpenAI key is the OpenAI client's bare ``openai.OpenAIError`` (raised before any request),
  which LiteLLM wraps into ``InternalServerError`` and DSPy into the retryable ``LMServerError``; and a model
  string without a known provider ("not-a-real-model") is LiteLLM's ``BadRequestError`` with an empty
  ``llm_provider``, which DSPy files as ``LMInvalidRequestError``. Both are fatal here.
* ``infra``: a transport or provider failure that a later try may not meet (rate limit, server error, timeout,
  connection, a malformed or empty reply); retried once, then the example is left unscored.
* ``failed``: anything else the program raised (a parse failure of the model's output, a bug in ``forward``); the
  run scores ``failure_score`` and the error is recorded on the candidate.

:func:`check_model_ready` finds the two misfiled fatal cases before the first call, so a run with a missing key or
a bad model string stops at once instead of after LiteLLM's retry loop.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any, Literal

from dspy_opro.compat import lm_engine, lm_error_kind

logger = logging.getLogger(__name__)

FailureClass = Literal["infra", "fatal", "failed"]


class OPRORunError(RuntimeError):
    """An error that stops an OPRO run (state is saved first when a ``log_dir`` is set)."""


class MetricError(OPRORunError, ValueError):
    """The metric raised, or returned something that is not a score in [0, 1]."""


class FatalLMError(OPRORunError):
    """Authentication, permission, billing or configuration failure of a model: retrying cannot help."""


class OptimizerUnavailableError(OPRORunError):
    """No call to the optimizer model succeeded in the whole run (every one failed after its retry)."""


class ProgramError(OPRORunError):
    """The program as given raised on every training example, so no instruction can be compared."""


class LogDirError(OPRORunError, ValueError):
    """``log_dir`` cannot hold the run record (a file, not writable, or the disk is full)."""


class EmptyResponseError(RuntimeError):
    """The model answered with no choices at all."""


class StateFileError(RuntimeError):
    """The state file under ``log_dir`` cannot be read or does not belong to this run."""


class RunInProgressError(RuntimeError):
    """Another process (or another compile in this one) is running an OPRO run in the same ``log_dir``."""


def _cause_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 16 and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _is_unknown_provider(exc: BaseException) -> bool:
    """LiteLLM's ``BadRequestError`` for a model string whose provider it cannot tell (``llm_provider == ""``)."""
    return (type(exc).__name__ == "BadRequestError" and type(exc).__module__.startswith("litellm")
            and getattr(exc, "llm_provider", None) == "")


def classify_exception(exc: BaseException) -> FailureClass:
    """Sort an exception raised by a program, a metric or a model call into OPRO's failure classes."""
    if isinstance(exc, FatalLMError):
        return "fatal"
    kind = lm_error_kind(exc)
    # The OpenAI client's bare ``OpenAIError`` is missing credentials, raised before any request is sent (openai not
    # imported: the error cannot be one of its, and importing it takes seconds).
    bare_openai = getattr(sys.modules.get("openai"), "OpenAIError", None)
    if kind == "fatal" or any(type(e) is bare_openai or _is_unknown_provider(e) for e in _cause_chain(exc)):
        return "fatal"
    if kind == "context_window":
        return "failed"  # this example is too long for the model; others may not be
    if kind == "infra" or isinstance(exc, EmptyResponseError):
        return "infra"
    return "failed"


# A 400 that names the request's n (or its choices): "n must be <= 4", "Only one completion choice is allowed".
_NAMES_N = re.compile(r"(?<![\w.\-])n(?![\w\-]|'t)|\bn_choices\b|\bchoices?\b", re.IGNORECASE)


def rejects_n(exc: BaseException) -> bool:
    """Whether a model call was refused because of its ``n`` (several choices): an HTTP 400 whose message names it.

    llama.cpp's ``llama-server`` answers ``n`` above its slot count with a 400; DSPy raises it as
    ``LMInvalidRequestError`` (status 400). Other 400s (a bad parameter, a prompt too long) are not this.
    """
    return any(((getattr(e, "status", None) or getattr(e, "status_code", None)) == 400
                or type(e).__name__ in ("LMInvalidRequestError", "BadRequestError"))
               and lm_error_kind(e) != "context_window" and _NAMES_N.search(str(e)) is not None
               for e in _cause_chain(exc))


def clean_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD, so it can be encoded as UTF-8 (NUL is kept: JSON escapes it).

    A provider's JSON may escape half of a surrogate pair (``"\\ud800"``); Python decodes it into a string that
    cannot be written as UTF-8, hashed, or saved. Every model or exception text is cleaned before it enters the
    run record.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` on one line, cleaned of lone surrogates."""
    return clean_text(f"{type(exc).__name__}: {exc}")


def fatal_lm_error(role: str, model: str, exc: BaseException) -> FatalLMError:
    """The error that stops a run on a fatal failure of the ``role`` model (optimizer, task, judge)."""
    return FatalLMError(
        f"the {role} model {model!r} failed in a way no retry can fix: {describe_exception(exc)}. "
        "Check its API key (or environment variable), permissions, billing and model name.")


def check_model_ready(lm: Any, role: str) -> None:
    """Raise ``FatalLMError`` before any call when a LiteLLM model cannot work: unknown provider, missing key.

    Only ``dspy.LM`` objects on the LiteLLM engine are checked; other LMs (custom engines, DSPy's native engine,
    which raises ``LMNotConfiguredError`` at once) are left to their first call.

    Args:
        lm: The model to check.
        role: ``"optimizer"``, ``"task"`` or ``"judge"``: named in the error.
    """
    if lm_engine(lm) != "litellm":
        return
    model, kwargs = getattr(lm, "model", ""), getattr(lm, "kwargs", {}) or {}
    import litellm

    try:
        litellm.get_llm_provider(model, api_base=kwargs.get("api_base"))
    except Exception as exc:
        if _is_unknown_provider(exc):
            raise FatalLMError(
                f"the {role} model {model!r} names no provider LiteLLM knows. Write it as 'provider/model', for "
                "example 'openai/gpt-4o-mini' (see https://docs.litellm.ai/docs/providers)") from exc
        raise
    if any(("key" in name or "token" in name or "credential" in name) and value for name, value in kwargs.items()):
        return  # credentials passed to dspy.LM
    provider = model.split("/", 1)[0] if "/" in model else "openai"
    if kwargs.get("api_base") and provider != "openai":
        return  # a self-hosted server may need no key; the OpenAI client always does
    try:
        report = litellm.validate_environment(model=model)
    except Exception:  # an unusual provider LiteLLM cannot check: leave it to the first call
        return
    missing = [] if report.get("keys_in_environment") else report.get("missing_keys") or []
    keys = [key for key in missing if key.endswith("_API_KEY") and not os.environ.get(key)]
    if keys:
        raise FatalLMError(
            f"the {role} model {model!r} has no API key: set {' or '.join(keys)} in the environment, or pass "
            f"api_key=... to dspy.LM({model!r}, ...)")


__all__ = ["EmptyResponseError", "FatalLMError", "LogDirError", "MetricError", "OPRORunError",
           "OptimizerUnavailableError", "ProgramError", "check_model_ready", "classify_exception", "clean_text",
           "describe_exception", "fatal_lm_error", "rejects_n"]
