"""The demos print only their own lines; every log line goes to a file.

Spark's JVM writes its log4j lines and the JVM's own warnings (``WARNING: Using incubator
modules``) to its standard error, which it passes on to its Python workers; librdkafka's
default logger writes to standard error too. They all write to file descriptor 2, inherited
from this process, so :func:`logs_to_file` points descriptor 2 at a log file before anything
starts, and keeps ``sys.stderr`` (tracebacks, the package's own progress lines) on the
terminal. Python ``logging`` goes to the same file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

TAIL_LINES = 30


@contextlib.contextmanager
def logs_to_file(log: Path) -> Iterator[Path]:
    """Send descriptor 2 and Python logging to ``log`` (appending); on an error, print the
    log's last lines on the terminal, since they usually say what went wrong."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    terminal_fd = os.dup(2)
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    saved_stderr = sys.stderr
    sys.stderr = open(terminal_fd, "w", buffering=1, encoding="utf-8",  # noqa: SIM115
                      errors="backslashreplace")
    handler = logging.FileHandler(log, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield log
    except Exception:
        _print_tail(log)
        raise
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)
        handler.close()
        sys.stderr.flush()
        os.dup2(terminal_fd, 2)  # also closes the log on descriptor 2
        sys.stderr.close()  # closes terminal_fd
        sys.stderr = saved_stderr


def _print_tail(log: Path) -> None:
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
    except OSError:
        return
    if lines:
        print(f"--- the last {len(lines)} lines of {log} (client, Spark and broker logs):",
              file=sys.stderr)
        for line in lines:
            print(f"    {line}", file=sys.stderr)
        print("---", file=sys.stderr, flush=True)
