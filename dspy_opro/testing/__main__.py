"""The command line of the simulated endpoint: ``python -m dspy_opro.testing --port 8765 --latency 0.05``.

Prints ``listening on http://127.0.0.1:8765/v1`` and serves until Ctrl-C or SIGTERM, then prints how many requests
it answered to stderr; every fault of :class:`~dspy_opro.testing.faults.FaultConfig` has a flag.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from dspy_opro.testing.faults import FAULT_KINDS, FaultConfig
from dspy_opro.testing.server import SimulatedEndpoint

__all__ = ["main"]


def _latency_arg(text: str) -> float | tuple[float, float]:
    if "," in text:
        low, high = text.split(",", 1)
        return float(low), float(high)
    return float(text)


def main(argv: list[str] | None = None) -> int:
    """Serve the simulated endpoint as ``argv`` (default: the process's arguments) asks, until SIGTERM or SIGINT.

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(
        prog="python -m dspy_opro.testing", description="Serve the simulated OpenAI-compatible model."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency", type=_latency_arg, default=0.0, help="seconds, or LOW,HIGH")
    parser.add_argument("--rate-limit", type=float, default=0.0)
    parser.add_argument("--retry-after", type=float, default=0.0)
    parser.add_argument("--server-error", type=float, default=0.0)
    parser.add_argument("--hang", type=float, default=0.0)
    parser.add_argument("--hang-seconds", type=float, default=30.0)
    parser.add_argument("--malformed", type=float, default=0.0)
    parser.add_argument("--empty-choices", type=float, default=0.0)
    parser.add_argument("--auth-error", action="store_true")
    parser.add_argument("--only-kinds", default=None, help="comma-separated kinds")
    parser.add_argument("--first-n", type=int, default=None)
    parser.add_argument("--fail-requests", default=None, help="comma-separated request indices")
    parser.add_argument("--fail-kind", default="server_error", choices=FAULT_KINDS)
    args = parser.parse_args(argv)

    faults = FaultConfig(
        rate_limit=args.rate_limit,
        retry_after=args.retry_after,
        server_error=args.server_error,
        hang=args.hang,
        hang_seconds=args.hang_seconds,
        malformed=args.malformed,
        empty_choices=args.empty_choices,
        auth_error=args.auth_error,
        only_kinds=set(args.only_kinds.split(",")) if args.only_kinds else None,
        first_n=args.first_n,
        fail_requests={int(i) for i in args.fail_requests.split(",")} if args.fail_requests else None,
        fail_kind=args.fail_kind,
    )
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    endpoint = SimulatedEndpoint(latency=args.latency, faults=faults, seed=args.seed, host=args.host, port=args.port)
    endpoint.start()
    try:
        print(f"listening on {endpoint.base_url}", flush=True)
        while not done.wait(0.5):
            pass
    finally:
        endpoint.stop()
    print(f"stopped after {endpoint.count(status=None)} requests", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
