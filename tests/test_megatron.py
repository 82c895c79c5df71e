"""stragglerkit.megatron against real megatron-core 0.16 (scripts/setup.sh installs it): the flag
and the config section, the checks before anything changes, and megatron-core's DDP on real gloo
ranks with and without the straggler-aware AllReduce (tests/megatron_bodies.py). The GPT example,
examples/megatron/train_gpt.py, runs under torchrun in tests/test_examples.py."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import megatron_bodies
import pytest
from _dist import run_group
from _require import needs

from stragglerkit.errors import ConfigError

pytestmark = [
    needs(
        "megatron-core",
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        "pip install megatron-core==0.16.1 (scripts/setup.sh installs it)",
    ),
    # megatron-core's import-time notes on a machine without Transformer Engine and Apex
    pytest.mark.filterwarnings("ignore:.*(Transformer Engine|Apex):UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron"),
    pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning"),
]

ROOT = Path(__file__).parents[1]
PRESET = ROOT / "configs" / "megatron.yaml"
FP32_TOLERANCE = 1e-5
"""Relative to the gradients' largest magnitude: another summation order in float32."""


def _run(n: int, body: str, *args: Any, timeout: float = 120.0) -> dict[int, Any]:
    return run_group(n, getattr(megatron_bodies, body), *args, timeout=timeout)


# -- the flag and the section, in this process ------------------------------------------------------
def test_add_arguments_has_the_signature_of_extra_args_provider_and_parses_the_flag(tmp_path: Path) -> None:
    import stragglerkit.megatron as skm

    parser = argparse.ArgumentParser()
    assert skm.add_arguments(parser) is parser
    args = parser.parse_args(
        ["--straggler-aware-allreduce", "--straggler-config", str(PRESET), "--straggler-event-log", "e.jsonl"]
    )
    assert args.straggler_aware_allreduce is True
    config = skm.MegatronConfig.from_args(args)
    assert config.straggler_aware_allreduce
    assert config.config is not None and config.config.report.event_log == "e.jsonl"
    assert config.config.detection.warmup_steps == 10  # from the preset's section
    off = skm.MegatronConfig.from_args(parser.parse_args([]))
    assert off == skm.MegatronConfig()


def test_the_preset_loads_both_megatrons_ddp_config_and_the_section_next_to_it() -> None:
    from megatron.core.distributed import DistributedDataParallelConfig

    import stragglerkit.megatron as skm

    ddp_config, config = skm.load_yaml(PRESET)
    assert isinstance(ddp_config, DistributedDataParallelConfig)
    assert ddp_config.overlap_grad_reduce and not ddp_config.use_distributed_optimizer
    assert config.straggler_aware_allreduce and config.config is not None
    assert skm.MegatronConfig.from_yaml(PRESET) == config
    assert skm.MegatronConfig.from_yaml(ROOT / "configs" / "default.yaml").config is not None  # plain sections


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stragglerkit:\n  straggler_aware_allreduce: yes-please\n", "true or false"),
        ("ddp:\n  overlap_grad_reduc: true\n", "overlap_grad_reduc"),
        ("stragglerkit:\n  detection:\n    windw: 3\n", "did you mean 'window'"),
        ("megatron:\n  x: 1\n", "unknown mapping(s) 'megatron'"),
    ],
    ids=["switch_not_bool", "unknown_ddp_field", "unknown_detection_field", "unknown_mapping"],
)
def test_a_bad_yaml_file_names_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    import stragglerkit.megatron as skm

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        skm.load_yaml(path)


def test_args_without_the_flag_s_parser_say_how_to_add_it() -> None:
    import stragglerkit.megatron as skm

    with pytest.raises(ConfigError, match=r"extra_args_provider=stragglerkit\.megatron\.add_arguments"):
        skm.install(object(), argparse.Namespace(lr=1e-3))


def test_with_the_flag_off_nothing_is_checked_or_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import package_info

    import stragglerkit.megatron as skm

    monkeypatch.setattr(package_info, "__version__", "0.9.0")
    model = object()
    assert skm.install(model, skm.MegatronConfig()) is None
    assert skm.install(model, argparse.Namespace(straggler_aware_allreduce=False)) is None


def test_an_unsupported_megatron_core_version_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import package_info

    import stragglerkit.megatron as skm

    monkeypatch.setattr(package_info, "__version__", "0.17.0")
    expected = r"megatron-core 0\.17\.0.*supports megatron-core >=0\.16\.0,<0\.17.*megatron-core==0\.16\.1"
    with pytest.raises(ConfigError, match=expected):
        skm.install(object(), skm.MegatronConfig(straggler_aware_allreduce=True))


def test_a_changed_signature_of_the_wrapped_method_is_named_with_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup

    import stragglerkit.megatron as skm

    def start_grad_sync(self: Any, force_all_reduce: bool = False, stream: Any = None) -> None:  # a later release's
        raise AssertionError("not called")

    monkeypatch.setattr(_ParamAndGradBucketGroup, "start_grad_sync", start_grad_sync)
    with pytest.raises(
        ConfigError,
        match=r"megatron-core 0\.16\.1: _ParamAndGradBucketGroup\.start_grad_sync takes "
        r"\(self, force_all_reduce, stream\)",
    ):
        skm.install(object(), skm.MegatronConfig(straggler_aware_allreduce=True))


def test_a_model_that_is_not_megatron_core_s_ddp_is_refused() -> None:
    from torch import nn

    import stragglerkit.megatron as skm

    expected = r"megatron-core's DistributedDataParallel.*torch\.nn\.modules\.linear\.Linear.*wrap it first"
    with pytest.raises(ConfigError, match=expected):
        skm.install(nn.Linear(2, 2), skm.MegatronConfig(straggler_aware_allreduce=True))
    with pytest.raises(ConfigError, match="list of model chunks is empty"):
        skm.install([], skm.MegatronConfig(straggler_aware_allreduce=True))


