"""The child-process plumbing of the local harnesses (:mod:`.broker`, :mod:`.s3`, :mod:`.spark`).

Each harness owns child processes that must never outlive it:

- :func:`free_port` picks a port for a child to bind (below the ephemeral range, where no
  outgoing connection takes it), and :func:`start_on_free_ports` starts again on fresh ports
  when one was taken before the child bound it;

- :func:`spawn` starts a child in a session (process group) of its own that the kernel kills
  when this process dies (Linux ``PR_SET_PDEATHSIG``), from a thread that lives as long as
  the process;
- :class:`Harness` is their base (``with`` starts and stops one), and :func:`track` registers
  a started harness, so that interpreter exit and SIGTERM stop every live one (:func:`untrack`
  once it is stopped);
- :func:`make_workdir` creates a temporary directory that names its owner, after sweeping
  those of owners that died without cleaning up (SIGKILL skips all cleanup);
- :func:`end_process_groups` stops children (SIGTERM, then SIGKILL) or kills them, and reaps
  them;
- :func:`wait_ready` polls until a child answers, failing early, with its log tail, when the
  child exits.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pyspark_kafka_share.errors import LocalKafkaError

_T = TypeVar("_T")
_H = TypeVar("_H", bound="Harness")
_log = logging.getLogger(__name__)


# -- ports and pids ----------------------------------------------------------------------------


_PORT_FLOOR = 10_000  # ports below are left to services (and need no root above 1024)
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_HANDED: set[int] = set()  # every port free_port() handed out in this process
_PORTS_LOCK = threading.Lock()
_RANDOM = random.SystemRandom()  # not the random module's: a test's seed would align processes


def _ephemeral_floor() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default: 32768)."""
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that is free now, for a child to bind, and never one this
    process handed out before.

    It is drawn below the kernel's ephemeral range: the local port of every outgoing connection
    is taken from that range, so a port the OS picked there (bind to port 0, close) could be
    taken by any client's connection before the child binds it ("Address already in use",
    issue 37). Only a process binding a port on purpose can take one drawn here; a start that
    still loses its port is retried on fresh ones (:func:`start_on_free_ports`). Without room
    below that range, the OS picks."""
    floor = _ephemeral_floor()
    with _PORTS_LOCK:
        for _ in range(200):
            port = _RANDOM.randrange(_PORT_FLOOR, floor) if floor - _PORT_FLOOR >= 1_000 else 0
            if port in _HANDED:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue  # in use (or TIME_WAIT): draw again
                port = int(s.getsockname()[1])
            if port not in _HANDED:
                _HANDED.add(port)
                return port
    raise LocalKafkaError(f"no free TCP port on {host} in 200 draws")


BIND_ATTEMPTS = 3
"""How many times :func:`start_on_free_ports` starts a child whose port was taken."""
_BIND_FAILURE = re.compile(r"failed to bind to (\S+?): Address already in use")


def port_taken(log: str) -> str | None:
    """The address a child could not bind, from its ``log`` (Kafka's "Socket server failed to
    bind to 127.0.0.1:<port>: Address already in use."; ``"a port"`` when the line names
    none), or ``None``: no bind failure."""
    found = _BIND_FAILURE.search(log)
    if found is not None:
        return found.group(1)
    return "a port" if "Address already in use" in log else None


def start_on_free_ports(start: Callable[[], None], taken: Callable[[], str | None],
                        reset: Callable[[], None], what: str,
                        attempts: int = BIND_ATTEMPTS) -> None:
    """``start()`` (which picks its ports and starts the children); when it fails because
    a port was taken between its pick and the child's bind (``taken()``: the address, from
    the child's log; ``None``: another failure), ``reset()`` and start again on fresh ports,
    logged at WARNING, up to ``attempts`` starts in all. Any failure is ``reset()`` and
    raised; the last of ``attempts`` bind failures as a :class:`LocalKafkaError` that says
    so."""
    for attempt in range(1, attempts + 1):
        try:
            start()
            return
        except BaseException as exc:
            address = taken() if isinstance(exc, LocalKafkaError) else None
            reset()
            if address is None:
                raise
            if attempt == attempts:
                raise LocalKafkaError(
                    f"{what} could not bind its ports in {attempts} starts (the last time "
                    f"{address} was already in use): {exc}") from exc
            _log.warning("%s: %s was taken before it could bind it; starting again on fresh "
                         "ports (start %d of %d)", what, address, attempt + 1, attempts)


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (a zombie included), even one of another user."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- children that die with this process -------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In the child process: ask the kernel to SIGKILL it when its parent (thread) dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process: a
# child (re)started from a short-lived thread (say a timer rehearsing a broker outage) would be
# killed as soon as that thread returned. So children are forked by the main thread, or else
# by one daemon thread that lives as long as the process.
_SPAWN_QUEUE: queue.SimpleQueue[tuple[Sequence[str], dict[str, Any], Future[Any]]] | None = None
_SPAWN_LOCK = threading.Lock()


def _spawner() -> None:  # pragma: no cover - its effects are tested through spawn()
    assert _SPAWN_QUEUE is not None
    while True:
        argv, kwargs, future = _SPAWN_QUEUE.get()
        try:
            future.set_result(subprocess.Popen(argv, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)


def spawn(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``Popen(argv, start_new_session=True, preexec_fn=die-with-parent, **kwargs)`` from a
    long-lived thread, so that the kernel kills the child when this process dies, and only
    then."""
    global _SPAWN_QUEUE
    kwargs.update(start_new_session=True, preexec_fn=_die_with_parent)
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **kwargs)
    with _SPAWN_LOCK:
        if _SPAWN_QUEUE is None:
            _SPAWN_QUEUE = queue.SimpleQueue()
            threading.Thread(target=_spawner, name="localkafka-spawner", daemon=True).start()
    future: Future[subprocess.Popen[bytes]] = Future()
    _SPAWN_QUEUE.put((argv, kwargs, future))
    return future.result()


