"""Safe where unproven: ``Config.detection.act``. A loop that observes only (``act="never"``, or
the default ``auto`` on a backend where stragglerkit's executor is not proven, NCCL) detects and
reports as it would acting, records the switch it would have made, says once why it observes,
and runs every bucket with the group's own AllReduce: no plan, no probe, no rank remapping.

The value and its decision alone; the controller that observes, on synthetic exchanges; what the
report says of it; 4-rank gloo groups over loopback under the DDP hook and the torch-only
optimizer; and the NCCL gate on two GPUs (skipped without them; scripts/gpu_check.sh runs on one
GPU and does not run it)."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import observe_bodies
import pytest
import torch
from _detect_helpers import fix_the_model, window
from _dist import run_group, several

from stragglerkit import Config, ConfigError
from stragglerkit.config import ACT_CHOICES, DetectionConfig
from stragglerkit.detect.controller import Controller
from stragglerkit.detect.settings import PROVEN_BACKENDS, Settings, act_decision, settings_for
from stragglerkit.plans import EVENT_KINDS, Plan

N = 4


# -- the field ------------------------------------------------------------------------------------
def test_act_defaults_to_auto_and_takes_its_three_values_in_any_case() -> None:
    assert Config().detection.act == "auto" and set(ACT_CHOICES) == {"auto", "always", "never"}
    for value in ("never", " Always ", "AUTO"):
        assert Config().replace(detection={"act": value}).detection.act == value.strip().lower()


@pytest.mark.parametrize("value", ["sometimes", "", True, 1, None])
def test_a_bad_act_names_the_field_the_values_and_what_each_does(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        Config().replace(detection={"act": value})
    message = str(caught.value)
    assert f"detection.act must be one of auto, always, never, got {value!r}" in message
    for name, what in ACT_CHOICES.items():
        assert f"{name}: {what}" in message


def test_act_comes_from_yaml_the_environment_and_the_config_file_variable(tmp_path: Path) -> None:
    path = tmp_path / "observe.yaml"
    path.write_text("detection:\n  act: never\n")
    assert Config.from_yaml(path).detection.act == "never"
    assert Config.from_dict({"detection": {"act": "always"}}).detection.act == "always"
    assert Config.from_env({"STRAGGLERKIT_ACT": "never"}).detection.act == "never"
    assert Config.from_env({"STRAGGLERKIT_CONFIG": str(path), "STRAGGLERKIT_ACT": "always"}).detection.act == "always"
    assert Config.from_env({"STRAGGLERKIT_CONFIG": str(path)}).detection.act == "never"
    with pytest.raises(ConfigError, match=r"STRAGGLERKIT_ACT='maybe': .*detection\.act must be one of"):
        Config.from_env({"STRAGGLERKIT_ACT": "maybe"})
    path.write_text("detection:\n  act: no\n")  # YAML reads a bare no as false
    with pytest.raises(ConfigError, match=re.escape("detection.act must be one of auto, always, never, got False")):
        Config.from_yaml(path)


def test_what_a_checkpoint_holds_from_before_act_existed_gets_the_defaults() -> None:
    assert pickle.loads(pickle.dumps(DetectionConfig(act="never", window=8))) == DetectionConfig(act="never", window=8)
    _, slots = DetectionConfig(window=8).__getstate__()  # (None, slots), as a slotted object pickles
    del slots["act"]
    old = DetectionConfig.__new__(DetectionConfig)
    old.__setstate__((None, slots))
    assert old == DetectionConfig(window=8) and old.act == "auto"
    settings = Settings.of(window=8, settle_steps=0, acting=False)
    assert pickle.loads(pickle.dumps(settings)) == settings
    _, slots = settings.__getstate__()
    del slots["acting"]
    restored = Settings.__new__(Settings)
    restored.__setstate__((None, slots))  # a loop's settings checkpointed before: it acted
    assert restored == Settings.of(window=8, settle_steps=0) and restored.acting is True


# -- the decision ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("act", "backend", "acts", "says"),
    [
        ("auto", "gloo", True, "where stragglerkit's executor is proven"),
        ("auto", "nccl", False, "not yet proven over NCCL with several ranks"),
        ("auto", "cpu:gloo,cuda:nccl", False, "not yet proven over NCCL"),
        ("auto", "mpi", False, "proven on gloo process groups only"),
        ("always", "nccl", True, "act='always'"),
        ("always", "gloo", True, "act='always'"),
        ("never", "gloo", False, "act='never'"),
        ("never", "nccl", False, "act='never'"),
    ],
)
def test_whether_the_loop_acts_follows_act_and_the_backend(act: str, backend: str, acts: bool, says: str) -> None:
    decision = act_decision(act, backend)
    assert decision.acts is acts and says in decision.reason, decision
    if not acts and act == "auto":  # the way out is named
        assert "detection.act='always'" in decision.reason and "STRAGGLERKIT_ACT=always" in decision.reason
    assert PROVEN_BACKENDS == ("gloo",)
    with pytest.raises(ConfigError, match=re.escape("detection.act must be one of")):
        act_decision("sometimes", backend)


def test_settings_that_observe_run_no_probes_and_keep_the_users_fields() -> None:
    config = Config().replace(detection={"act": "never", "probe_every": 8})
    observing, acting = settings_for(config, acting=False), settings_for(config)
    assert observing.detection is config.detection and observing.detection.probe_every == 8
    assert observing.probe_every == 0 and not observing.probes_back_off
    assert acting.probe_every == 8 and acting.probes_back_off
    assert observing.header()["acting"] is False and acting.header()["acting"] is True
    assert EVENT_KINDS[-2:] == ("would_switch", "observing")  # appended: the earlier kinds keep their codes


# -- the controller that observes ----------------------------------------------------------------
def _observe(controller: Controller, late_steps: range, steps: int = 80, first: int = 0) -> list[Any]:
    """Exchanges of 2 steps on 8 ranks from step ``first``, rank 3 late by 50 ms in ``late_steps``."""
    if first == 0:
        fix_the_model(controller)
    decisions = []
    for start in range(first, steps, 2):
        late = 3 if start in late_steps else None
        stats = window(8, range(start, start + 2), late, 0.05, [8 << 20, 1024])
        stats.hosts = list(range(8))
        decision = controller.observe(stats, start + 4)
        if decision is not None:
            controller.apply(decision)
            decisions.append(decision)
    return decisions


def test_an_observing_controller_records_the_switch_it_would_make_and_keeps_the_baseline() -> None:
    """Rank 3 late from the start, cleared at step 40, late again from step 60: each time the
    straggler is confirmed, one ``would_switch`` names StragglAR with rank 3 last and its predicted
    gain; the plan every rank adopts stays the baseline throughout; nothing is verified or rolled back."""
    settings = Settings.of(warmup_steps=4, min_gain=0.0, verify_steps=4, window=8, acting=False)
    controller = Controller(8, 0, settings)
    # on time from step 40 until 60, rank 3 late again from there
    decisions = _observe(controller, range(0, 40), steps=40) + _observe(controller, range(60, 100), 100, first=40)
    assert all(d.plan == Plan("allreduce") for d in decisions) and controller.plan == Plan("allreduce")
    kinds = [e["kind"] for e in controller.events]
    assert "switch" not in kinds and "verified" not in kinds and "rollback" not in kinds and "probing" not in kinds
    would = [e for e in controller.events if e["kind"] == "would_switch"]
    assert len(would) == 2, kinds
    for event in would:
        evidence = event["evidence"]
        assert event["algorithm"] == "allreduce" and evidence["act"] == "auto"
        assert evidence["to"]["straggler"] == 3 and evidence["to"]["buckets"][0] == "stragglar", evidence["to"]
        assert evidence["running"]["default"] == "allreduce" and evidence["predicted_gain"] > 0
        assert evidence["predicted_after_s"] < evidence["predicted_running_s"]
        assert {"measure", "measured_before_s", "model", "detector"} <= evidence.keys()
    detected = [e["step"] for e in controller.events if e["kind"] == "detected_straggler"]
    assert [e["step"] for e in would] == detected  # reported with the finding that calls for it
    assert "cleared" in kinds and kinds.index("cleared") < kinds.index("would_switch", kinds.index("would_switch") + 1)
    assert controller.probe_every == 0


def test_the_same_exchanges_acting_switch_where_observing_would() -> None:
    """The controller that acts switches at the step and to the plan the one that observes
    names in its ``would_switch``."""
    common = {"warmup_steps": 4, "min_gain": 0.0, "verify_steps": 1000, "window": 8}
    acting, observing = Controller(8, 0, Settings.of(**common)), Controller(8, 0, Settings.of(**common, acting=False))
    _observe(acting, range(0, 80))
    _observe(observing, range(0, 80))
    switch = next(e for e in acting.events if e["kind"] == "switch")
    would = next(e for e in observing.events if e["kind"] == "would_switch")
    assert (would["step"], would["evidence"]["to"]) == (switch["step"], switch["evidence"]["to"])
    assert acting.plan.algorithm == "stragglar" and observing.plan == Plan("allreduce")


def test_the_report_says_what_an_observing_loop_would_have_done() -> None:
    """The verdict names the plan a ``would_switch`` names; the decisions table shows what ran (the baseline)."""
    from stragglerkit.report.html import verdict
    from stragglerkit.report.run_data import RunData, StepRecord, plan_label

    to = {"default": "allreduce", "buckets": ["stragglar", "allreduce"], "straggler": 3, "slowdowns": {}}
    decisions = [
        {"step": 0, "kind": "observing", "algorithm": "allreduce", "evidence": {"act": "never"}},
        {"step": 17, "kind": "detected_straggler", "algorithm": "allreduce", "evidence": {"ranks": {"3": 0.03}}},
        {"step": 17, "kind": "would_switch", "algorithm": "allreduce", "evidence": {"to": to}},
    ]
    run = RunData(
        kind="event log", decisions=decisions, steps=[StepRecord(step=s, algorithm="allreduce") for s in range(30)]
    )
    assert verdict(run)[1] == (
        "Detected a persistent straggler on rank 3 at step 17. "
        "The loop would have switched to stragglar+allreduce (observing only) at step 17."
    )
    assert plan_label(run, decisions[2]) == "allreduce"


# -- real groups ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, Any], Path]:
    """One 4-rank gloo group: the DDP hook (40 steps, rank 3 late by 30 ms from step 8) and the
    torch-only optimizer (12 steps), both with ``act="never"``; the DDP hook with the default
    ``act`` (10 steps) as the loop sees this group and as it would see an NCCL one."""
    folder = tmp_path_factory.mktemp("observe")
    cases = {
        "ddp": (observe_bodies.ddp_never, (40, 8, 0.03, str(folder))),
        "optimizer": (observe_bodies.optimizer_never, (12, 0.03)),
        **{f"auto/{backend}": (observe_bodies.ddp_auto_as, (10, backend)) for backend in ("gloo", "nccl")},
    }
    return run_group(N, several, cases, timeout=300.0), folder


def test_ddp_hook_under_never_detects_reports_and_keeps_the_groups_own_allreduce(
    gloo_runs: tuple[dict[int, Any], Path],
) -> None:
    """The late rank is detected and the switch it calls for recorded as ``would_switch``, every
    rank alike; yet every bucket of every step ran the group's own all_reduce (no probe), with no
    rank remapped, and the parameters equal plain DDP's bit for bit. The loop says once that it
    observes: one ``observing`` event on every rank, one warning on rank 0 only."""
    results, folder = gloo_runs
    runs = {rank: out["ddp"] for rank, out in results.items()}
    kinds = [[(e["step"], e["kind"]) for e in runs[r]["events"]] for r in range(N)]
    assert all(k == kinds[0] for k in kinds), kinds
    for rank, out in runs.items():
        assert out["step"] == 40 and out["acting"] is False and out["probe_every"] == 0
        assert out["algorithms"] == ["allreduce"] * 40, out["algorithms"]
        assert all(ran == ["allreduce"] for ran in out["buckets"]), out["buckets"]
        assert all(m == list(range(N)) for m in out["rank_maps"])
        assert max(out["diffs"]) == 0.0, out["diffs"]  # the very sums of plain DDP's all_reduce
        assert out["warnings"] == ([f"stragglerkit observes only: {_never_reason()}"] if rank == 0 else []), rank
    events = runs[0]["events"]
    observing = [e for e in events if e["kind"] == "observing"]
    assert len(observing) == 1 and observing[0]["step"] == 0, observing
    assert observing[0]["evidence"] == {"act": "never", "backend": "gloo", "reason": _never_reason()}
    # (window 6 with confirm 1 may also act on loopback noise: the late rank's detection is looked for)
    detected = [e for e in events if e["kind"] == "detected_straggler" and e["evidence"]["ranks"].keys() == {"3"}]
    assert detected and detected[0]["step"] > 8, events
    would = [e for e in events if e["kind"] == "would_switch" and e["evidence"]["to"]["straggler"] == 3]
    assert would and would[0]["step"] == detected[0]["step"], events
    assert "stragglar" in would[0]["evidence"]["to"]["buckets"] and would[0]["evidence"]["predicted_gain"] > 0
    assert would[0]["evidence"]["act"] == "never" and would[0]["algorithm"] == "allreduce"
    assert not {"switch", "verified", "rollback", "probing"} & {e["kind"] for e in events}
    # the event log says the same: the header records that the loop did not act
    lines = [json.loads(line) for line in (folder / "events.rank0.jsonl").read_text().splitlines()]
    header = lines[0]
    assert header["kind"] == "run" and header["config"]["acting"] is False
    assert header["config"]["detection"]["act"] == "never"
    logged = [line["kind"] for line in lines[1:] if line["kind"] != "window"]
    assert logged.count("observing") == 1 and "would_switch" in logged and "detected_straggler" in logged
    assert [line for line in lines if line["kind"] == "window"], "rank 0 writes the exchanges' measurements"


def test_the_optimizer_under_never_keeps_the_groups_own_allreduce(gloo_runs: tuple[dict[int, Any], Path]) -> None:
    """``straggler_aware`` without Horovod takes ``act`` from the configuration given to it."""
    results, _ = gloo_runs
    for rank, out in results.items():
        run = out["optimizer"]
        assert run["acting"] is False and run["ran"] == ["allreduce"], run
        assert [kind for _, kind in run["events"]].count("observing") == 1, run["events"]
        assert len(run["warnings"]) == (1 if rank == 0 else 0)


def test_with_the_default_act_the_hook_probes_on_gloo_and_observes_on_nccl(
    gloo_runs: tuple[dict[int, Any], Path],
) -> None:
    """The NCCL gate in the loop, without GPUs: the same gloo group, seen by the loop as an NCCL
    group (the session's backend replaced), observes: its ``observing`` event names NCCL and the
    way to opt in, and no bucket leaves the group's own all_reduce, not even step 8's probe,
    which the loop that sees gloo runs as stragglerkit's ring."""
    results, _ = gloo_runs
    for rank, out in results.items():
        gloo, nccl = out["auto/gloo"], out["auto/nccl"]
        assert gloo["acting"] is True and gloo["observing"] == [] and gloo["warnings"] == []
        assert gloo["ran"][8] == ["allreduce", "ring"], gloo["ran"]  # the probe (probe_every 8)
        assert nccl["acting"] is False and all(ran == ["allreduce"] for ran in nccl["ran"]), nccl["ran"]
        assert nccl["observing"] == [{"act": "auto", "backend": "nccl", "reason": act_decision("auto", "nccl").reason}]
        assert len(nccl["warnings"]) == (1 if rank == 0 else 0)


def _never_reason() -> str:
    return act_decision("never", "gloo").reason


# -- NCCL ---------------------------------------------------------------------------------------
def _why_not_two_gpus() -> str | None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        return (
            f"needs 2 CUDA GPUs (NCCL takes one per rank; it refuses two ranks on one device), found {gpus}: "
            "on a machine with two, build the CUDA kernel (scripts/gpu_check.sh does) and run this file"
        )
    from stragglerkit.runtime.executor import native

    if not native().cuda_kernel:
        return "stragglerkit was built without its CUDA kernel: scripts/gpu_check.sh builds it on a GPU machine"
    return None


@pytest.mark.skipif(_why_not_two_gpus() is not None, reason=str(_why_not_two_gpus()))
def test_on_an_nccl_group_the_hook_observes_unless_opted_in() -> None:
    """Two ranks, one GPU each: with the default ``act`` the hook observes (its ``observing``
    event names NCCL and the way to opt in); with ``act="always"`` it acts; and stragglerkit's
    ring over the NCCL group sums as torch's ``all_reduce`` does, the evidence the gate waits for."""
    results = run_group(2, observe_bodies.nccl_gate, backend="nccl", timeout=300.0)
    for out in results.values():
        assert out["backend"] == "nccl"
        assert out["auto"]["acting"] is False and out["auto"]["algorithms"] == ["allreduce"]
        assert len(out["auto"]["observing"]) == 1 and "NCCL" in out["auto"]["observing"][0]
        assert out["always"]["acting"] is True and out["always"]["observing"] == []
        assert out["ring_equals_torch"]
