"""Spark for development, tests and benchmarks: one SparkSession builder and a local cluster.

- :func:`local_spark` builds the SparkSession the tests, the benchmarks and the cluster tier
  use (Python workers run this interpreter, so they import the installed package).
- :class:`LocalSparkCluster` runs a real Spark **standalone** cluster on this machine: one
  master and (by default) two workers, each with one core and its own executor JVM, started
  from the ``pyspark`` package's own launcher (``bin/spark-class``)::

      from pyspark_kafka_share.harness import LocalSparkCluster

      with LocalSparkCluster() as cluster:
          spark = cluster.session("my-app")          # executors on both workers
          ...
          cluster.kill_executor(0)                   # SIGKILL worker 0's executor JVM
          spark.stop()

Like :class:`~pyspark_kafka_share.harness.LocalKafka`, the cluster listens on loopback
addresses only and on free ports, keeps its logs in a temporary directory, and never outlives
its owner: :meth:`LocalSparkCluster.stop` (also run by the context manager, at interpreter exit
and on SIGTERM) stops every JVM it started, including the executors, and on Linux the kernel
kills the master and workers if the owning process dies (``PR_SET_PDEATHSIG``); executors
then exit because their worker is gone, and the next start sweeps anything left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share.errors import LocalKafkaError
from pyspark_kafka_share.harness import _process
from pyspark_kafka_share.harness.jars import require_tool

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ExecutorProcess", "LocalSparkCluster", "local_spark"]

SPARK_DEFAULTS: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.python.worker.reuse": "true",
    "spark.driver.memory": "2g",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}
"""What :func:`local_spark` sets unless ``conf`` says otherwise."""


def _conf_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def local_spark(master: str = "local[2, 4]", app_name: str = "pyspark-kafka-share", *,
                conf: Mapping[str, object] | None = None,
                log_level: str | None = "WARN") -> SparkSession:
    """The SparkSession of tests, benchmarks and the cluster tier.

    ``master`` defaults to ``local[2, 4]`` (2 task slots, 4 attempts per task). Python workers
    (``PYSPARK_PYTHON``) and the driver run this interpreter, so executors import the installed
    package. :data:`SPARK_DEFAULTS` apply (UI off, no console progress bar, 2 shuffle
    partitions, reused Python workers, a 2 GB driver); ``conf`` adds to or overrides them
    (``spark.driver.memory`` only counts when this call starts the driver JVM).

    Raises :class:`LocalKafkaError` when this process already runs a SparkContext with another
    master: ``getOrCreate`` would silently return that one.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkContext._active_spark_context
    if active is not None and active.master != master:
        raise LocalKafkaError(
            f"this process already runs a SparkContext with master {active.master!r}; stop it "
            f"before asking for {master!r} (one SparkContext per process)"
        )
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**SPARK_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, _conf_value(value))
    session = builder.getOrCreate()
    if log_level:
        session.sparkContext.setLogLevel(log_level)
    return session


# -- the standalone cluster --------------------------------------------------------------------

_WORKDIR_PREFIX = "localspark-"
_TAG = "-Dpyspark_kafka_share.localspark="
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    home = Path(_find_spark_home())
    if not (home / "bin" / "spark-class").exists():
        raise LocalKafkaError(f"{home}/bin/spark-class not found: is pyspark fully installed?")
    return home


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    args: tuple[str, ...]
    cwd: str


def _processes() -> list[_Proc]:
    """Every process this user can see (Linux ``/proc``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            args = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        out.append(_Proc(int(entry.name), ppid,
                         tuple(a.decode(errors="replace") for a in args if a), cwd))
    return out


def _belongs_to(proc: _Proc, workdir: Path) -> bool:
    """True for a JVM or Python worker of the cluster that ran in ``workdir``."""
    root = str(workdir)
    return (proc.cwd == root or proc.cwd.startswith(root + "/")
            or any(a == f"{_TAG}{root}" for a in proc.args))


def _kill_leftovers(workdir: Path) -> list[int]:
    killed = []
    me = os.getpid()
    for proc in _processes():
        if proc.pid != me and _belongs_to(proc, workdir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
                killed.append(proc.pid)
    return killed


def _arg_after(args: tuple[str, ...], flag: str) -> str:
    with contextlib.suppress(ValueError, IndexError):
        return args[args.index(flag) + 1]
    return ""


def _get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.load(resp)


@dataclass(frozen=True)
class ExecutorProcess:
    """One executor JVM (``CoarseGrainedExecutorBackend``) of a :class:`LocalSparkCluster`."""

    worker: int
    """Index of the cluster worker that launched it (0-based)."""
    pid: int
    executor_id: str
    """Spark's executor id, as in the Spark UI and the REST API."""
    app_id: str
    host: str


