"""What the bench's measurements cost beyond the model, per message on the critical path.

Every row of ``stragglerkit bench --json`` on the emulated cluster carries the model's prediction
(``predicted_s``: the simulator at the link rates, with ``alpha`` per message) and the critical
path of its median iteration (``critical_path.messages``: how many messages the path crosses).
This script reads every such file under the given paths, takes the rows of the 8-rank runs with a
degraded NIC or no fault (straggler rows are left out: their delay is part of the time), and
groups them by link rate, algorithm, degraded NICs and the ``STRAGGLERKIT_*`` settings the run had
(which pick OptCC's segment count, chunk sizes and send buffer): per group the medians of the
model, the measurement, their difference, the messages on the critical path and the difference
per message.

If the excess were the bytes (TCP sharing a NIC less evenly than the model), four times slower
links would show about four times the excess in milliseconds. If it is a cost per message on a
tight path (set-up, the receiver's ready notice, hand-offs between threads, wake-ups), it stays
about the same in milliseconds at every link rate, and a schedule with many messages on its
critical path (OptCC: a chain of q - 1 hops per stage and segment) pays it over and over.

Then, with ``--fit``, per group the per-message cost ``alpha`` at which the model (the simulator,
as the bench runs it, with that run's ``STRAGGLERKIT_*`` settings) gives the group's median time
(bisection; the model grows with ``alpha``), and, at the median of the fitted costs of every
group of the algorithms named by ``--reference`` (by default the balanced ring: few messages, and
a model that moves with their cost), the best OptCC plan for each
degraded NIC seen: every segment count in ``--segments``, closed-form and LP sizes, with and
without bubble fills. If one cost explains every algorithm, and no OptCC plan meets a target
under it, the target is bounded by what a message costs on the machine, not by the plan.

    python profiling/per_message_cost.py profiling/results --fit --json profiling/results/per_message_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from _meta import write_record

WORLD_SIZE = 8


def bench_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """One dict per usable row: file, bandwidth (bytes/s), algorithm, scenario, messages, time, model."""
    found: list[dict[str, Any]] = []
    files = sorted({f for p in paths for f in ([p] if p.is_file() else p.rglob("*.json"))})
    for file in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("header"), dict) or "rows" not in data:
            continue
        header = data["header"]
        if header.get("mode") != "emulated":
            continue
        bandwidth = header.get("config", {}).get("bandwidth")
        environment = header.get("environment") or {}
        named = {k.removeprefix("STRAGGLERKIT_"): v for k, v in environment.items()}
        congestion = header.get("config", {}).get("tcp_congestion_control")
        if congestion:  # asked for on the command line (the machine's own otherwise)
            named["tcp_congestion_control"] = congestion
        settings = " ".join(f"{k}={v}" for k, v in sorted(named.items())) or "-"
        for row in data["rows"]:
            path = row.get("critical_path") if isinstance(row, dict) else None
            if not path or row.get("predicted_s") is None or row.get("world_size") != WORLD_SIZE:
                continue
            if row.get("scenario") == "straggler":
                continue
            found.append(
                {
                    "file": str(file),
                    "bandwidth_Bps": bandwidth,
                    "algorithm": row["algorithm"],
                    "scenario": row["scenario"],
                    "slowdowns": row.get("slowdowns") or {},
                    "settings": settings,
                    "size_bytes": int(row["size_bytes"]),
                    "payload_Bps": float(min(header["cluster"]["expected_payload_Bps"])),
                    "messages": int(path["messages"]),
                    "time_s": float(row["time_s"]),
                    "predicted_s": float(row["predicted_s"]),
                    "post_lag_s": float(path["post_lag_s"]),
                    "fault_free_gloo_s": (
                        float(row["time_s"]) * float(row["speedup_vs_fault_free_gloo"])
                        if row.get("speedup_vs_fault_free_gloo")
                        else None
                    ),
                    "wire_excess_s": float(path["wire_s"]) - float(path["wire_ideal_s"] or 0.0),
                }
            )
    return found


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_rate: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_rate[row["bandwidth_Bps"]].append(row)
    rates = []
    for rate, some in sorted(by_rate.items()):
        groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
        for row in some:
            slow = ",".join(f"{k}:{v:.3g}" for k, v in sorted(row["slowdowns"].items())) or "-"
            groups[(row["algorithm"], row["scenario"], slow, row["settings"])].append(row)
        rates.append(
            {
                "bandwidth_Bps": rate,
                "payload_Bps": statistics.median(r["payload_Bps"] for r in some),
                "fault_free_gloo_s_median": (
                    statistics.median(free)
                    if (free := [r["fault_free_gloo_s"] for r in some if r["fault_free_gloo_s"] is not None])
                    else None
                ),
                "groups": [
                    {
                        "algorithm": algorithm,
                        "scenario": scenario,
                        "slowdowns": slow,
                        "settings": settings,
                        "slowdowns_map": group[0]["slowdowns"],
                        "rows": len(group),
                        "messages_median": statistics.median(r["messages"] for r in group),
                        "predicted_s_median": statistics.median(r["predicted_s"] for r in group),
                        "time_s_median": statistics.median(r["time_s"] for r in group),
                        "excess_s_median": statistics.median(r["time_s"] - r["predicted_s"] for r in group),
                        "excess_per_message_s_median": statistics.median(
                            (r["time_s"] - r["predicted_s"]) / r["messages"] for r in group
                        ),
                        "post_lag_s_median": statistics.median(r["post_lag_s"] for r in group),
                        "wire_excess_s_median": statistics.median(r["wire_excess_s"] for r in group),
                    }
                    for (algorithm, scenario, slow, settings), group in sorted(groups.items())
                ],
            }
        )
    return {"rates": rates}


_SETTINGS = ("STRAGGLERKIT_OPTCC_SIZING", "STRAGGLERKIT_OPTCC_BUBBLE_FILLING", "STRAGGLERKIT_OPTCC_MESSAGE_BYTES")


def _model_seconds(algorithm: str, slowdowns: dict[int, float], nbytes: int, rate: float, alpha: float) -> float:
    """The bench's model of one row (bench/results.py ``_predict``) at per-message cost ``alpha``."""
    from stragglerkit.runtime.api import optcc_situation
    from stragglerkit.schedules.registry import Situation, generate
    from stragglerkit.sim import Network, simulate

    situation = Situation(world_size=WORLD_SIZE, slowdowns=slowdowns)
    if algorithm == "optcc":
        situation = optcc_situation(situation, nbytes)
    schedule = generate("ring" if algorithm == "gloo" else algorithm, situation)
    network = Network.uniform(WORLD_SIZE, alpha=alpha, bandwidth=rate, slowdowns=slowdowns)
    return float(simulate(schedule, nbytes, network).time_from_last_arrival)