def end_process_groups(procs: Iterable[subprocess.Popen[bytes]], *, graceful: bool,
                       timeout_s: float = 15.0) -> None:
    """SIGTERM (then SIGKILL after ``timeout_s``) or SIGKILL the process group of each of
    ``procs`` (children of :func:`spawn` lead one each); reap them.

    All are signalled first, then waited for one by one.
    """
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)


# -- harnesses, and stopping every live one at exit -------------------------------------------


def started(value: _T | None, what: str) -> _T:
    """``value``, set by ``what``'s start(); :class:`LocalKafkaError` while it is ``None``."""
    if value is None:
        raise LocalKafkaError(f"{what} is not started; call start() or use 'with'")
    return value


class Harness:
    """Base of the harnesses: ``with harness:`` starts it, then stops it."""

    def start(self: _H) -> _H:
        """Start the child processes (idempotent); return ``self``."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the child processes and delete what they left (idempotent)."""
        raise NotImplementedError

    def __enter__(self: _H) -> _H:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# Every tracked harness, oldest first; exit stops the newest first. Not guarded by _HOOKS_LOCK:
# the SIGTERM handler stops (untracks) harnesses, maybe while the main thread holds that lock.
_LIVE: weakref.WeakKeyDictionary[Harness, None] = weakref.WeakKeyDictionary()
_HOOKS_LOCK = threading.Lock()
_ATEXIT_INSTALLED = False
_SIGTERM_INSTALLED = False


def _stop_all() -> None:
    for harness in reversed(list(_LIVE.keys())):
        with contextlib.suppress(Exception):
            harness.stop()


def _install_exit_hooks() -> None:
    """atexit once; the SIGTERM handler once, from the main thread (signal handlers must be)."""
    global _ATEXIT_INSTALLED, _SIGTERM_INSTALLED
    with _HOOKS_LOCK:
        if not _ATEXIT_INSTALLED:
            _ATEXIT_INSTALLED = True
            atexit.register(_stop_all)
        if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
            return
        _SIGTERM_INSTALLED = True
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: object) -> None:
            _stop_all()
            if callable(previous):
                previous(signum, frame)  # type: ignore[arg-type]
            else:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)


def track(harness: Harness) -> None:
    """Stop ``harness`` at interpreter exit and on SIGTERM (until :func:`untrack`)."""
    _install_exit_hooks()
    _LIVE[harness] = None


def untrack(harness: Harness) -> None:
    """Forget ``harness`` (it is stopped). Idempotent."""
    _LIVE.pop(harness, None)


# -- working directories that name their owner -------------------------------------------------


def sweep_orphaned_workdirs(prefix: str,
                            clean: Callable[[Path], object] | None = None) -> None:
    """Delete the temporary directories ``prefix*`` whose owner (``owner.pid``) is dead,
    after ``clean(directory)`` (say, killing what the owner left running)."""
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            owner = int((path / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if not pid_alive(owner):
            if clean is not None:
                clean(path)
            shutil.rmtree(path, ignore_errors=True)


def make_workdir(prefix: str, clean: Callable[[Path], object] | None = None) -> Path:
    """A new temporary directory ``prefix*`` holding ``owner.pid`` (this process), made after
    :func:`sweep_orphaned_workdirs` ``(prefix, clean)``."""
    sweep_orphaned_workdirs(prefix, clean)
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    (workdir / "owner.pid").write_text(str(os.getpid()))
    return workdir


# -- waiting until ready -----------------------------------------------------------------------


def log_tail(path: Path | None, chars: int, missing: str) -> str:
    """The last ``chars`` bytes of the log at ``path``, decoded; ``missing`` if there is none."""
    if path is None or not path.exists():
        return missing
    return path.read_bytes()[-chars:].decode("utf-8", errors="replace")


def wait_ready(
    probe: Callable[[], _T | None],
    deadline: float,
    *,
    interval_s: float,
    children: Callable[[], Iterable[tuple[str, subprocess.Popen[bytes]]]],
    exited: Callable[[str, int], str],
    timed_out: Callable[[BaseException | None], str],
    retry_on: tuple[type[BaseException], ...] = (Exception,),
) -> _T:
    """Call ``probe`` every ``interval_s`` until it returns a value other than ``None``, and
    return that.

    ``retry_on`` exceptions of the probe count as not ready (the last one goes to
    ``timed_out``). Raises :class:`LocalKafkaError` with ``exited(name, returncode)`` as soon
    as one of the named ``children`` has exited, and with ``timed_out(last error)`` at
    ``deadline`` (of ``time.monotonic()``).
    """
    last: BaseException | None = None
    while time.monotonic() < deadline:
        for name, proc in children():
            if proc.poll() is not None:
                raise LocalKafkaError(exited(name, proc.returncode))
        try:
            result = probe()
        except retry_on as exc:
            last = exc
        else:
            if result is not None:
                return result
        time.sleep(interval_s)
    raise LocalKafkaError(timed_out(last))
