"""The summary of scripts/gpu_check.sh: one table of every check, and OUTDIR/gpu_check.json.

Reads what the script left in OUTDIR (the build's exit code and time, pytest's JUnit XML of
tests/test_gpu.py, bench_cuda_reduce.json, the Megatron example's summaries). Exits 1 when
anything failed, was skipped (on a GPU machine nothing may skip) or is missing.

    python scripts/gpu_check_summary.py OUTDIR BUILD_EXIT_CODE
"""

from __future__ import annotations

import json
import math
import os
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any


def test_rows(junit: Path) -> list[dict[str, Any]]:
    if not junit.exists():
        return [{"check": "tests/test_gpu.py", "ok": False, "detail": "did not run (no JUnit XML)"}]
    rows = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        detail = f"{float(case.get('time', 0)):.1f} s"
        if outcome is not None:
            message = (outcome.get("message") or "").splitlines()[0][:100] if outcome.get("message") else ""
            detail = f"{outcome.tag}: {message}"
        rows.append({"check": f"test {case.get('name')}", "ok": outcome is None, "detail": detail})
    return rows or [{"check": "tests/test_gpu.py", "ok": False, "detail": "no test ran"}]


def bench_rows(bench: Path) -> list[dict[str, Any]]:
    if not bench.exists():
        return [{"check": "kernel bandwidth", "ok": False, "detail": "did not run (no bench_cuda_reduce.json)"}]
    summary = json.loads(bench.read_text())
    target = summary["target_share_of_copy"]
    rows = []
    for dtype, r in summary["results"].items():
        rows.append(
            {
                "check": f"kernel bandwidth {dtype}",
                "ok": r["kernel_share_of_copy"] >= target,
                "detail": f"{r['kernel_GBps']:.0f} GB/s = {r['kernel_share_of_copy']:.1%} of copy "
                f"({r['copy_GBps']:.0f} GB/s; torch add {r['torch_add_share_of_copy']:.1%}); target {target:.0%}",
            }
        )
    return rows


def megatron_rows(outdir: Path) -> list[dict[str, Any]]:
    """examples/megatron/train_gpt.py on one GPU, 4 ranks over gloo, rank 3 late: flag off, then on."""
    rows = []
    for flag in ("off", "on"):
        path = outdir / f"megatron_{flag}.json"
        check = f"megatron-core GPT, flag {flag}"
        if not path.exists():
            rows.append({"check": check, "ok": False, "detail": f"did not finish (see megatron_{flag}.log)"})
            continue
        run = json.loads(path.read_text())
        losses = run["losses"]
        falling = all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
        switched = [e for e in run["events"] if e["kind"] == "switch"]
        ok = falling and (flag == "off" or bool(switched))
        detail = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, median step {run['median_step_ms']:.0f} ms"
        if flag == "on":
            detail += ", " + (
                f"switched to {switched[0]['algorithm']} at step {switched[0]['step']}" if switched else "no switch"
            )
        rows.append({"check": check, "ok": ok, "detail": detail})
    return rows


def main() -> int:
    outdir, build_rc = Path(sys.argv[1]), int(sys.argv[2])
    seconds = (outdir / "build_seconds").read_text().strip() if (outdir / "build_seconds").exists() else "?"
    rows = [{"check": "build stragglerkit._C with CUDA", "ok": build_rc == 0, "detail": f"{seconds} s"}]
    if build_rc == 0:
        rows += test_rows(outdir / "gpu_tests.xml")
        rows += bench_rows(outdir / "bench_cuda_reduce.json")
        rows += megatron_rows(outdir)
    width = max(len(r["check"]) for r in rows)
    print(f"\n{'check':<{width}}  result  detail")
    for r in rows:
        print(f"{r['check']:<{width}}  {'ok' if r['ok'] else 'FAIL':<6}  {r['detail']}")
    ok = all(r["ok"] for r in rows)
    print(f"\nGPU check: {'all passed' if ok else 'FAILED'}")
    record = {"ok": ok, "commit": os.environ.get("GPU_CHECK_COMMIT"), "rows": rows}
    (outdir / "gpu_check.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
