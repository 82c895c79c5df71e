"""The critical path of one AllReduce, from the executor's per-op timings: where the time went.

Every rank's executor records, per message, when it was *posted* and when this rank saw it
*complete* (:class:`stragglerkit.runtime.executor.OpTiming`). With the plan's dependencies
(:func:`stragglerkit.runtime.trace.message_dependencies`) and the pairing of each send with its
receive (the k-th message from rank a to rank b on both sides: a pair's messages match in program
order), the chain of events that ended the AllReduce can be walked back from the last completion:

* A message could not flow before both ends had posted it, nor before the message ahead of it on
  the same connection (one per sender, receiver and direction; it carries its messages one after
  another) had arrived. If that earlier message is what it waited for, the path goes on through
  it (``queued_on_connection`` counts how often). From the latest of these to the message's
  completion is **wire** time: the transfer, and whatever slowed it (other messages on
  the same link, TCP, a receiving thread that waited for a core). With the links' payload rates it
  is compared with the **ideal** time of the message alone on its link, and with how busy its
  link was meanwhile (**link busy**): the bytes that all messages out of the sender and into the
  receiver moved during that time (each message's bytes spread evenly over its own flow), over the
  link's rate, on the busier of the two ends. A message that shares its link with others takes
  longer than alone while its link stays busy; a link that is idle while a message is in flight
  lost that time to something else (a receiving thread waiting for a core, TCP).
* The end that posted later had been waiting for its own dependencies (messages it receives
  before it can send, with the reductions in between). From their completion to the post is
  **post lag**: the executor thread reducing the received chunk, waking up, posting. It is CPU
  time on the critical path and nothing else; a schedule does not ask for it. A receive that is
  the first from its peer may also wait for the peer's header (the executor checks it before any
  data moves): its lag is counted as post lag and also, on its own, as **first from a peer**.
* A chain that reaches an op without dependencies ends at that rank's entry into the AllReduce
  (with a straggler: usually the straggler's arrival).

The segments telescope: ``wire + post lag = last completion - entry of the path's first rank``.
Comparing runs at two link rates separates what the schedule needs (wire time near its ideal,
links busy) from what the machine adds (post lag, links idle while messages are in flight).
The timings of different ranks are compared directly, so this needs one clock for all
ranks: ranks on one machine (loopback, the emulated cluster; ``time.monotonic_ns``), not ranks on
several machines.

It reads plain values, one trace per rank, as :func:`stragglerkit.runtime.trace.rank_trace` makes them.

Example::

    traces = [rank_trace(record, entered_ns) for ...]          # one per rank, gathered
    path = critical_path(traces, payload_Bps=[119.6e6] * 8)   # {"total_s": ..., "post_lag_s": ...}
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["critical_path"]

_SHARERS = 3
"""How many of the messages that shared a path message's link its segment names."""


class _Message(NamedTuple):
    """One message of a :func:`rank_trace` (its list form; ``label`` is "" in traces without one)."""

    op: int
    kind: str
    peer: int
    nbytes: int
    post_ns: int
    end_ns: int
    label: str = ""

    @classmethod
    def of(cls, item: list[Any]) -> _Message:
        op, kind, peer, nbytes, post, end = item[:6]
        return cls(
            int(op), str(kind), int(peer), int(nbytes), int(post), int(end), str(item[6]) if len(item) > 6 else ""
        )


class _Rank:
    def __init__(self, rank: int, trace: dict[str, Any]) -> None:
        self.rank = rank
        self.entered_ns = int(trace["entered_ns"])
        messages = [_Message.of(item) for item in trace["messages"]]
        self.by_op: dict[int, _Message] = {m.op: m for m in messages}
        self.deps: dict[int, list[int]] = {m.op: list(d) for m, d in zip(messages, trace["deps"], strict=True)}
        self.first_from: set[int] = set()
        seen: set[int] = set()
        for m in messages:  # sorted by op: program order
            if m.kind != "send" and m.peer not in seen:
                self.first_from.add(m.op)
                seen.add(m.peer)


