"""Cost models fitted to measured runs: terms under arrivals and slow NICs, the fit, the comparison,
the calibration bench's command line, and the loop's choice of model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stragglerkit.bench.calibrate import CalibrateConfig, read_samples, samples_from_cases
from stragglerkit.detect.model import MIN_SCORED, OnlineModel
from stragglerkit.detect.model_comparison import _Graphs, compare, fit_model, identifiable_params, predict
from stragglerkit.schedules.registry import Situation, generate
from stragglerkit.sim import Network, simulate
from stragglerkit.sim.cost_model import CostModel, CostTerms, cost_terms

ROOT = Path(__file__).resolve().parent.parent


# -- terms of a measured run ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 4, 5, 8])
@pytest.mark.parametrize("late", [0.0, 2e-3, 0.05])
@pytest.mark.parametrize("slow", [{}, {1: 2.0}, {0: 1.5, 2: 3.0}])
def test_ring_terms_under_arrivals_and_slow_nics_give_the_simulated_time(
    n: int, late: float, slow: dict[int, float]
) -> None:
    """A ring runs one flow per NIC direction, so its contention-free critical path is the
    simulator's timeline: the terms' prediction must equal the simulated time from the last arrival."""
    config = CostModel.Config(alpha=40e-6, beta=1 / 125e6)
    arrivals = [0.0] * n
    arrivals[n - 1] = late
    arrivals[0] = late / 3
    size = 3 << 20
    schedule = generate("ring", Situation(world_size=n))
    terms = cost_terms(schedule, size, weights=config, arrivals=arrivals, slowdowns=slow)
    predicted = CostModel(config).predict_from_last_arrival(terms, max(arrivals))
    network = Network.uniform(n, alpha=config.alpha, bandwidth=1 / config.beta, slowdowns=slow)
    simulated = simulate(schedule, size, network, arrivals=arrivals).time_from_last_arrival
    assert predicted == pytest.approx(simulated, rel=1e-9)
    assert terms.start in set(arrivals)
    # a slow NIC counts l times the bytes of the messages through it
    healthy = cost_terms(schedule, size, weights=config, arrivals=arrivals)
    assert terms.B >= healthy.B * (1 - 1e-12)
    if slow:
        assert terms.B > healthy.B


def test_terms_reject_bad_arrivals_and_slowdowns() -> None:
    schedule = generate("ring", Situation(world_size=4))
    with pytest.raises(ValueError, match="arrivals must be 4 finite times"):
        cost_terms(schedule, 1 << 20, arrivals=[0.0, 0.0])
    with pytest.raises(ValueError, match="slowdowns: rank 7"):
        cost_terms(schedule, 1 << 20, slowdowns={7: 2.0})
    with pytest.raises(ValueError, match="factor >= 1"):
        cost_terms(schedule, 1 << 20, slowdowns={1: 0.5})


def test_identifiable_params_folds_proportional_and_unused_terms() -> None:
    rows = [
        (CostTerms(A=a, B=b, C=c, D=3 * c, w=1), 1e-3 * a + 1e-8 * b)
        for a, b, c in [(6, 1e6, 3e5), (10, 4e6, 2e6), (14, 9e5, 7e5), (8, 2e7, 1e6)]
    ]
    kept, folded = identifiable_params(rows, ("alpha", "beta", "gamma", "delta", "epsilon"))
    assert kept == ["alpha", "beta", "gamma"]
    assert "not separable" in folded["delta"] and "no sample exercises" in folded["epsilon"]
    kept, folded = identifiable_params(rows, ("alpha", "beta"))
    assert kept == ["alpha", "beta"] and not folded


# -- the fit and the comparison on samples of a known truth -----------------------------------------
def _synthetic(truth: CostModel.Config, noise: float = 0.0, seed: int = 0) -> list[dict[str, object]]:
    """Samples as the calibration bench writes them, their times predicted by ``truth``."""
    rng = np.random.default_rng(seed)
    graphs = _Graphs()
    samples: list[dict[str, object]] = []
    plan = {
        "none": ["ring", "rhd", "direct", "balanced_ring"],
        "straggler": ["ring", "rhd", "direct", "stragglar"],
        "degraded": ["ring", "rhd", "optcc", "balanced_ring"],
    }
    for n in (4, 6):
        for scenario, algorithms in plan.items():
            for size in (16 << 10, 256 << 10, 1 << 20, 4 << 20, 32 << 20):
                arrivals = [0.0] * n
                straggler = None
                if scenario == "straggler":
                    straggler = n - 1
                    arrivals[straggler] = 0.004 + size * truth.beta
                slowdowns = {"1": 2.0} if scenario == "degraded" else {}
                for algorithm in algorithms:
                    sample: dict[str, object] = {
                        "network": "synthetic",
                        "testbed": "emulated",
                        "bandwidth_Bps": 1 / truth.beta,
                        "alpha_ping_s": truth.alpha * 2,
                        "algorithm": algorithm,
                        "world_size": n,
                        "size_bytes": size,
                        "scenario": scenario,
                        "straggler": straggler,
                        "slowdowns": slowdowns,
                        "arrivals_s": arrivals,
                    }
                    seconds = predict(graphs, sample, truth)
                    times = [seconds * (1 + noise * rng.standard_normal()) for _ in range(3)]
                    sample["times_s"] = times
                    sample["time_s"] = float(np.median(times))
                    samples.append(sample)
    return samples


def test_fit_recovers_a_known_alpha_beta_gamma_and_reports_what_it_folds() -> None:
    truth = CostModel.Config(alpha=80e-6, beta=1 / 125e6, gamma=2e-9)
    samples = _synthetic(truth)
    prior = CostModel.Config(alpha=1e-3, beta=1 / 1e9)
    found = fit_model("genmodel", samples, prior)
    assert found.config.alpha == pytest.approx(truth.alpha, rel=1e-3)
    assert found.config.beta == pytest.approx(truth.beta, rel=1e-3)
    assert found.config.gamma == pytest.approx(truth.gamma, rel=1e-2)
    assert set(found.folded) == {"delta", "epsilon"}  # pairwise reductions (D = 3C), one flow per NIC
    plain = fit_model("alpha-beta", samples, prior)
    assert plain.fitted == ("alpha", "beta") and plain.config.gamma == 0.0
    with pytest.raises(ValueError, match="unknown model"):
        fit_model("logp", samples, prior)


def test_comparison_ranks_the_model_with_the_missing_term_last() -> None:
    truth = CostModel.Config(alpha=80e-6, beta=1 / 125e6, gamma=6e-9)
    summary = compare(_synthetic(truth, noise=0.01))
    overall = summary["overall"]
    assert overall["alpha-beta-gamma"]["median_abs"] < 0.03
    assert overall["alpha-beta"]["median_abs"] > 2 * overall["alpha-beta-gamma"]["median_abs"]
    network = summary["networks"]["synthetic"]
    assert network["held_out"] > 0 and network["train"] > 2 * network["held_out"] - 10
    # every held-out sample is counted once per model, split by algorithm and by scenario alike
    by_algorithm = sum(e["samples"] for e in summary["by_algorithm"]["genmodel"].values())
    assert by_algorithm == overall["genmodel"]["samples"] == network["held_out"]
    decisions = summary["decisions"]
    assert decisions["settings"] == 2 * 3 * 5
    for stats in decisions["per_model"].values():
        assert stats["mean_slowdown_vs_fastest"] >= 1.0
    # the loop, fed the fault-free ring/rhd/direct runs as probes: on 6 ranks it settles on the model
    # with the term; on 4, where ring, rhd and direct reduce in proportion to what they send, gamma
    # cannot be told from beta and alpha-beta predicts as well, so the simplest stays
    choices = {c["world_size"]: c for c in summary["loop_choice"]}
    assert choices[6]["model"] == "alpha-beta-gamma"
    assert choices[6]["model_errors"]["alpha-beta-gamma"] < choices[6]["model_errors"]["alpha-beta"]
    assert choices[4]["model"] == "alpha-beta" and "gamma not separable" in choices[4]["candidates"]["alpha-beta-gamma"]


def test_comparison_without_usable_samples_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="bench --mode calibrate"):
        compare([])


# -- the calibration bench ----------------------------------------------------------------------------
def test_calibrate_config_rejects_what_cannot_be_measured() -> None:
    with pytest.raises(ValueError, match="even numbers"):
        CalibrateConfig(world_sizes=[4, 5])
    with pytest.raises(ValueError, match="--testbeds"):
        CalibrateConfig(testbeds=["cloud"])
    with pytest.raises(ValueError, match="--scenarios"):
        CalibrateConfig(scenarios=["late"])
    with pytest.raises(ValueError, match="--slowdown"):
        CalibrateConfig(slowdown=1.0)
    clusters = CalibrateConfig(world_sizes=[4], bandwidths=[125e6, 250e6]).clusters()
    assert [(t, n, r) for t, n, r, _ in clusters] == [
        ("emulated", 4, 125e6),
        ("emulated", 4, 250e6),
        ("loopback", 4, None),
    ]
    assert clusters[-1][3] == ["none", "straggler"]  # loopback has no NIC to degrade


def test_a_wrong_sum_is_never_a_sample() -> None:
    case = {
        "wrong": 3,
        "algorithm": "ring",
        "world_size": 4,
        "size_bytes": 1 << 20,
        "scenario": "none",
        "arrival": [[0.0] * 4],
        "finish": [[1.0] * 4],
    }
    with pytest.raises(RuntimeError, match="3 elements differ from the exact sum"):
        samples_from_cases([case], "loopback", None, None)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stragglerkit.cli", "bench", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_calibrate_command_line_errors_name_the_option(tmp_path: Path) -> None:
    wrong = _cli("--mode", "calibrate", "--algorithms", "ring", cwd=tmp_path)
    assert wrong.returncode != 0 and "--algorithms: not for --mode calibrate" in wrong.stderr
    misplaced = _cli("--world-sizes", "4", "--loopback", cwd=tmp_path)
    assert misplaced.returncode != 0 and "--world-sizes: only for --mode calibrate" in misplaced.stderr
    missing = _cli("--mode", "calibrate", "--from-samples", "--samples", str(tmp_path / "none.json"), cwd=tmp_path)
    assert missing.returncode != 0 and "no such file" in missing.stderr
    odd = _cli("--mode", "calibrate", "--world-sizes", "3", "--testbeds", "loopback", cwd=tmp_path)
    assert odd.returncode != 0 and "even numbers" in odd.stderr


def test_calibrate_on_loopback_measures_fits_and_refits_from_its_samples(tmp_path: Path) -> None:
    """Real ranks over loopback: two sizes, two scenarios, then the fit again from the file alone."""
    samples_path, summary_path = tmp_path / "samples.json", tmp_path / "summary.json"
    args = ["--mode", "calibrate", "--testbeds", "loopback", "--world-sizes", "4", "--sizes", "64KiB,2MiB"]
    run = _cli(
        *args,
        "--iters",
        "2",
        "--warmup",
        "1",
        "--samples",
        str(samples_path),
        "--json",
        str(summary_path),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    header, samples = read_samples(samples_path)
    assert "--mode calibrate" in header["command"]
    measured = sorted({(s["scenario"], s["algorithm"]) for s in samples})
    assert measured == sorted(
        [("none", a) for a in ("ring", "rhd", "direct", "balanced_ring")]
        + [("straggler", a) for a in ("ring", "rhd", "direct", "stragglar")]
    )
    assert len(samples) == 16 and all(s["time_s"] > 0 and len(s["times_s"]) == 2 for s in samples)
    straggled = [s for s in samples if s["scenario"] == "straggler"]
    # rank 3 sleeps 2-5 ms before each run; 4 ranks sharing 2 cores can be scheduled a few ms
    # apart too, so one sample may put another rank last
    last = [s["arrivals_s"][3] == max(s["arrivals_s"]) > 0 for s in straggled]
    assert sum(last) >= len(last) - 2, [s["arrivals_s"] for s in straggled]
    summary = json.loads(summary_path.read_text())
    assert set(summary["overall"]) == {"alpha-beta", "alpha-beta-gamma", "genmodel"}
    assert "held-out relative prediction error" in run.stdout
    again = _cli("--mode", "calibrate", "--from-samples", "--samples", str(samples_path), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    first_table = run.stdout[run.stdout.index("held-out") : run.stdout.index("wrote " + str(summary_path))]
    assert first_table.strip() in again.stdout  # the fit is a function of the samples alone


# -- the loop's choice of model ---------------------------------------------------------------------
def _feed(model: OnlineModel, truth: CostModel.Config, rounds: int) -> None:
    sizes = (1 << 16, 1 << 20, 1 << 22, 1 << 24)
    for _ in range(rounds):
        for algorithm in ("ring", "rhd", "direct"):
            for nbytes in sizes:
                terms = cost_terms(model.schedule(algorithm), nbytes, weights=truth)
                model.add(algorithm, nbytes, CostModel(truth).predict_terms(terms))
            model.refit()


def test_the_loop_keeps_the_model_that_predicted_unseen_samples_best() -> None:
    """Samples with a real reduction cost: alpha-beta-gamma predicts them and the loop switches to
    it; samples without one: the models tie and the simplest, alpha-beta, stays."""
    prior = CostModel.Config(alpha=1e-3, beta=1e-6)
    reducing = OnlineModel(6, prior)
    _feed(reducing, CostModel.Config(alpha=50e-6, beta=1 / 125e6, gamma=8e-9), rounds=2)
    info = reducing.fit_info
    assert all(len(errors) >= MIN_SCORED for errors in reducing._scores.values())
    assert info["model"] == "alpha-beta-gamma", info
    assert info["model_errors"]["alpha-beta-gamma"] < info["model_errors"]["alpha-beta"]
    assert reducing.config.gamma == pytest.approx(8e-9, rel=1e-2)
    # its predictions carry the reduction cost into the simulator
    plain = reducing.predict("ring", 1 << 24)
    assert plain == pytest.approx(
        simulate(
            generate("ring", Situation(world_size=6)),
            1 << 24,
            Network.uniform(6, alpha=reducing.config.alpha, bandwidth=1 / reducing.config.beta, gamma=8e-9),
        ).time_from_last_arrival,
        rel=1e-2,
    )
    flat = OnlineModel(6, prior)
    _feed(flat, CostModel.Config(alpha=50e-6, beta=1 / 125e6), rounds=2)
    assert flat.fit_info["model"] == "alpha-beta" and flat.config.gamma == 0.0