@dataclass(eq=False)
class LocalSparkCluster(_process.Harness):
    """A Spark standalone master and ``workers`` workers on this machine, for tests.

    Each worker offers ``cores_per_worker`` cores and ``worker_memory``, so an application
    (see :meth:`session`) gets one executor JVM per worker. Worker *i* listens on the loopback
    address ``127.0.0.{i+1}`` (Linux routes all of 127.0.0.0/8 to the loopback interface):
    Spark never launches a speculative copy of a task on a host where an attempt of it already
    ran, so executors on one address would never speculate. ``distinct_hosts=False`` puts
    everything on 127.0.0.1. The master is on 127.0.0.1.

    Logs: :attr:`log_dir` (``master.log``, ``worker-<i>.log``); executors' stdout/stderr are
    under :attr:`workdir` ``/work-<i>/<app id>/<executor id>/``. Everything is deleted by
    :meth:`stop`.

    Args:
        workers: number of workers (each launches one executor per application).
        cores_per_worker: cores each worker offers (``--cores``).
        worker_memory: memory each worker offers to executors (``--memory``).
        daemon_heap: ``-Xmx`` of the master and worker JVMs (``SPARK_DAEMON_MEMORY``).
        distinct_hosts: one loopback address per worker (needed for speculative execution).
        start_timeout_s: how long :meth:`start` waits for the master and all workers.
    """

    workers: int = 2
    cores_per_worker: int = 1
    worker_memory: str = "1g"
    daemon_heap: str = "256m"
    distinct_hosts: bool = True
    start_timeout_s: float = 180.0

    _master: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _workers: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False,
                                                    repr=False)
    _workdir: Path | None = field(default=None, init=False, repr=False)
    _master_port: int = field(default=0, init=False, repr=False)
    _master_ui_port: int = field(default=0, init=False, repr=False)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: the master to give a SparkSession."""
        self._require_started()
        return f"spark://127.0.0.1:{self._master_port}"

    @property
    def master_ui_url(self) -> str:
        """The master's web UI (``/json/`` there is its state as JSON)."""
        self._require_started()
        return f"http://127.0.0.1:{self._master_ui_port}"

    @property
    def workdir(self) -> Path:
        """The cluster's temporary directory (logs, work dirs); deleted by :meth:`stop`."""
        return _process.started(self._workdir, "the Spark cluster")

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def hosts(self) -> list[str]:
        """The address of each worker (and of its executors)."""
        return [f"127.0.0.{i + 1}" if self.distinct_hosts else "127.0.0.1"
                for i in range(self.workers)]

    def _require_started(self) -> None:
        _process.started(self._master, "the Spark cluster")

    def start(self) -> LocalSparkCluster:
        """Start the master and the workers; wait until the master lists every worker ALIVE.

        Idempotent. Raises :class:`LocalKafkaError` (with the log tails) on failure.
        """
        if self._master is not None:
            return self
        if self.workers < 1 or self.cores_per_worker < 1:
            raise LocalKafkaError("a LocalSparkCluster needs at least one worker with one core")
        require_tool("java", "Spark runs in a Java 17+ JVM")
        spark_class = str(_spark_home() / "bin" / "spark-class")
        # Kill what clusters of owners killed with SIGKILL left behind, and delete their dirs.
        workdir = _process.make_workdir(_WORKDIR_PREFIX, _kill_leftovers)
        (workdir / "logs").mkdir()
        (workdir / "conf").mkdir()  # an empty SPARK_CONF_DIR: no user defaults leak in
        self._workdir = workdir
        _process.track(self)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            self._master_port = _process.free_port("127.0.0.1")
            self._master_ui_port = _process.free_port("127.0.0.1")
            self._master = self._launch(
                spark_class, "master", "127.0.0.1",
                ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(self._master_port), "--webui-port", str(self._master_ui_port)],
                {"SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"},
            )
            self._wait(deadline, "the master to answer", self._master_alive)
            for i, host in enumerate(self.hosts):
                work = workdir / f"work-{i}"
                work.mkdir()
                self._workers.append(self._launch(
                    spark_class, f"worker-{i}", host,
                    ["org.apache.spark.deploy.worker.Worker", self.master_url,
                     "--host", host, "--port", str(_process.free_port(host)),
                     "--webui-port", str(_process.free_port(host)),
                     "--cores", str(self.cores_per_worker), "--memory", self.worker_memory,
                     "--work-dir", str(work)],
                    {"SPARK_WORKER_DIR": str(work)},
                ))
            self._wait(deadline, f"{self.workers} workers to register",
                       lambda: self.alive_workers() == sorted(self.hosts))
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, spark_class: str, name: str, host: str, args: list[str],
                extra_env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        workdir = self.workdir
        env = {
            **os.environ,
            "SPARK_HOME": str(Path(spark_class).parent.parent),
            "SPARK_CONF_DIR": str(workdir / "conf"),
            "SPARK_LOG_DIR": str(workdir / "logs"),
            "SPARK_LOCAL_IP": host,
            "SPARK_DAEMON_MEMORY": self.daemon_heap,
            # The tag lets stop() and a later sweep find this cluster's JVMs.
            "SPARK_DAEMON_JAVA_OPTS": f"{_TAG}{workdir} -XX:+UseSerialGC",
            "PYSPARK_PYTHON": sys.executable,
            **extra_env,
        }
        for var in ("SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "SPARK_WORKER_CORES",
                    "SPARK_WORKER_MEMORY", "SPARK_WORKER_OPTS", "SPARK_PUBLIC_DNS"):
            if var not in extra_env:
                env.pop(var, None)
        log = open(workdir / "logs" / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
        try:
            # spark-class execs the JVM: the pid is the JVM's, and PDEATHSIG carries over.
            return _process.spawn([spark_class, *args], stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env, cwd=str(workdir))
        finally:
            log.close()

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        def tails() -> str:
            return "\n".join(f"--- {name}:\n{self.log_tail(name, 1500)}"
                             for name, _ in self._named_procs())

        _process.wait_ready(
            lambda: ready() or None, deadline, interval_s=0.3, children=self._named_procs,
            exited=lambda name, code: (f"the Spark {name} exited with code {code} while waiting "
                                       f"for {what}; log tail:\n{self.log_tail(name)}"),
            timed_out=lambda last: (f"timed out after {self.start_timeout_s:.0f}s waiting for "
                                    f"{what} (last error: {last}); log tails:\n{tails()}"),
        )

    def _named_procs(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        procs = [] if self._master is None else [("master", self._master)]
        return procs + [(f"worker-{i}", p) for i, p in enumerate(self._workers)]

    def _master_alive(self) -> bool:
        return bool(self.master_state().get("status") == "ALIVE")

    def master_state(self) -> dict[str, Any]:
        """The master's state as its web UI serves it at ``/json/`` (workers, apps, cores)."""
        state: dict[str, Any] = _get_json(f"{self.master_ui_url}/json/")
        return state

    def alive_workers(self) -> list[str]:
        """Hosts of the workers the master lists as ALIVE, sorted."""
        return sorted(str(w["host"]) for w in self.master_state().get("workers", [])
                      if w.get("state") == "ALIVE")

    def log_tail(self, name: str = "master", chars: int = 4000) -> str:
        """The end of ``master`` 's or ``worker-<i>`` 's log."""
        if self._workdir is None:
            return "(no log: the cluster is stopped)"
        path = self._workdir / "logs" / f"{name}.log"
        return _process.log_tail(path, chars, f"(no log at {path})")

    def stop(self) -> None:
        """Stop the workers (and so their executors) and the master; kill whatever is left
        (SIGTERM, then SIGKILL after 15 s); delete the logs and work dirs. Idempotent."""
        procs = [p for _, p in self._named_procs()]
        workers, self._workers = self._workers, []
        master, self._master = self._master, None
        for group in (workers, [master] if master is not None else []):
            _process.end_process_groups(group, graceful=True)
        for proc in procs:  # executors share their worker's process group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        _process.untrack(self)
        workdir, self._workdir = self._workdir, None
        if workdir is not None:
            _kill_leftovers(workdir)
            shutil.rmtree(workdir, ignore_errors=True)

    # -- applications and executors --------------------------------------------------------

    def session(self, app_name: str = "pyspark-kafka-share-cluster", *,
                conf: Mapping[str, object] | None = None, log_level: str | None = "WARN",
                executors_timeout_s: float = 120.0) -> SparkSession:
        """A SparkSession (:func:`local_spark`) on this cluster, once every worker runs one of
        its executors.

        The driver binds to 127.0.0.1 and its UI (with the REST API used by :meth:`app_api`)
        is on a free port. Executors get 512 MB and ``cores_per_worker`` cores; the driver
        1 GB. ``conf`` adds to or overrides these.
        """
        # The driver's UI and ports bind to SPARK_LOCAL_IP (all interfaces without it).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings: dict[str, object] = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": "1g",
            "spark.executor.memory": "512m",
            "spark.executor.cores": self.cores_per_worker,
            "spark.cores.max": self.workers * self.cores_per_worker,
            "spark.ui.enabled": "true",
            "spark.ui.port": _process.free_port("127.0.0.1"),
            **(conf or {}),
        }
        spark = local_spark(self.master_url, app_name, conf=settings, log_level=log_level)
        try:
            self.wait_for_executors(spark, timeout_s=executors_timeout_s)
        except BaseException:
            spark.stop()
            raise
        return spark

    def app_api(self, spark: SparkSession, path: str = "") -> Any:
        """GET the driver's REST API for this application: ``/api/v1/applications/<id><path>``
        (e.g. ``/stages``, ``/allexecutors``). Needs ``spark.ui.enabled`` (set by
        :meth:`session`)."""
        sc = spark.sparkContext
        if not sc.uiWebUrl:
            raise LocalKafkaError("the driver's UI is off (spark.ui.enabled=false): no REST API")
        return _get_json(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}{path}")

    def wait_for_executors(self, spark: SparkSession, count: int | None = None, *,
                           timeout_s: float = 120.0) -> list[dict[str, Any]]:
        """Wait until the application has ``count`` (default: one per worker) active executors;
        return them as the REST API describes them."""
        want = self.workers if count is None else count
        deadline = time.monotonic() + timeout_s
        active: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                active = [e for e in self.app_api(spark, "/executors")
                          if e.get("id") != "driver" and e.get("isActive", True)]
                if len(active) >= want:
                    return active
            time.sleep(0.3)
        raise LocalKafkaError(
            f"only {len(active)} of {want} executors registered within {timeout_s:.0f}s; "
            f"master state: {self._short_state()}"
        )

    def _short_state(self) -> str:
        try:
            state = self.master_state()
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            return f"(master unreachable: {exc})"
        return json.dumps({"workers": [{k: w.get(k) for k in ("host", "state", "coresused")}
                                       for w in state.get("workers", [])],
                           "activeapps": [a.get("id") for a in state.get("activeapps", [])]})

    def executors(self) -> list[ExecutorProcess]:
        """The executor JVMs the workers run now (children of the worker JVMs)."""
        by_pid = {p.pid: i for i, p in enumerate(self._workers)}
        out = []
        for proc in _processes():
            worker = by_pid.get(proc.ppid)
            if worker is not None and _EXECUTOR_CLASS in proc.args:
                out.append(ExecutorProcess(
                    worker=worker, pid=proc.pid,
                    executor_id=_arg_after(proc.args, "--executor-id"),
                    app_id=_arg_after(proc.args, "--app-id"),
                    host=_arg_after(proc.args, "--hostname")))
        return sorted(out, key=lambda e: (e.worker, e.pid))

    def executor_of(self, pid: int) -> ExecutorProcess | None:
        """The executor JVM that ``pid`` is, or descends from (e.g. a Python worker)."""
        procs = {p.pid: p for p in _processes()}
        mine = {e.pid: e for e in self.executors()}
        seen = set()
        while pid in procs and pid not in seen:
            if pid in mine:
                return mine[pid]
            seen.add(pid)
            pid = procs[pid].ppid
        return None

    def kill_executor(self, worker: int, *, timeout_s: float = 60.0) -> ExecutorProcess:
        """SIGKILL the executor JVM of worker ``worker`` (waiting up to ``timeout_s`` for one
        to exist) and wait until it is gone. Its Python workers exit once their JVM is gone;
        the master then starts a replacement executor on that worker.
        """
        if not 0 <= worker < len(self._workers):
            raise LocalKafkaError(f"no worker {worker}: the cluster has {len(self._workers)}")
        deadline = time.monotonic() + timeout_s
        while True:
            found = [e for e in self.executors() if e.worker == worker]
            if found:
                break
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"worker {worker} runs no executor after {timeout_s:.0f}s")
            time.sleep(0.2)
        victim = found[0]
        os.kill(victim.pid, signal.SIGKILL)
        while _process.pid_alive(victim.pid) and time.monotonic() < deadline + 30:
            # The worker JVM reaps it; until then it is a zombie, which no longer runs.
            with contextlib.suppress(OSError):
                if (Path(f"/proc/{victim.pid}/stat").read_text()
                        .rsplit(")", 1)[1].split()[0] == "Z"):
                    break
            time.sleep(0.1)
        return victim
