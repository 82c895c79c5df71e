"""OptCC proved from its timetable, window by window, without lowering it (``O(kq)`` windows).

The full checker (``check.py``) executes the lowered op list, ``O(kq²)`` ops: 22 s at p = 64,
k = 64, hours at p = 1,024. But every flow of OptCC's timetable is a closed-form function of
``(rank, window)`` (:mod:`stragglerkit.schedules.optcc_timetable`), and in window ``t`` the S1 and
S4 chains hop along fixed *lanes* (edge positions ``i``: ring index ``t+1+i`` sends to ``t+2+i``)
whose chunks are consecutive chunk numbers. :func:`prove_optcc` walks the windows in order and
checks, per window with a few numpy operations on slices of per-chunk arrays, what makes the run
an AllReduce (ring indices ``j`` of ``h_j``; ``x`` the owner of a section):

* S1 (adding): the first hop of a section leaves ``h_{x+1}`` (its own contribution); every later
  hop leaves the rank that received the previous one, in an earlier window; a hop may only go to a
  rank outside the chain so far (the chain is consecutive on the ring and shorter than ``q``), and
  only before the section's upload. The receiver holds only its own contribution then.
* S2 (adding at S): ``h_x`` uploads once, after the chain's ``q - 1`` hops ended at it: S adds
  its own value to the sum of the ``q`` healthy ones and holds the global sum.
* S3 (storing): S downloads once, after the upload, to a healthy rank.
* S4 (storing): every hop leaves the rank that received the section's global sum last, in an
  earlier window, and goes to the next ring index; at most ``q - 1`` hops, so the holders are
  ``q`` consecutive, distinct ring indices: every healthy rank.
* Fills (S's point-to-point AllReduce): each healthy rank uploads its own contribution of fill
  ``b`` once; S downloads fill ``b`` only after all ``q`` uploads (in earlier windows), and to each
  healthy rank once.
* At the end every section was uploaded, downloaded and gathered by all ``q`` healthy ranks, and
  every fill went up from and down to every healthy rank.

What ties these windows to the plan that runs: :meth:`OptccPlan.rank_flows` is the generator; the
proof compares its flows with the lanes' in :data:`LINK_SAMPLES` windows spread over the run (the
first and last ones included), and the tests compare them in every window for every ``p`` up to
a bound. The lowering of flows to ops (each op waits for the previous send or receive of its
rank and for the last write of its chunk: program order is window order) is
:meth:`OptccPlan.rank_ops`, proved by the full checker on whole schedules for every ``p`` up to
that bound. docs/schedules.md ("What is proven at which size") says what runs where.

Applies to plans with one degraded rank, one stage ordering and one GPU per server (the plans
the fast simulator takes); other plans raise :class:`ScheduleError` and keep the full checker.

Example::

    report = prove_optcc(optcc_plan(1024, {3: 2.0}, segments=64))
    report.windows, report.messages
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.optcc_timetable import Flow, OptccPlan

__all__ = ["LINK_SAMPLES", "OptccProof", "lane_flows", "prove_optcc"]

LINK_SAMPLES = 24
"""Windows in which :func:`prove_optcc` compares the generator's flows with the lanes'."""


@dataclass(slots=True, frozen=True)
class OptccProof:
    """What :func:`prove_optcc` checked."""

    world_size: int
    segments: int
    windows: int
    messages: int
    linked_windows: int
    """Windows whose flows were compared with :meth:`OptccPlan.flows`."""


def _section(plan: OptccPlan, upload_window: int) -> int:
    """The section chunk uploaded in ``upload_window`` (-1: none): segment ``u div q - 1``'s
    section ``u mod q``, i.e. chunk ``u - q``, for the ``k`` segments."""
    chunk = _section_number(plan, upload_window)
    return chunk if 0 <= chunk < plan.segments * plan.q else -1


def _rs_lane0(plan: OptccPlan, window: int) -> int:
    """The chunk of lane 0's S1 hop in ``window`` (lane ``i`` carries this ``+ i``, if a section):
    batch ``m = window div (q-1)`` uploads its lanes' sections in windows ``q + m(q-1) + i``."""
    lanes = plan.q - 1
    return _section_number(plan, plan.q + (window // lanes) * lanes)


def _ag_lane0(plan: OptccPlan, window: int) -> int:
    """The chunk of lane 0's S4 hop in ``window`` (lane ``i``: ``+ i``): the chain that started in
    the batch's first window ``w0`` from the download of window ``w0 - q + i``, i.e. of the
    section uploaded in ``w0 - q - 1 + i``."""
    return _section_number(plan, window - window % (plan.q - 1) - plan.q - 1)


def _section_number(plan: OptccPlan, upload_window: int) -> int:
    """Chunk ``u - q`` of upload window ``u``, whether or not it is a section (range checked by
    the caller)."""
    return upload_window - plan.q


def _fill_down(plan: OptccPlan, body: int) -> int:
    """The fill S downloads in ``body`` (-1: none): the previous body's, the last one in body
    ``k + 1`` (after the last section download)."""
    k = plan.segments
    if not plan.fill_weight:
        return -1
    if body == k + 1:
        return k - 1
    return body - 1 if 1 <= body < k else -1


def lane_flows(plan: OptccPlan, window: int) -> set[tuple[int, int, int, str]]:
    """Window ``window``'s flows as the proof executes them, ``(src, dst, chunk, stage)``: the
    lanes' S1 and S4 hops and the straggler's detour, from the proof's own arithmetic (the set
    :meth:`OptccPlan.flows` must equal)."""
    q, lanes, h, s = plan.q, plan.q - 1, plan.healthy, plan.straggler
    t = window
    sections = plan.segments * plan.q
    flows = set()
    for i in range(lanes):
        src, dst = h[(t + 1 + i) % q], h[(t + 2 + i) % q]
        rs = _rs_lane0(plan, t) + i
        if 0 <= rs < sections:
            flows.add((src, dst, rs, "reduce_scatter"))
        ag = _ag_lane0(plan, t) + i
        if 0 <= ag < sections:
            flows.add((src, dst, ag, "allgather"))
    uploader, downloader = h[t % q], h[(t + 1) % q]
    if _section(plan, t) >= 0:
        flows.add((uploader, s, _section(plan, t), "upload"))
    if plan.fill_weight and t // q < plan.segments:
        flows.add((uploader, s, sections + t // q, "fill_up"))
    if _section(plan, t - 1) >= 0:
        flows.add((s, downloader, _section(plan, t - 1), "download"))
    fill = _fill_down(plan, t // q)
    if fill >= 0:
        flows.add((s, downloader, sections + fill, "fill_down"))
    return flows


def _as_tuples(flows: list[Flow]) -> set[tuple[int, int, int, str]]:
    return {(f.src, f.dst, f.chunk, f.stage) for f in flows}


def _linked_windows(plan: OptccPlan, samples: int) -> list[int]:
    last = plan.num_windows - 1
    spread = np.linspace(0, last, num=max(samples - 8, 2)).round().astype(int).tolist()
    return sorted({*range(min(4, last + 1)), *spread, *range(max(0, last - 3), last + 1)})


def prove_optcc(plan: OptccPlan, link_samples: int = LINK_SAMPLES) -> OptccProof:
    """Prove ``plan`` an AllReduce from its timetable (module docstring); raise
    :class:`ScheduleError` naming the window, the stage and the section otherwise.
    ``link_samples``: windows in which to compare the generator's flows with the proof's
    (0: none, for tests of the proof alone)."""
    if plan.attached or plan.orderings != 1:
        raise ScheduleError(
            "the window proof covers OptCC with one degraded rank and one stage ordering; "
            "use the full checker (stragglerkit.schedules.check) for this plan"
        )
    linked = _linked_windows(plan, link_samples) if link_samples > 0 else []
    for window in linked:
        generated = _as_tuples(list(plan.flows(window)))
        if generated != lane_flows(plan, window):
            missing = sorted(lane_flows(plan, window) - generated)[:1]
            extra = sorted(generated - lane_flows(plan, window))[:1]
            raise ScheduleError(
                f"optcc window {window}: the generator's flows differ from the lanes' "
                f"(not generated: {missing}, not in the lanes: {extra})"
            )
    q, k, lanes = plan.q, plan.segments, plan.q - 1
    sections = k * q
    rs_hops = np.zeros(sections, np.int64)
    rs_holder = np.full(sections, -1, np.int64)  # ring index of the rank holding the chain's sum
    rs_window = np.full(sections, -1, np.int64)
    uploaded = np.full(sections, -1, np.int64)
    downloaded = np.full(sections, -1, np.int64)
    ag_holders = np.zeros(sections, np.int64)
    ag_holder = np.full(sections, -1, np.int64)
    ag_window = np.full(sections, -1, np.int64)
    fills = plan.num_fills
    fill_up = np.zeros((fills, q), bool)
    fill_last_up = np.full(fills, -1, np.int64)
    fill_down = np.zeros((fills, q), bool)
    lane = np.arange(lanes, dtype=np.int64)
    messages = 0

    def fail(window: int, what: str, chunk: int) -> ScheduleError:
        segment, section = divmod(chunk, q)
        return ScheduleError(f"optcc window {window}: {what} (section {section} of segment {segment}, chunk {chunk})")

    for t in range(plan.num_windows):
        senders = (t + 1 + lane) % q
        # S1 on every lane: chunks first_rs + i, consecutive
        first_rs = _rs_lane0(plan, t)
        lo, hi = max(first_rs, 0), min(first_rs + lanes, sections)
        if lo < hi:
            view = slice(lo, hi)
            snd = senders[lo - first_rs : hi - first_rs]
            chunks = np.arange(lo, hi)
            starts = rs_hops[view] == 0
            ok = np.where(starts, snd == (chunks % q + 1) % q, (snd == rs_holder[view]) & (rs_window[view] < t))
            ok &= (rs_hops[view] + 2 <= q) & (uploaded[view] < 0)
            if not ok.all():
                bad = int(chunks[~ok][0])
                raise fail(t, "an S1 hop leaves a rank that does not hold the chain's sum, or revisits one", bad)
            rs_hops[view] += 1
            rs_holder[view] = (snd + 1) % q
            rs_window[view] = t
            messages += hi - lo
        # S4 on every lane: chunks first_ag + i
        first_ag = _ag_lane0(plan, t)
        lo, hi = max(first_ag, 0), min(first_ag + lanes, sections)
        if lo < hi:
            view = slice(lo, hi)
            snd = senders[lo - first_ag : hi - first_ag]
            ok = (ag_holders[view] >= 1) & (snd == ag_holder[view]) & (ag_window[view] < t) & (ag_holders[view] < q)
            if not ok.all():
                bad = int(np.arange(lo, hi)[~ok][0])
                raise fail(t, "an S4 hop leaves a rank without the global sum, or wraps round the ring", bad)
            ag_holders[view] += 1
            ag_holder[view] = (snd + 1) % q
            ag_window[view] = t
            messages += hi - lo
        # the straggler's detour: upload from ring index t mod q, download to t+1 mod q
        uploader, downloader = t % q, (t + 1) % q
        chunk = _section(plan, t)
        if chunk >= 0:
            if not (rs_hops[chunk] == q - 1 and rs_holder[chunk] == uploader == chunk % q and rs_window[chunk] < t):
                raise fail(t, "the upload leaves before the S1 chain of all healthy ranks ended at the owner", chunk)
            if uploaded[chunk] >= 0:
                raise fail(t, "a section is uploaded twice", chunk)
            uploaded[chunk] = t
            messages += 1
        chunk = _section(plan, t - 1)
        if chunk >= 0:
            if not 0 <= uploaded[chunk] < t or downloaded[chunk] >= 0:
                raise fail(t, "S downloads a section it has not summed, or twice", chunk)
            downloaded[chunk] = ag_window[chunk] = t
            ag_holders[chunk], ag_holder[chunk] = 1, downloader
            messages += 1
        body = t // q
        if fills and body < k:
            if fill_up[body, uploader]:
                raise fail(t, f"ring index {uploader} uploads fill {body} twice", sections + body)
            fill_up[body, uploader] = True
            fill_last_up[body] = t
            messages += 1
        fill = _fill_down(plan, body)
        if fill >= 0:
            if not (fill_up[fill].all() and fill_last_up[fill] < t) or fill_down[fill, downloader]:
                raise fail(t, f"fill {fill} goes down before all healthy ranks' uploads, or twice", sections + fill)
            fill_down[fill, downloader] = True
            messages += 1
    short = np.flatnonzero((uploaded < 0) | (downloaded < 0) | (ag_holders != q))
    if len(short):
        raise fail(plan.num_windows, "at the end a section is not held by every healthy rank", int(short[0]))
    if fills and not (fill_up.all() and fill_down.all()):
        unfinished = int(np.flatnonzero(~(fill_up.all(axis=1) & fill_down.all(axis=1)))[0])
        raise fail(plan.num_windows, f"fill {unfinished} does not reach every healthy rank", sections + unfinished)
    return OptccProof(plan.world_size, k, plan.num_windows, messages, len(linked))
