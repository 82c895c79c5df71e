#!/usr/bin/env bash
# The main job: set up stragglerkit, then
#  1. compare StragglAR with ring and RHD on a simulated scale-up network (the StragglAR paper's
#     analytic setting: alpha 3 us, 450 GB/s, 1 GiB buffer, a persistent straggler that arrives as
#     the others finish StragglAR's pre-phase);
#  2. measure StragglAR and OptCC against gloo's own all_reduce on real ranks: 8 emulated hosts
#     with 1 Gbit/s NICs (network namespaces; needs root), a persistent straggler (delay = the
#     measured pre-phase), then one host's NIC at half speed. Without root it runs over loopback
#     (no NIC to degrade there, so only the straggler part). About 3 minutes in all (32 MiB buckets,
#     3 iterations each; at 8 MiB the gains are within the noise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/stragglerkit simulate --algorithms ring,rhd,direct,stragglar --world-sizes 4,8,16,64,256 \
  --size 1GiB --alpha 3us --bandwidth 450GB/s --delay auto

SHORT=(--world-size 8 --sizes 32MiB --iters 3 --warmup 1)
if .venv/bin/python -c 'import sys; from stragglerkit.testbed import EmulatedCluster; sys.exit(not EmulatedCluster.available()[0])'; then
  .venv/bin/stragglerkit bench "${SHORT[@]}" --bandwidth 1Gbit --algorithms gloo,stragglar --straggler 7 --delay auto
  .venv/bin/stragglerkit bench "${SHORT[@]}" --bandwidth 1Gbit --algorithms gloo,optcc --degrade 3:2
else
  echo "[demo] no emulated cluster here (needs root and iproute2): measuring over loopback instead"
  .venv/bin/stragglerkit bench "${SHORT[@]}" --loopback --algorithms gloo,stragglar --straggler 7 --delay auto
fi
