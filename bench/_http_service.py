"""The bench's slow HTTP service: an asyncio server on loopback, in a process of its own, that
answers every request after ``--delay-ms`` (a model server or web API stand-in).

    python bench/_http_service.py [--delay-ms 200]

Prints its port on the first line of stdout once it listens; on SIGTERM prints
``cpu_s=<user+system seconds>`` and exits, so the caller can report its CPU apart from the
workers'.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", type=float, default=200.0)
    args = ap.parse_args()
    delay = args.delay_ms / 1000

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(delay)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", 0, backlog=4096)
        print(server.sockets[0].getsockname()[1], flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()
        t = os.times()
        print(f"cpu_s={t.user + t.system:.2f}", flush=True)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