def fitted_alpha(group: dict[str, Any], nbytes: int, rate: float, most: float = 3e-3) -> float | None:
    """The per-message cost at which the model gives the group's median time (None: outside 0..most)."""
    settings = dict(item.split("=", 1) for item in group["settings"].split()) if group["settings"] != "-" else {}
    saved = {name: os.environ.get(name) for name in _SETTINGS}
    try:
        for name in _SETTINGS:
            os.environ.pop(name, None)
        os.environ.update({f"STRAGGLERKIT_{k}": v for k, v in settings.items() if f"STRAGGLERKIT_{k}" in _SETTINGS})
        slowdowns = {int(k): float(v) for k, v in group["slowdowns_map"].items()}
        target = group["time_s_median"]

        def model(alpha: float) -> float:
            return _model_seconds(group["algorithm"], slowdowns, nbytes, rate, alpha)

        low, high = 0.0, most
        if not model(low) <= target <= model(high):
            return None
        for _ in range(14):
            middle = (low + high) / 2
            low, high = (middle, high) if model(middle) < target else (low, middle)
        return (low + high) / 2
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def best_optcc(
    slowdowns: dict[int, float], nbytes: int, rate: float, alpha: float, segments: list[int]
) -> list[dict[str, Any]]:
    """OptCC's model time for every segment count, sizing and bubble filling at ``alpha``, best first."""
    from stragglerkit.schedules.registry import Situation, generate
    from stragglerkit.sim import Network, simulate

    network = Network.uniform(WORLD_SIZE, alpha=alpha, bandwidth=rate, slowdowns=slowdowns)
    plans = []
    for k in segments:
        for sizing in ("closed_form", "lp"):
            for filling in (False, True):
                situation = Situation(
                    world_size=WORLD_SIZE, slowdowns=slowdowns, segments=k, bubble_filling=filling, optcc_sizing=sizing
                )
                seconds = float(simulate(generate("optcc", situation), nbytes, network).time_from_last_arrival)
                plans.append({"segments": k, "sizing": sizing, "bubble_filling": filling, "model_s": seconds})
    return sorted(plans, key=lambda plan: plan["model_s"])


