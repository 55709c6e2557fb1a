"""The journal on HDFS (``hdfs://``, ``viewfs://``) through ``pyarrow.fs``: exclusive create is
HDFS ``rename``, which refuses an existing target."""

from __future__ import annotations

import contextlib
import os
import time
import uuid

from pyspark_kafka_share.source.journal.location import JournalLocation
from pyspark_kafka_share.source.journal.stores.base import Store

__all__ = ["ArrowFsStore"]


class ArrowFsStore(Store):  # pragma: no cover - needs a Hadoop cluster; see docs/design.md
    """HDFS through ``pyarrow.fs``: ``move`` is HDFS rename, which refuses an existing target."""

    def __init__(self, location: JournalLocation) -> None:
        from pyarrow import fs as pafs

        self.fs, _ = pafs.FileSystem.from_uri(location.uri)

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        tmp = f"{os.path.dirname(path)}/.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        try:
            self.fs.move(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                self.fs.delete_file(tmp)
            if self._exists(path):
                return False
            raise
        return True

    def _exists(self, path: str) -> bool:
        from pyarrow import fs as pafs

        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return bytes(f.read())

    def read_head(self, path: str, size: int) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return bytes(f.read(size))

    def write(self, path: str, data: bytes) -> None:
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def listdir(self, path: str) -> list[str]:
        from pyarrow import fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except FileNotFoundError:
            return []
        return [os.path.basename(i.path) for i in infos]

    def files_under(self, path: str) -> list[str]:
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        base = path.rstrip("/") + "/"
        return [i.path[len(base):] for i in self.fs.get_file_info(selector)
                if i.type == pafs.FileType.File and i.path.startswith(base)]

    def makedirs(self, path: str) -> None:
        self.fs.create_dir(path, recursive=True)

    def remove_tree(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_dir(path)

    def mtime(self, path: str) -> float:
        info = self.fs.get_file_info(path)
        return float(info.mtime.timestamp()) if info.mtime else time.time()

    def remove(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_file(path)

    def retire(self, path: str) -> str:
        target = f"{os.path.dirname(path)}/.gc-{uuid.uuid4().hex}"
        with contextlib.suppress(OSError):
            self.fs.move(path, target)
        return target

    def exists(self, path: str) -> bool:
        return self._exists(path)

    def rmdir(self, path: str) -> None:
        with contextlib.suppress(OSError):
            if not self.listdir(path):
                self.fs.delete_dir(path)
