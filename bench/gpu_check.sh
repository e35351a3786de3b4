#!/usr/bin/env bash
# The GPU check in one call (see adafuse/harness/gpu_check.py; the models and the reference timings it is compared
# with: experiments/gpu_check.json). Prepare here first, then carry bench/gpu:
#   ./dev python -m adafuse.harness.gpu_check --prepare bench/gpu
# On the GPU box (torch + transformers installed, no Hub needed):
#   bench/gpu_check.sh            # prints the checks and the table; full numbers in ${OUT:-/tmp}/gpu_check.json
#   bench/gpu_check.sh --concurrency 1 8 32 64 --words 8   # many decodes at once: examples/min at each level,
#       outputs compared with one at a time (target: >= 10x at 32 in flight); 64 distinct prompts at every level.
#       --words 8: at the 0.29 s per B=3 round measured there (results/gpu/gpu_check.log) the level of one at a time
#       takes ~150 s; the default 24 words would take ~450 s of it, too much for one 600 s call.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
exec "$PY" -m adafuse.harness.gpu_check --spec experiments/gpu_check.json --dir bench/gpu \
    --out "${OUT:-/tmp}/gpu_check.json" "$@"
