"""What the local journal's durable exclusive create costs, and what the variants would.

    python bench/journal_fsync.py [--dir DIR] [--slots N] [--rounds R] [--writers 1,4]
                                  [--bytes 1600,292000]

Each variant creates N slots (``--bytes`` each: an ``offsets`` slot of a 2,000-record poll is
about 1.6 kB, a ``records`` slot about 292 kB) in a directory of its own under ``--dir``
(default: a temp dir, where ``bench/run.py`` puts its journals), with ``--writers`` threads
at once (one directory each, as four tasks write four partition logs); variants alternate
within a round; the medians of the per-slot times are printed. Variants:

``fsync+dir``      what ``LocalStore.create_exclusive`` does: a temp file, write, fsync, link,
                   unlink, fsync the directory;
``fdatasync+dir``  the same with ``fdatasync`` for the file;
``tmpfile+dir``    ``O_TMPFILE`` (no named temp file to create and unlink), write, fsync,
                   ``linkat``, fsync the directory (Linux; ext4, xfs, tmpfs);
``fsync``          no directory fsync (NOT durable: the link may be lost in a crash);
``none``           no fsync at all (``journalFsync=false``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

Create = Callable[[str, bytes], None]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(directory: str) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _named(sync: Callable[[int], None] | None, dir_sync: bool) -> Create:
    def create(path: str, data: bytes) -> None:
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            if sync is not None:
                sync(fd)
        finally:
            os.close(fd)
        os.link(tmp, path)
        os.unlink(tmp)
        if dir_sync:
            _fsync_dir(directory)
    return create


def _tmpfile(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
            # A directory fd makes CPython call linkat(AT_SYMLINK_FOLLOW), not link().
            os.link(f"/proc/self/fd/{fd}", os.path.basename(path), src_dir_fd=dfd,
                    dst_dir_fd=dfd, follow_symlinks=True)
        finally:
            os.close(fd)
        os.fsync(dfd)
    finally:
        os.close(dfd)


VARIANTS: dict[str, Create] = {
    "fsync+dir": _named(os.fsync, True),
    "fdatasync+dir": _named(os.fdatasync, True),
    "tmpfile+dir": _tmpfile,
    "fsync": _named(os.fsync, False),
    "none": _named(None, False),
}


def run_variant(create: Create, root: Path, *, slots: int, writers: int,
                payload: bytes) -> list[float]:
    """Seconds per slot of every writer."""
    times: list[float] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        directory = root / f"w{i}-{uuid.uuid4().hex[:8]}"
        directory.mkdir()
        mine = []
        for n in range(slots):
            t0 = time.perf_counter()
            create(str(directory / f"{n:06d}"), payload)
            mine.append(time.perf_counter() - t0)
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--slots", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writers", default="1,4")
    ap.add_argument("--bytes", default="1600,292000")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="journal-fsync-", dir=args.dir))
    try:
        measure(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def measure(base: Path, args: argparse.Namespace) -> None:
    names = [v for v in args.variants.split(",") if v]
    print(f"directory {base}; {args.slots} slots per writer, {args.rounds} rounds; "
          "ms per slot, medians over the rounds: median / mean / p90")
    for size in (int(b) for b in args.bytes.split(",")):
        payload = os.urandom(size)
        for writers in (int(w) for w in args.writers.split(",")):
            medians: dict[str, list[float]] = {n: [] for n in names}
            means: dict[str, list[float]] = {n: [] for n in names}
            p90s: dict[str, list[float]] = {n: [] for n in names}
            for rnd in range(args.rounds):
                for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                    root = base / f"{name}-{size}-{writers}-{rnd}"
                    root.mkdir()
                    times = sorted(run_variant(VARIANTS[name], root, slots=args.slots,
                                               writers=writers, payload=payload))
                    medians[name].append(statistics.median(times) * 1000)
                    means[name].append(statistics.fmean(times) * 1000)
                    p90s[name].append(times[int(len(times) * 0.9)] * 1000)
            row = "  ".join(f"{n} {statistics.median(medians[n]):.2f} / "
                            f"{statistics.median(means[n]):.2f} / "
                            f"{statistics.median(p90s[n]):.2f}" for n in names)
            print(f"{size:>7} B, {writers} writer(s): {row}", flush=True)


if __name__ == "__main__":
    main()
