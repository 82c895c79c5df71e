"""Config.executor.send_buffer: the runtime's own gloo groups with a bounded TCP send buffer.

Real gloo groups over loopback: the connections that creating a group opened report the asked
send buffer, the AllReduce over them equals torch's own on every rank, and the runtime is shared
across calls (its groups are made once); unset, that is the default 1 MiB; with ``off`` the
runtime sends over the user's group and leaves every buffer to the kernel. While an OptCC plan
runs the connections hold ``Config.optcc.send_buffer`` (default 128 KiB), and the usual bound
again for every other plan. The ranks set them with ``STRAGGLERKIT_TCP_SEND_BUFFER`` and
``STRAGGLERKIT_OPTCC_SEND_BUFFER``, which ``stragglerkit.init`` reads.
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Collection, Iterator

import pytest
import torch
import torch.distributed as dist
from _dist import run_group

from stragglerkit.config import Config
from stragglerkit.errors import ConfigError
from stragglerkit.runtime.send_buffer import BoundedConnections, new_group_with_send_buffer, socket_inodes

ENV = "STRAGGLERKIT_TCP_SEND_BUFFER"
OPTCC_ENV = "STRAGGLERKIT_OPTCC_SEND_BUFFER"
DEFAULT_SEND_BUFFER = 1024 * 1024
DEFAULT_OPTCC_SEND_BUFFER = 128 * 1024


@contextlib.contextmanager
def send_buffer_env(value: str | None, name: str = ENV) -> Iterator[None]:
    """``name`` (``STRAGGLERKIT_TCP_SEND_BUFFER``) = ``value`` (None: unset) for ranks spawned inside."""
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value  # spawned ranks inherit it
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _send_buffers(environ: dict[str, str]) -> tuple[int | None, int | None]:
    """(executor.send_buffer, optcc.send_buffer) of the configuration ``init`` builds from ``environ``."""
    config = Config.from_env(environ)
    return config.executor.send_buffer, config.optcc.send_buffer


def test_the_setting_is_read_and_checked() -> None:
    assert Config().executor.send_buffer == DEFAULT_SEND_BUFFER == 1024 * 1024  # the default
    assert _send_buffers({})[0] == DEFAULT_SEND_BUFFER
    assert _send_buffers({ENV: "256KiB"})[0] == 256 * 1024
    for off in ("off", "OFF", "kernel"):
        assert _send_buffers({ENV: off})[0] is None
    for bad, message in (("lots", "cannot read 'lots' as a size"), ("1KiB", "at least 8192 bytes"),
                         ("0", "at least 8192 bytes"), ("on", "cannot read 'on' as a size")):
        with pytest.raises(ConfigError, match=f"{ENV}={bad!r}: .*{message}"):
            _send_buffers({ENV: bad})


def test_the_optcc_setting_is_read_and_checked() -> None:
    assert Config().optcc.send_buffer == DEFAULT_OPTCC_SEND_BUFFER == 128 * 1024
    assert _send_buffers({})[1] == DEFAULT_OPTCC_SEND_BUFFER
    assert _send_buffers({OPTCC_ENV: "64KiB"})[1] == 64 * 1024
    assert _send_buffers({OPTCC_ENV: "Off"})[1] is None
    for bad, message in (("small", "cannot read 'small' as a size"), ("4KiB", "at least 8192 bytes")):
        with pytest.raises(ConfigError, match=f"{OPTCC_ENV}={bad!r}: .*{message}"):
            _send_buffers({OPTCC_ENV: bad})


def test_bounded_connections_set_every_live_socket_and_skip_reused_descriptors() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        clients = [socket.create_connection(server.getsockname()) for _ in range(2)]
        accepted = [server.accept()[0] for _ in clients]
        try:
            tracked = [(c.fileno(), os.fstat(c.fileno()).st_ino) for c in clients]
            connections = BoundedConnections(tracked, current=0)
            assert len(connections) == 2
            connections.bound(64 * 1024)
            assert connections.sizes() == [64 * 1024, 64 * 1024] and connections.current == 64 * 1024
            connections.bound(256 * 1024)
            assert connections.sizes() == [256 * 1024, 256 * 1024]
            # the second descriptor now names another socket: it is left alone
            stranger = accepted[1]
            os.dup2(stranger.fileno(), clients[1].fileno())
            before = stranger.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            connections.bound(32 * 1024)
            assert connections.sizes() == [32 * 1024]
            assert stranger.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == before
            with pytest.raises(ValueError, match="cannot be joined"):
                connections + BoundedConnections([], current=1 << 20)
        finally:
            for sock in (*clients, *accepted):
                sock.close()


def _wmem_max() -> int:
    """The most a process may ask for ``SO_SNDBUF`` (the kernel doubles what it grants)."""
    with open("/proc/sys/net/core/wmem_max", encoding="ascii") as limit:
        return int(limit.read())


def _connected_send_buffers(skip: Collection[int] = ()) -> list[int]:
    """SO_SNDBUF of every connected TCP socket of this process, but those whose inode is in ``skip``."""
    sizes = []
    for inode, fd in socket_inodes().items():
        if inode in skip:
            continue
        with socket.socket(fileno=os.dup(fd)) as sock:  # closes the duplicate only
            if sock.type != socket.SOCK_STREAM:
                continue
            try:
                sock.getpeername()
            except OSError:  # a listening socket
                continue
            sizes.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    return sizes


def _new_connections_report_the_buffer(rank: int, world_size: int) -> list[int]:
    before = socket_inodes()
    _, connections = new_group_with_send_buffer(64 * 1024)
    assert len(connections) >= world_size - 1, len(connections)
    assert connections.sizes() == [64 * 1024] * len(connections)
    return _connected_send_buffers(skip=before)


def test_a_new_groups_connections_queue_at_most_the_asked_bytes() -> None:
    results = run_group(3, _new_connections_report_the_buffer)
    for sizes in results.values():
        assert 64 * 1024 in sizes, sizes


def _asks_more_than_the_kernel_grants(rank: int, world_size: int) -> list[str]:
    too_much = 3 * _wmem_max()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, connections = new_group_with_send_buffer(too_much)
    assert len(connections) >= world_size - 1, len(connections)
    return [str(w.message) for w in caught]


def test_a_buffer_the_kernel_caps_is_warned_of() -> None:
    for messages in run_group(2, _asks_more_than_the_kernel_grants).values():
        assert any("net.core.wmem_max" in m and "raise" in m for m in messages), messages


def _all_reduce_over_bounded_groups(rank: int, world_size: int) -> dict[str, object]:
    import stragglerkit
    from stragglerkit.session import session_for

    stragglerkit.init()
    runtime = session_for().runtime
    sizes = _connected_send_buffers()
    out: dict[str, object] = {
        "connections": runtime.send_buffer_connections,
        "own_group": runtime.data_group is not dist.distributed_c10d._get_default_group(),
        "sizes": sizes,
    }
    # the large ring is observed with concurrent waits over bounded connections (concurrent_waits)
    cases = (("ring", 1001), ("ring_large", 70001), ("stragglar", 4099), ("optcc", 70000))
    for name, numel in cases:
        algorithm = name.removesuffix("_large")
        x = torch.arange(numel, dtype=torch.float32) * (rank + 1)
        expected = x.clone()
        dist.all_reduce(expected)
        kwargs: dict[str, object] = {"straggler": world_size - 1} if algorithm == "stragglar" else {}
        if algorithm == "optcc":
            kwargs = {"slowdowns": {1: 2.0}}
        stragglerkit.all_reduce(x, algorithm=algorithm, **kwargs)  # type: ignore[arg-type]
        out[name] = bool(torch.equal(x, expected))
    out["shared"] = session_for().runtime is runtime and runtime.send_buffer_connections == out["connections"]
    return out


@pytest.mark.parametrize("value", ["64KiB", "1MiB", None])
def test_all_reduce_over_the_runtimes_bounded_groups_is_exact(value: str | None) -> None:
    asked = 64 * 1024 if value == "64KiB" else DEFAULT_SEND_BUFFER
    asked = min(asked, 2 * _wmem_max())  # what the kernel grants (the runtime warns of less)
    with send_buffer_env(value):
        results = run_group(4, _all_reduce_over_bounded_groups)
    for rank, out in results.items():
        assert out["own_group"] and out["shared"], (rank, out)
        assert isinstance(out["connections"], int) and out["connections"] >= 2 * 3, (rank, out)
        sizes = out["sizes"]
        assert isinstance(sizes, list) and sizes.count(asked) >= 2 * 3, (rank, out)
        assert out["ring"] and out["ring_large"] and out["stragglar"] and out["optcc"], (rank, out)


@pytest.mark.parametrize("value", ["off", "kernel"])
def test_off_keeps_the_kernels_buffers_and_the_users_group(value: str) -> None:
    with send_buffer_env(value):
        results = run_group(4, _all_reduce_over_bounded_groups)
    for rank, out in results.items():
        assert not out["own_group"] and out["connections"] == 0, (rank, out)
        sizes = out["sizes"]
        assert isinstance(sizes, list) and sizes and DEFAULT_SEND_BUFFER not in sizes, (rank, out)
        assert out["ring"] and out["ring_large"] and out["stragglar"] and out["optcc"], (rank, out)


def _all_reduce_over_a_subgroups_own_groups(rank: int, world_size: int, layout: str) -> dict[str, object]:
    """Megatron's data-parallel groups: ``whole`` is one group over every rank that is not the
    default group (tensor- and pipeline-parallel size 1); ``halves`` are the even and the odd
    ranks, each set up by its own members only (tensor-parallel size 2)."""
    import stragglerkit
    from stragglerkit.session import session_for

    if layout == "whole":
        members = list(range(world_size))
    else:
        members = [r for r in range(world_size) if r % 2 == rank % 2]
    group = dist.new_group(members, backend="gloo", use_local_synchronization=True)
    stragglerkit.init(group=group)
    runtime = session_for(group).runtime
    size = group.size()
    out: dict[str, object] = {
        "size": size,
        "own_groups": runtime.data_group is not group
        and runtime.reverse_group is not None
        and runtime.reverse_group is not group,
        "same_ranks": dist.get_process_group_ranks(runtime.data_group) == members
        and runtime.reverse_group is not None
        and dist.get_process_group_ranks(runtime.reverse_group) == members,
        "connections": runtime.send_buffer_connections,
        "bounds": runtime.connections.sizes() if runtime.connections is not None else [],
    }
    cases: list[tuple[str, dict[str, object]]] = [("ring", {}), ("optcc", {"slowdowns": {size - 1: 2.0}})]
    if size >= 4:
        cases.append(("stragglar", {"straggler": size - 1}))
    for algorithm, kwargs in cases:
        x = torch.arange(70001, dtype=torch.float32) * (rank + 1) + 0.5
        expected = x.clone()
        dist.all_reduce(expected, group=group)
        stragglerkit.all_reduce(x, group=group, algorithm=algorithm, **kwargs)  # type: ignore[arg-type]
        out[algorithm] = bool(torch.equal(x, expected))
    stragglerkit.destroy(group)
    return out


@pytest.mark.parametrize(("world_size", "layout"), [(4, "whole"), (4, "halves")])
def test_a_subgroup_gets_the_runtimes_own_connections_too(world_size: int, layout: str) -> None:
    """A gloo group other than the default one (Megatron's data-parallel group) gets the two
    groups of the runtime's own, one per direction, with bounded send buffers: without them
    StragglAR's swaps share one connection per pair and take twice as long."""
    with send_buffer_env(None):
        results = run_group(world_size, _all_reduce_over_a_subgroups_own_groups, layout)
    for rank, out in results.items():
        size = out["size"]
        assert isinstance(size, int) and size == (world_size if layout == "whole" else world_size // 2)
        assert out["own_groups"] and out["same_ranks"], (rank, out)
        connections = out["connections"]
        assert isinstance(connections, int) and connections >= 2 * (size - 1), (rank, out)
        bounds = out["bounds"]
        granted = min(DEFAULT_SEND_BUFFER, 2 * _wmem_max())  # what the kernel grants
        assert isinstance(bounds, list) and bounds and set(bounds) == {granted}, (rank, out)
        assert out["ring"] and out["optcc"] and out.get("stragglar", True), (rank, out)


def _bounds_follow_the_plan(rank: int, world_size: int) -> dict[str, object]:
    import stragglerkit
    from stragglerkit.session import session_for

    stragglerkit.init()
    runtime = session_for().runtime
    assert runtime.connections is not None
    out: dict[str, object] = {"start": runtime.connections.sizes()}
    for name, algorithm, kwargs in (
        ("optcc", "optcc", {"slowdowns": {1: 8 / 7}}),
        ("ring", "ring", {}),
        ("optcc_again", "optcc", {"slowdowns": {1: 2.0}}),
    ):
        x = torch.arange(90001, dtype=torch.float32) * (rank + 1) + 0.25
        expected = x.clone()
        dist.all_reduce(expected)
        stragglerkit.all_reduce(x, algorithm=algorithm, **kwargs)  # type: ignore[arg-type]
        out[name] = (bool(torch.equal(x, expected)), runtime.connections.sizes())
    return out


@pytest.mark.parametrize("value", [None, "64KiB", "off"])
def test_optcc_runs_over_connections_with_its_own_bound(value: str | None) -> None:
    granted = 2 * _wmem_max()  # the most the kernel grants
    usual = min(DEFAULT_SEND_BUFFER, granted)
    during = usual if value == "off" else min(64 * 1024 if value else DEFAULT_OPTCC_SEND_BUFFER, granted)
    with send_buffer_env(None), send_buffer_env(value, OPTCC_ENV):
        results = run_group(3, _bounds_follow_the_plan)
    for rank, out in results.items():
        start = out["start"]
        assert isinstance(start, list) and len(start) >= 2 * 2 and set(start) == {usual}, (rank, out)
        for name, bound in (("optcc", during), ("ring", usual), ("optcc_again", during)):
            exact, sizes = out[name]  # type: ignore[misc]
            assert exact, (rank, name, out)
            assert sizes == [bound] * len(start), (rank, name, out)
