"""Tiny TCP endpoints that the emulated cluster runs inside its namespaces to check the links.

This file is executed as a stand-alone script (``python probe.py MODE ...``) inside a network
namespace with ``ip netns exec``; it imports nothing from stragglerkit so that it runs with any
interpreter and any working directory. Every mode is bounded in bytes and in time.

Modes (each prints one JSON object on stdout when done; a server first prints
``READY PORT`` with the port it listens on; pass port 0 to let the kernel choose one):

``recv ADDR PORT NBYTES SKIP TIMEOUT``
    Accept one connection, read exactly NBYTES, and report the receive rate. The clock starts
    once SKIP bytes have arrived, so that connection set-up and the shaper's initial burst
    (the token bucket starts full) do not inflate the figure:
    ``rate = (NBYTES - skipped) / (t_last_byte - t_after_skip)``.
``send ADDR PORT NBYTES TIMEOUT``
    Connect and write NBYTES of zeros.
``echo ADDR PORT ROUNDS SIZE TIMEOUT``
    Accept one connection and send back every message of SIZE bytes, ROUNDS times.
``ping ADDR PORT ROUNDS SIZE TIMEOUT``
    Connect, send ROUNDS messages of SIZE bytes and wait for each to come back; report the
    round-trip times and whether the echoed bytes were the ones sent.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

__all__ = ["main"]

_CHUNK = 256 * 1024
_SO_TIMESTAMPNS = 35  # Linux: receive timestamps (struct timespec) on every recvmsg
_ANCILLARY_SIZE = 64


def _listen(addr: str, port: int, timeout: float) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addr, port))
    server.listen(1)
    server.settimeout(timeout)
    print(f"READY {server.getsockname()[1]}", flush=True)
    return server


def _accept(addr: str, port: int, timeout: float) -> socket.socket:
    """Listen on ``addr:port`` for one peer; its connection, with ``timeout`` on every call."""
    with _listen(addr, port, timeout) as server:
        conn, _ = server.accept()
    conn.settimeout(timeout)
    return conn


def _connect(addr: str, port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:  # the peer may not be listening yet; bounded by the deadline
        try:
            conn = socket.create_connection((addr, port), timeout=max(0.05, deadline - time.monotonic()))
        except (ConnectionRefusedError, TimeoutError, OSError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
            continue
        conn.settimeout(timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn


def _recv_exact(conn: socket.socket, view: memoryview, size: int, deadline: float) -> None:
    got = 0
    while got < size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"received {got} of {size} bytes before the deadline")
        n = conn.recv_into(view[got:size])
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {size} bytes")
        got += n


def _kernel_timestamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("qq", data[:16])
            return seconds + nanoseconds * 1e-9
    return None


def recv(addr: str, port: int, nbytes: int, skip: int, timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    with _accept(addr, port, timeout) as conn:
        conn.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        got = 0
        counted_from = -1
        user_start = user_end = 0.0
        kernel_start: float | None = None
        kernel_end: float | None = None
        while got < nbytes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"received {got} of {nbytes} bytes within {timeout} s")
            n, ancillary, _, _ = conn.recvmsg_into([view[: min(_CHUNK, nbytes - got)]], _ANCILLARY_SIZE)
            if n == 0:
                raise ConnectionError(f"sender closed after {got} of {nbytes} bytes")
            got += n
            stamp = _kernel_timestamp(ancillary)
            if counted_from < 0 and got >= skip:
                counted_from = got
                user_start = time.perf_counter()
                kernel_start = stamp
            kernel_end = stamp
        user_end = time.perf_counter()
        conn.sendall(b"k")  # tell the sender everything arrived
    counted = nbytes - counted_from
    # Kernel receive timestamps say when the bytes arrived, not when this process got to read
    # them, so a reader that was descheduled cannot inflate the rate by draining a backlog.
    kernel = kernel_start is not None and kernel_end is not None and kernel_end > kernel_start
    elapsed = (kernel_end - kernel_start) if kernel else (user_end - user_start)  # type: ignore[operator]
    return {
        "bytes": counted,
        "seconds": elapsed,
        "rate": counted / elapsed if elapsed > 0 else 0.0,
        "clock": "kernel" if kernel else "user",
    }


def send(addr: str, port: int, nbytes: int, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    payload = bytes(_CHUNK)
    t0 = time.perf_counter()
    with _connect(addr, port, timeout) as conn:
        sent = 0
        while sent < nbytes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"sent {sent} of {nbytes} bytes within {timeout} s")
            step = min(_CHUNK, nbytes - sent)
            conn.sendall(payload[:step])
            sent += step
        conn.recv(1)
    return {"bytes": nbytes, "seconds": time.perf_counter() - t0}


def echo(addr: str, port: int, rounds: int, size: int, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    with _accept(addr, port, timeout) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(size)
        view = memoryview(buf)
        for _ in range(rounds):
            _recv_exact(conn, view, size, deadline)
            conn.sendall(view)
    return {"rounds": rounds}


def ping(addr: str, port: int, rounds: int, size: int, timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    rtts: list[float] = []
    intact = True
    with _connect(addr, port, timeout) as conn:
        back = bytearray(size)
        view = memoryview(back)
        for _ in range(rounds):
            message = os.urandom(size)
            t0 = time.perf_counter()
            conn.sendall(message)
            _recv_exact(conn, view, size, deadline)
            rtts.append(time.perf_counter() - t0)
            intact = intact and bytes(back) == message
    return {"rtts": rtts, "intact": intact}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    mode, args = argv[0], argv[1:]
    result: dict[str, object]
    if mode == "recv":
        addr, port, nbytes, skip, timeout = args
        result = recv(addr, int(port), int(nbytes), int(skip), float(timeout))
    elif mode == "send":
        addr, port, nbytes, timeout = args
        result = dict(send(addr, int(port), int(nbytes), float(timeout)))
    elif mode == "echo":
        addr, port, rounds, size, timeout = args
        result = dict(echo(addr, int(port), int(rounds), int(size), float(timeout)))
    elif mode == "ping":
        addr, port, rounds, size, timeout = args
        result = ping(addr, int(port), int(rounds), int(size), float(timeout))
    else:
        print(f"unknown mode {mode!r}; use recv, send, echo or ping", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