# -- real ranks ---------------------------------------------------------------------------------
def test_one_data_parallel_rank_and_torch_s_ddp_are_refused_on_a_live_group() -> None:
    errors = _run(1, "one_rank_errors")[0]
    assert errors["dp_size_1"].startswith("ConfigError") and "data-parallel group has one rank" in errors["dp_size_1"]
    assert "torch.nn.parallel.distributed.DistributedDataParallel" in errors["torch_ddp"]
    assert "use stragglerkit.ddp_hook" in errors["torch_ddp"]


EXACT_CASES = [
    {"ddp": {"overlap_grad_reduce": True}, "start_first": True},
    {"ddp": {"overlap_grad_reduce": False, "average_in_collective": True}},
    {"ddp": {"overlap_grad_reduce": True, "average_in_collective": True}, "micro_batches": 2},
]


def test_with_nothing_wrong_the_flag_gives_megatron_core_s_gradients_bit_for_bit() -> None:
    """No plan forced: every bucket runs megatron-core's own collective through the loop."""
    results = _run(2, "side_by_side", EXACT_CASES, None)
    for rank, per_case in results.items():
        for r in per_case:
            assert r["diffs"] == [0.0] * len(r["diffs"]), (rank, r["case"], r["diffs"])
            assert all(set(ran) == {"allreduce"} for ran in r["ran"]), r["ran"]
            assert r["steps"] == len(r["diffs"]) and r["handles_cleared"]
            assert r["buckets"] == (3 if r["case"]["ddp"]["overlap_grad_reduce"] else 1)


FORCED_CASES = [
    {"ddp": {"overlap_grad_reduce": True}, "start_first": True},
    {"ddp": {"overlap_grad_reduce": False, "average_in_collective": True}},
    {"ddp": {"overlap_grad_reduce": True, "average_in_collective": True}, "micro_batches": 3},
    {"ddp": {"overlap_grad_reduce": True, "grad_reduce_in_fp32": True}, "dtype": "bfloat16", "micro_batches": 2},
]
CASE_IDS = ["overlap_sum_first_batch_start", "no_overlap_avg", "overlap_avg_no_sync", "bf16_fp32_reduce"]


def _check_forced(results: dict[int, list[dict[str, Any]]], algorithm: str) -> None:
    for rank, per_case in results.items():
        for r in per_case:
            for step, (diff, scale) in enumerate(zip(r["diffs"], r["scales"])):
                assert diff <= FP32_TOLERANCE * max(scale, 1e-3), (rank, r["case"], step, diff, scale)
            assert set(r["ran"][0]) == {"allreduce"}, "step 0 is the warm-up: megatron-core's own collective"
            assert all(algorithm in ran for ran in r["ran"][1:]), (r["case"], r["ran"])
            assert r["steps"] == len(r["diffs"]) and r["handles_cleared"]


def test_a_forced_balanced_ring_averages_like_megatron_core_on_2_ranks() -> None:
    """overlap on/off, SUM and AVG (average_in_collective), several buckets, no_sync micro-batches, bf16
    parameters reduced in fp32: within float32 rounding of megatron-core's own, every step."""
    plan = {"default": "balanced_ring", "slowdowns": [[1, 1.2]]}
    _check_forced(_run(2, "side_by_side", FORCED_CASES, plan), "balanced_ring")


def test_a_forced_optcc_averages_like_megatron_core_on_3_ranks() -> None:
    plan = {"default": "ring", "buckets": ["optcc"] * 8, "slowdowns": [[1, 2.0]]}
    cases = [FORCED_CASES[0], FORCED_CASES[2]]
    _check_forced(_run(3, "side_by_side", cases, plan, timeout=150.0), "optcc")


def test_the_loop_runs_over_the_data_parallel_group_not_the_world() -> None:
    """4 ranks, tensor-parallel size 2: data-parallel groups {0, 2} and {1, 3}, each its own loop."""
    results = _run(
        4, "data_parallel_group_not_world", {"default": "balanced_ring", "slowdowns": [[1, 1.2]]}, timeout=150.0
    )
    for rank, r in results.items():
        assert r["loop_ranks"] == r["dp_ranks"] == [rank % 2, rank % 2 + 2]
        assert r["loop_world_size"] == 2
        assert max(r["diffs"]) <= 1e-5, r["diffs"]
        assert all("balanced_ring" in ran for ran in r["ran"][1:]), r["ran"]
    assert results[0]["grad_sums"] == results[2]["grad_sums"] != results[1]["grad_sums"]


def test_the_distributed_optimizer_keeps_megatron_core_s_reduce_scatter_and_says_so_once(tmp_path: Path) -> None:
    results = _run(2, "distributed_optimizer", str(tmp_path / "events.jsonl"))
    for r in results.values():
        assert r["diffs"] == [0.0, 0.0] and r["routed"] == 0 and not r["wrapped"]
        assert r["algorithm"] == "reduce_scatter" and r["notes"] == ["megatron_reduce_scatter"]
        assert not r["session"], "nothing routed: no stragglerkit session was made"
    assert len(results[0]["warnings"]) == 1 and "reduce-scatter" in results[0]["warnings"][0]
    assert results[1]["warnings"] == []
    log = results[0]["log"]
    assert [e["kind"] for e in log] == ["megatron_reduce_scatter"], log
    assert "use_distributed_optimizer" in log[0]["evidence"]["why"]
