#!/usr/bin/env bash
# The main job: set up stragglerkit, then compare StragglAR with ring and RHD on a simulated
# scale-up network (the StragglAR paper's analytic setting: alpha 3 us, 450 GB/s, 1 GiB buffer,
# a persistent straggler that arrives as the others finish StragglAR's pre-phase).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/stragglerkit simulate --algorithms ring,rhd,direct,stragglar --world-sizes 4,8,16,64,256 \
  --size 1GiB --alpha 3us --bandwidth 450GB/s --delay auto
