"""The journal on a local or mounted filesystem: exclusive create is ``link(2)`` of a fully
written temporary file."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid

from pyspark_kafka_share.source.journal.stores.base import Store

__all__ = ["LocalStore"]


class LocalStore(Store):
    """A local or mounted (NFS, FUSE with atomic ``link``) filesystem."""

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a failed write (no space, EIO) leaves no temporary file
            raise
        os.close(fd)
        try:
            os.link(tmp, path)  # atomic; fails if path exists. Never creates the directory.
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if fsync:
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return True

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_head(self, path: str, size: int) -> bytes:
        with open(path, "rb") as f:
            return f.read(size)

    def write(self, path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def files_under(self, path: str) -> list[str]:
        # scandir, not os.walk + relpath: the duplicate lookup lists the open batches on every
        # poll (os.walk's relpath per directory was most of its time).
        found: list[str] = []
        todo = [(path, "")]
        while todo:
            directory, rel = todo.pop()
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue  # removed meanwhile (a committed batch); os.walk skips it too
            for entry in entries:
                name = f"{rel}{entry.name}"
                if not entry.is_dir():
                    found.append(name)
                elif not entry.is_symlink():  # as os.walk: not followed, not a file
                    todo.append((entry.path, f"{name}/"))
        return found

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def mtime(self, path: str) -> float:
        return os.stat(path).st_mtime

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def retire(self, path: str) -> str:
        target = os.path.join(os.path.dirname(path), f".gc-{uuid.uuid4().hex}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, target)
        return target

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def rmdir(self, path: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            os.rmdir(path)