def _pair_messages(
    ranks: list[_Rank],
) -> tuple[dict[tuple[int, int], tuple[int, int]], dict[tuple[int, int], tuple[int, int]]]:
    """(rank, op) -> (peer rank, the matching op there), both ways; and (rank, op) -> (receiver,
    its op) of the message before it on the same connection (sender -> receiver), both ways."""
    sends: dict[tuple[int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[int]] = defaultdict(list)
    for one in ranks:
        for op in sorted(one.by_op):
            m = one.by_op[op]
            (sends[(one.rank, m.peer)] if m.kind == "send" else recvs[(m.peer, one.rank)]).append(op)
    pairs: dict[tuple[int, int], tuple[int, int]] = {}
    before: dict[tuple[int, int], tuple[int, int]] = {}
    for (sender, receiver), send_ops in sends.items():
        recv_ops = recvs.get((sender, receiver), [])
        if len(recv_ops) != len(send_ops):
            raise ValueError(
                f"rank {sender} sent {len(send_ops)} messages to rank {receiver}, which received "
                f"{len(recv_ops)}: the traces are not of one AllReduce"
            )
        for index, (send_op, recv_op) in enumerate(zip(send_ops, recv_ops, strict=True)):
            pairs[(sender, send_op)] = (receiver, recv_op)
            pairs[(receiver, recv_op)] = (sender, send_op)
            if index:
                before[(sender, send_op)] = before[(receiver, recv_op)] = (receiver, recv_ops[index - 1])
    return pairs, before


class _Flow(NamedTuple):
    """One message's transfer: the later post to the receiver's completion."""

    start: int
    end: int
    nbytes: float
    sender: int
    receiver: int
    label: str
    send: tuple[int, int]
    """(sender, its op): which message this is."""

    def overlap_ns(self, t0: int, t1: int) -> int:
        """How long this transfer ran within [t0, t1] (0 if not at all)."""
        return max(0, min(self.end, t1) - max(self.start, t0))


class _Links:
    """What moved over each host's egress and ingress, message by message (each message's bytes
    spread evenly over its flow)."""

    def __init__(
        self,
        ranks: list[_Rank],
        pairs: dict[tuple[int, int], tuple[int, int]],
        flow_start: Callable[[_Rank, int], int],
        payload_Bps: list[float],
    ):
        self.payload_Bps = payload_Bps
        self.out_of: dict[int, list[_Flow]] = defaultdict(list)
        self.into: dict[int, list[_Flow]] = defaultdict(list)
        for one in ranks:
            for op, message in one.by_op.items():
                if message.kind != "send":
                    continue
                other_rank, other_op = pairs[(one.rank, op)]
                start = flow_start(one, op)
                end = max(ranks[other_rank].by_op[other_op].end_ns, start + 1)
                flow = _Flow(start, end, float(message.nbytes), one.rank, other_rank, message.label, (one.rank, op))
                self.out_of[one.rank].append(flow)
                self.into[other_rank].append(flow)

    @staticmethod
    def _moved(flows: list[_Flow], t0: int, t1: int) -> float:
        return sum(flow.nbytes * flow.overlap_ns(t0, t1) / (flow.end - flow.start) for flow in flows)

    def share(self, sender: int, receiver: int, t0: int, t1: int) -> float:
        """How busy the busier end of the link ``sender -> receiver`` was over [t0, t1] (0..1)."""
        if t1 <= t0:
            return 0.0
        seconds = (t1 - t0) / 1e9
        egress = self._moved(self.out_of[sender], t0, t1) / (self.payload_Bps[sender] * seconds)
        ingress = self._moved(self.into[receiver], t0, t1) / (self.payload_Bps[receiver] * seconds)
        return min(1.0, max(egress, ingress))

    def sharers(self, send: tuple[int, int], receiver: int, t0: int, t1: int) -> list[list[Any]]:
        """The messages other than ``send`` (sender, op) out of its sender or into ``receiver``
        during [t0, t1], longest overlap first: ``[sender, receiver, label, seconds of overlap]``."""
        found = []
        for flow in {*self.out_of[send[0]], *self.into[receiver]}:
            overlap = flow.overlap_ns(t0, t1)
            if flow.send != send and overlap > 0:
                found.append([flow.sender, flow.receiver, flow.label, overlap / 1e9])
        return sorted(found, key=lambda item: -item[3])


def critical_path(
    traces: list[dict[str, Any]], payload_Bps: list[float] | None = None, origin_ns: int | None = None
) -> dict[str, Any] | None:
    """Walk the critical path of one AllReduce back from its last completion (module docstring).

    ``traces``: :func:`rank_trace` of every rank, indexed by physical rank. ``payload_Bps``: each
    host's payload rate (a message's ideal time is its bytes over the slower end's rate); None: no
    ideal figures. ``origin_ns``: where ``total_s`` counts from (default: the first entry).
    Returns None when no rank sent a message.

    The result: ``total_s`` (origin to the last completion), ``start_s`` (origin to the entry the
    path starts from), ``wire_s`` / ``wire_ideal_s`` / ``wire_link_busy_s`` / ``post_lag_s`` /
    ``first_from_peer_s`` (sums over the path; ``wire_link_busy_s``: the part of ``wire_s`` during
    which the message's link was busy, None without rates; ``first_from_peer_s``: the part of
    ``post_lag_s`` at first receives from a peer), ``messages`` (how many the path crosses;
    ``queued_on_connection`` of them waited for the message ahead of them on their connection),
    ``post_lag_all`` (every message's post lag on every rank: count, sum and the largest, in
    seconds) and ``segments`` (the path from its start: ``[rank, what, peer, seconds]``, and for a
    message a fifth item: its ``label``, with rates also ``link_busy`` (0..1) and ``shared_with``,
    the other messages on its sender's egress or receiver's ingress meanwhile, ``[sender,
    receiver, label, seconds of overlap]``, longest first).
    """
    ranks = [_Rank(r, t) for r, t in enumerate(traces)]
    if not any(r.by_op for r in ranks):
        return None
    pairs, queued_after = _pair_messages(ranks)
    origin = min(r.entered_ns for r in ranks) if origin_ns is None else origin_ns

    def ready_ns(r: _Rank, op: int) -> tuple[int, int | None]:
        """When ``op``'s dependencies had completed on ``r`` (its entry without any), and the last one."""
        deps = r.deps[op]
        if not deps:
            return r.entered_ns, None
        last = max(deps, key=lambda d: r.by_op[d].end_ns)
        return r.by_op[last].end_ns, last

    def flow_start(r: _Rank, op: int) -> int:
        """When the message could move: both ends had posted it and the message before it on its
        connection had arrived (a connection carries its messages one after another)."""
        other_rank, other_op = pairs[(r.rank, op)]
        start = max(r.by_op[op].post_ns, ranks[other_rank].by_op[other_op].post_ns)
        if (r.rank, op) in queued_after:
            previous_rank, previous_op = queued_after[(r.rank, op)]
            start = max(start, ranks[previous_rank].by_op[previous_op].end_ns)
        return start

    all_lags = [max(0, r.by_op[op].post_ns - ready_ns(r, op)[0]) for r in ranks for op in r.by_op]
    links = _Links(ranks, pairs, flow_start, payload_Bps) if payload_Bps is not None else None
    end_rank, end_op = max(((r, op) for r in ranks for op in r.by_op), key=lambda item: item[0].by_op[item[1]].end_ns)
    segments: list[list[Any]] = []
    wire = ideal = lag = first_from_peer = 0
    busy = 0.0
    crossed = queued = 0
    rank, op = end_rank, end_op
    for _ in range(sum(len(r.by_op) for r in ranks) + 1):
        message = rank.by_op[op]
        kind, peer, post, end = message.kind, message.peer, message.post_ns, message.end_ns
        other_rank, other_op = pairs[(rank.rank, op)]
        other = ranks[other_rank]
        other_post = other.by_op[other_op].post_ns
        flow = flow_start(rank, op)
        wire += end - flow
        crossed += 1
        sender, receiver = (rank.rank, peer) if kind == "send" else (peer, rank.rank)
        if payload_Bps is not None:
            ideal += round(1e9 * message.nbytes / min(payload_Bps[sender], payload_Bps[receiver]))
        detail: dict[str, Any] = {"label": message.label}
        if links is not None:
            detail["link_busy"] = links.share(sender, receiver, flow, end)
            send = (rank.rank, op) if kind == "send" else (other_rank, other_op)
            detail["shared_with"] = links.sharers(send, receiver, flow, end)[:_SHARERS]
            busy += (end - flow) * detail["link_busy"]
        segments.append([rank.rank, f"{kind} {sender}->{receiver}", peer, (end - flow) / 1e9, detail])
        if flow > max(post, other_post):  # queued behind the message before it on the connection
            rank, op = ranks[queued_after[(rank.rank, op)][0]], queued_after[(rank.rank, op)][1]
            queued += 1
            continue
        if other_post > post:  # the peer posted later: its wait is the earlier link of the chain
            rank, op = other, other_op
        ready, before = ready_ns(rank, op)
        waited = max(0, rank.by_op[op].post_ns - ready)
        lag += waited
        if op in rank.first_from:
            first_from_peer += waited
        what = "post lag, first from the peer" if op in rank.first_from else "post lag"
        segments.append([rank.rank, what, rank.by_op[op].peer, waited / 1e9])
        if before is None:
            start = rank.entered_ns
            break
        op = before
    else:  # pragma: no cover - each step moves to an earlier completion
        raise RuntimeError("the critical path did not reach an entry: the traces' clocks disagree")
    segments.reverse()
    return {
        "total_s": (end_rank.by_op[end_op].end_ns - origin) / 1e9,
        "start_s": (start - origin) / 1e9,
        "start_rank": rank.rank,
        "end_rank": end_rank.rank,
        "wire_s": wire / 1e9,
        "wire_ideal_s": ideal / 1e9 if payload_Bps is not None else None,
        "wire_link_busy_s": busy / 1e9 if payload_Bps is not None else None,
        "post_lag_s": lag / 1e9,
        "first_from_peer_s": first_from_peer / 1e9,
        "messages": crossed,
        "queued_on_connection": queued,
        "post_lag_all": {
            "count": len(all_lags),
            "sum_s": sum(all_lags) / 1e9,
            "max_s": max(all_lags, default=0) / 1e9,
        },
        "segments": segments,
    }
