"""OptCC's exact timeline without lowering it: one vectorised step per window of its timetable.

OptCC on ``p`` ranks with ``k`` segments has about ``2kq²`` messages (``q = p - 1`` healthy ranks;
134 million at p = 1,024, k = 64), far too many to lower and flatten. But its timetable
(:mod:`stragglerkit.schedules.optcc_timetable`) is built from *lanes*: in window ``t`` the healthy
ranks form the line ``h_{t+1} -> ... -> h_t`` (position ``i`` is ``h_{t+1+i}``), and the chains of
the reduce-scatter (S1) and all-gather (S4) hop along fixed edge positions, one hop per window.
So one window is a handful of numpy operations on vectors of ``q - 1`` lanes, and the whole run is
``O(kq)`` windows of ``O(q)`` work: about two seconds at p = 1,024, k = 64.

The rules are the simulator's (:mod:`stragglerkit.sim.simulator`) for this schedule, applied
directly:

* every rank's sends are chained, and so are its receives (:meth:`OptccPlan.rank_ops`): a rank
  keeps the end of its last send and of its last receive; both start at its arrival;
* a message starts when its sender's previous send is done, the sender holds the chunk (the
  message that brought it), and the receiver's previous receive is done; it ends ``alpha +
  bytes / min(tx[src], rx[dst])`` later, and so do its send and its receive;
* the other rules of the simulator add nothing here: a connection's previous message is the
  sender's previous send, a receive's write-after-read dependency (on the rank's own earlier send
  of the chunk) and its write-after-write one (on its earlier receive of it) both end before the
  data could reach it, and no NIC direction ever carries two flows, so the contention-free
  timeline is the max-min one.

State. A healthy rank keeps one slot of ``send_end`` / ``recv_end`` while it walks down the
positions: slot ``t + i`` is the rank at position ``i`` in window ``t``, so window ``t``'s line is
the view ``[t : t + q]``; when a rank wraps from position 0 to ``q - 1`` its slot is copied from
``t`` to ``t + q``. A lane's chain keeps the end of its last hop (the chunk's writer); S keeps its
last send and receive; the uploads, downloads and fills keep their ends by window (the writers of
S's downloads and of the all-gather chains).

Applies to plans with one degraded rank (the straggler on the detour), one stage ordering and one
GPU per server, with or without bubble fills, with any chunk sizes (ramp, LP), any finite
arrivals and any NIC bandwidths, and without reduction costs; elsewhere :func:`fast_optcc` returns
``None`` and the caller simulates the schedule. ``tests/test_sim_fast.py`` compares it with
:func:`~stragglerkit.sim.simulator.simulate` to 1e-9.

Example::

    net = Network.uniform(1024, alpha=3e-6, bandwidth=25e9, slowdowns={3: 2.0})
    plan = optcc_plan(1024, {3: 2.0}, segments=64)
    fast_optcc(plan, 2**30, net, np.zeros(1024)).time_from_last_arrival
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from stragglerkit.sim.graph import FloatArray
from stragglerkit.sim.network import Network

if TYPE_CHECKING:
    from stragglerkit.schedules.optcc_timetable import OptccPlan
    from stragglerkit.sim.fast import FastResult

__all__ = ["fast_optcc"]

_NONE = -math.inf
"""Bytes of a message that does not exist: its duration, and so its end, is -inf, which leaves
every maximum it enters unchanged."""


def fast_optcc(plan: OptccPlan, size_bytes: float, network: Network, arrival: FloatArray) -> FastResult | None:
    """What ``simulate(plan.lower(), size_bytes, network, arrival)`` returns (its times), or
    ``None`` where this path does not apply (module docstring)."""
    from stragglerkit.sim.fast import _result

    if plan.attached or plan.orderings != 1 or network.gamma or network.delta or network.gpus_per_server != 1:
        return None
    if not np.all(np.isfinite(arrival)):
        return None
    q, k, lanes = plan.q, plan.segments, plan.q - 1
    windows = plan.num_windows
    weights = np.asarray(plan.chunk_sizes(), dtype=np.float64)
    chunk_bytes = weights * (float(size_bytes) / float(weights.sum()))
    tx = np.asarray(network.tx_bandwidth, dtype=np.float64)
    rx = np.asarray(network.rx_bandwidth, dtype=np.float64)
    healthy = np.asarray(plan.healthy, dtype=np.int64)
    straggler = plan.straggler
    alpha = float(network.alpha)

    # bytes of the section uploaded in window u, at index u + pad (front padding for negative u)
    pad = q + 2
    upload_bytes = np.full(pad + windows + 2 * q + 2, _NONE)
    upload_bytes[pad + q : pad + q * (k + 1)] = chunk_bytes[: k * q]
    fill_bytes = chunk_bytes[k * q :]

    # ring edge rates: lane i in window t joins ring indices t+1+i -> t+2+i
    ring_rate = np.minimum(tx[healthy], rx[np.roll(healthy, -1)])  # edge j: h_j -> h_{j+1}
    uniform = bool(np.all(ring_rate == ring_rate[0]))
    lane_rate = ring_rate[(np.arange(windows + q) + 1) % q]  # lane_rate[t + i]

    send_end = np.empty(windows + q)  # slot t + i: the rank at position i in window t
    recv_end = np.empty(windows + q)
    send_end[:q] = recv_end[:q] = arrival[healthy[(np.arange(q) + 1) % q]]
    s_send = s_recv = float(arrival[straggler])
    up_rate = np.minimum(tx[healthy], rx[straggler])  # indexed by the uploader's ring index
    down_rate = np.minimum(tx[straggler], rx[healthy])

    upload_end = np.full(pad + windows, _NONE)  # by window + pad
    download_end = np.full(pad + windows, _NONE)
    rs_last_hop = np.full(((windows + lanes - 1) // lanes + 1, lanes), _NONE)  # by batch, lane
    fill_up_end = np.full(max(k, 1), _NONE)
    rs_writer = np.full(lanes, _NONE)
    ag_writer = np.full(lanes, _NONE)
    start = np.empty(lanes)
    rs_dur = np.empty(lanes)
    ag_dur = np.empty(lanes)
    rs_done = np.full(lanes, _NONE)
    ag_done = np.full(lanes, _NONE)
    stage_done = dict.fromkeys(("upload", "fill_up", "download", "fill_down"), _NONE)

    for t in range(windows):
        if t:
            send_end[t + q - 1] = send_end[t - 1]  # the rank at position 0 wraps to position q-1
            recv_end[t + q - 1] = recv_end[t - 1]
        sends = send_end[t : t + lanes]  # positions 0..q-2: the senders of lanes 0..q-2
        recvs = recv_end[t + 1 : t + q]  # positions 1..q-1: their receivers
        batch, offset = divmod(t, lanes)
        first_window = t - offset
        if offset == 0:
            # a new batch: S1 chains start fresh, S4 chains start from the downloads
            rs_writer.fill(_NONE)
            low = pad + q + batch * lanes
            rs_bytes = upload_bytes[low : low + lanes]
            low = pad + first_window - q - 1
            ag_bytes = upload_bytes[low : low + lanes]
            low = pad + first_window - q
            ag_writer[:] = download_end[low : low + lanes]
            if uniform:
                np.divide(rs_bytes, ring_rate[0], out=rs_dur)
                rs_dur += alpha
                np.divide(ag_bytes, ring_rate[0], out=ag_dur)
                ag_dur += alpha
        if not uniform:
            rates = lane_rate[t : t + lanes]
            np.divide(rs_bytes, rates, out=rs_dur)
            rs_dur += alpha
            np.divide(ag_bytes, rates, out=ag_dur)
            ag_dur += alpha
        # S1 hop (sub-slot 0), then S4 hop (sub-slot 1) on every lane
        for writer, duration, done in ((rs_writer, rs_dur, rs_done), (ag_writer, ag_dur, ag_done)):
            np.maximum(sends, recvs, out=start)
            np.maximum(start, writer, out=start)
            np.add(start, duration, out=writer)  # the hop's end: the writer of the next hop
            np.maximum(sends, writer, out=sends)
            np.maximum(recvs, writer, out=recvs)
            np.maximum(done, writer, out=done)
        if offset == lanes - 1:
            rs_last_hop[batch] = rs_writer
        # the straggler's detour: the uploader (position q-1) to S, S to the downloader (position 0)
        uploader, downloader = (t + q) % q, (t + 1) % q  # ring indices
        up, down = t + q - 1, t  # their slots
        if q <= t < q * (k + 1):  # S2: upload of section t - q, after its S1 chain's last hop
            lane = (t - q) % lanes
            begin = max(send_end[up], s_recv, rs_last_hop[(t - q) // lanes, lane])
            end = begin + alpha + chunk_bytes[t - q] / up_rate[uploader]
            send_end[up] = s_recv = upload_end[pad + t] = end
            stage_done["upload"] = end
        body = t // q
        if len(fill_bytes) and body < k:  # fill up: the uploader's own contribution of fill `body`
            begin = max(send_end[up], s_recv)
            end = begin + alpha + fill_bytes[body] / up_rate[uploader]
            send_end[up] = s_recv = fill_up_end[body] = end
            stage_done["fill_up"] = end
        if q + 1 <= t < q * (k + 1) + 1:  # S3: download of the section uploaded in window t - 1
            begin = max(s_send, upload_end[pad + t - 1], recv_end[down])
            end = begin + alpha + chunk_bytes[t - 1 - q] / down_rate[downloader]
            s_send = recv_end[down] = download_end[pad + t] = end
            stage_done["download"] = end
        fill = plan.fill_download_body(body)
        if len(fill_bytes) and 0 <= fill < k:
            begin = max(s_send, fill_up_end[fill], recv_end[down])
            end = begin + alpha + fill_bytes[fill] / down_rate[downloader]
            s_send = recv_end[down] = end
            stage_done["fill_down"] = end

    # each healthy rank's last slot: the window's line [windows-1 : windows-1+q]
    last = windows - 1
    completion = np.array(arrival, dtype=np.float64)
    ring_index = (last + 1 + np.arange(q)) % q
    completion[healthy[ring_index]] = np.maximum(send_end[last : last + q], recv_end[last : last + q])
    completion[straggler] = max(s_send, s_recv)
    phase_done = {"reduce_scatter": float(rs_done.max()), "allgather": float(ag_done.max())}
    phase_done.update((stage, end) for stage, end in stage_done.items() if end > _NONE)
    return _result(completion, arrival, phase_done, windows)
