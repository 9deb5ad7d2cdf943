"""Command line of dspy-opro.

    python -m dspy_opro report LOG_DIR [--no-plot]
    python -m dspy_opro --version

``report`` rebuilds ``LOG_DIR/report.md`` and, with matplotlib installed, ``LOG_DIR/trajectory.png`` from
``LOG_DIR/state.json`` (a finished, stopped or still running OPRO run) and prints the paths written. A record that
says ``running`` while no process holds the run's lock was left by a process that died (``kill -9``, a crash): the
report says the run stopped without finishing and how to resume. A missing or unreadable state file is reported on
stderr with exit status 2. ``--version`` prints the package version.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dspy_opro import __version__
from dspy_opro.errors import StateFileError
from dspy_opro.record.files import LOCK_FILE, STATE_FILE, load_state, lock_is_held
from dspy_opro.record.report import PLOT_INSTALL_HINT, TRAJECTORY_FILE, write_run_report

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2  # EXIT_USAGE also: no usable state file


def _report(args: argparse.Namespace) -> int:
    log_dir: Path = args.log_dir
    try:
        state = load_state(log_dir)
        if state is None:
            raise StateFileError(f"{log_dir / STATE_FILE} does not exist; LOG_DIR must be the log_dir of an OPRO run.")
    except StateFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if state.status == "running" and lock_is_held(log_dir) is False:
        # The record cannot say so itself: its process died before it could write an end.
        state = state.model_copy(update={"status": "interrupted", "stop_reason": (
            f"the process stopped without finishing (killed or crashed: no process holds {LOCK_FILE})")})
        print(f"note: the run in {log_dir} stopped without finishing; compile again with the same log_dir to resume",
              file=sys.stderr)
    try:
        written = write_run_report(state, log_dir, plot=not args.no_plot)
    except OSError as exc:
        print(f"error: cannot write the report in {log_dir}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    for path in written:
        print(path)
    if not args.no_plot and not any(path.name == TRAJECTORY_FILE for path in written):
        print(f"note: {TRAJECTORY_FILE} not drawn, matplotlib is not installed ({PLOT_INSTALL_HINT})", file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    prog = "python -m dspy_opro" if Path(sys.argv[0]).name == "__main__.py" else "dspy-opro"
    parser = argparse.ArgumentParser(prog=prog, description="Tools for OPRO runs recorded by dspy-opro (the log_dir "
                                     "of a compile).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    report = commands.add_parser(
        "report", help="rewrite report.md and trajectory.png of a run from its state.json",
        description=f"Rewrite LOG_DIR/report.md and, with matplotlib installed, LOG_DIR/{TRAJECTORY_FILE} "
        f"from LOG_DIR/{STATE_FILE}.")
    report.add_argument("log_dir", metavar="LOG_DIR", type=Path, help="the log_dir given to OPRO's compile")
    report.add_argument("--no-plot", action="store_true", help=f"do not draw {TRAJECTORY_FILE}")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    return _report(args)  # the one command


if __name__ == "__main__":
    sys.exit(main())