def fit_costs(summary: dict[str, Any], nbytes: int, reference: list[str], segments: list[int]) -> None:
    """Adds ``alpha_fitted_s`` to every group and, per rate, ``reference_alpha_s`` and ``optcc_at_reference``."""
    for rate in summary["rates"]:
        for group in rate["groups"]:
            group["alpha_fitted_s"] = fitted_alpha(group, nbytes, rate["payload_Bps"])
            print(
                f"{rate['bandwidth_Bps'] * 8 / 1e6:.0f} Mbit/s {group['algorithm']:>13} {group['slowdowns']:>8} "
                f"{group['settings'][:40]:>40}: model = median at alpha "
                + ("outside 0..3 ms" if group["alpha_fitted_s"] is None else f"{group['alpha_fitted_s'] * 1e3:.2f} ms")
            )
        fitted = [
            g["alpha_fitted_s"]
            for g in rate["groups"]
            if g["algorithm"] in reference and g["alpha_fitted_s"] is not None
        ]
        if not fitted:
            continue
        alpha = statistics.median(fitted)
        rate["reference_alpha_s"] = alpha
        rate["optcc_at_reference"] = []
        for slowdowns in sorted({g["slowdowns"] for g in rate["groups"] if g["algorithm"] == "optcc"}):
            one = next(g for g in rate["groups"] if g["slowdowns"] == slowdowns)
            mapping = {int(k): float(v) for k, v in one["slowdowns_map"].items()}
            plans = best_optcc(mapping, nbytes, rate["payload_Bps"], alpha, segments)
            ideal = best_optcc(mapping, nbytes, rate["payload_Bps"], 0.0, segments)[0]
            rate["optcc_at_reference"].append(
                {"slowdowns": slowdowns, "plans": plans, "best_without_message_cost": ideal}
            )
            best = plans[0]
            free = rate["fault_free_gloo_s_median"]
            over = f" = {100 * (best['model_s'] / free - 1):.1f} % over fault-free gloo's median" if free else ""
            print(
                f"  at alpha {alpha * 1e3:.2f} ms ({', '.join(reference)}), OptCC {slowdowns}: best plan k = "
                f"{best['segments']} {best['sizing']} fills {best['bubble_filling']}: "
                f"{best['model_s'] * 1e3:.1f} ms{over} "
                f"(at alpha 0: k = {ideal['segments']} {ideal['sizing']} fills {ideal['bubble_filling']}: "
                f"{ideal['model_s'] * 1e3:.1f} ms)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="bench JSON files or folders to search")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--fit", action="store_true", help="also fit the per-message cost per group (simulations)")
    parser.add_argument(
        "--reference",
        default="balanced_ring",
        help="algorithms whose fitted cost (default settings) predicts OptCC's plans (default balanced_ring: its "
        "model moves with the cost, a ring's hardly)",
    )
    parser.add_argument("--segments", default="3,5,7,9,12,18", help="OptCC segment counts to model at that cost")
    parser.add_argument("--size", type=int, default=32 * 2**20, help="bucket bytes of the rows used (default 32 MiB)")
    args = parser.parse_args()
    rows = [r for r in bench_rows(args.paths) if r["size_bytes"] == args.size]
    if not rows:
        raise SystemExit("no 8-rank emulated bench rows with a critical path and a model under the given paths")
    summary = summarise(rows)
    for rate in summary["rates"]:
        print(f"{rate['bandwidth_Bps'] * 8 / 1e6:.0f} Mbit/s")
        for g in rate["groups"]:
            print(
                f"  {g['algorithm']:>13} {g['slowdowns']:>8} {g['settings'][:40]:>40}: {g['rows']:3d} rows, "
                f"{g['messages_median']:5.0f} messages, model {g['predicted_s_median'] * 1e3:7.1f} ms, "
                f"measured {g['time_s_median'] * 1e3:7.1f} ms, excess {g['excess_s_median'] * 1e3:6.1f} ms "
                f"({g['excess_per_message_s_median'] * 1e3:.2f} ms per message)"
            )
    if args.fit:
        fit_costs(summary, args.size, args.reference.split(","), [int(k) for k in args.segments.split(",")])
    if args.json:
        write_record(args.json, {"inputs": [str(p) for p in args.paths], "world_size": WORLD_SIZE, **summary})


if __name__ == "__main__":
    main()
