"""A degraded NIC (l = 2) on the emulated cluster: detected from the executor's timings, OptCC chosen."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from stragglerkit.testbed.netns import EmulatedCluster

ROOT = Path(__file__).resolve().parents[1]
AVAILABLE, REASON = EmulatedCluster.available()


@pytest.mark.skipif(not AVAILABLE, reason=f"emulated cluster unavailable: {REASON}")
def test_degraded_nic_is_detected_and_optcc_chosen() -> None:
    hosts, steps, degraded = 4, 70, 2
    config = EmulatedCluster.Config(
        hosts=hosts,
        bandwidth=100e6,  # 800 Mbit/s per host
        slowdowns={degraded: 2.0},
        prefix="skdetect-",
        network="198.19.40.0/24",
    )
    with tempfile.TemporaryDirectory() as out, EmulatedCluster(config) as cluster:
        env = {"PYTHONPATH": str(ROOT)}
        worker = [sys.executable, str(ROOT / "tests" / "ddp_emulated_worker.py"), out, str(steps)]
        procs = [cluster.popen(h, worker, env={**env, **cluster.torch_env(h, port=29731)}) for h in range(hosts)]
        codes = [p.wait(timeout=240) for p in procs]
        assert codes == [0] * hosts, codes
        results = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(hosts)]
    assert all(r["checksum"] == results[0]["checksum"] for r in results)
    events = results[0]["events"]
    summary = [(e["step"], e["kind"], e["algorithm"]) for e in events]
    assert all([(e["step"], e["kind"]) for e in r["events"]] == [s[:2] for s in summary] for r in results)
    found = [e for e in events if e["kind"] == "detected_degraded"]
    assert found, (summary, {k: results[0]["detector"].get(k) for k in ("l_estimates", "l_median")})
    assert set(found[0]["evidence"]["ranks"]) == {str(degraded)}, found[0]["evidence"]
    # busy-period estimates of l = 2 read 2.15-2.2 here (the slow link's shaping loses a little more)
    assert 1.8 <= found[0]["evidence"]["ranks"][str(degraded)] <= 2.5, found[0]["evidence"]
    switch = [e for e in events if e["kind"] == "switch"]
    assert switch and switch[0]["algorithm"] == "optcc", summary
    assert switch[0]["evidence"]["to"]["slowdowns"].keys() == {str(degraded)}
    assert "detected_straggler" not in {e["kind"] for e in events}
    assert "optcc" in results[0]["algorithms"]
