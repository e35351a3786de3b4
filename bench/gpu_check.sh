#!/usr/bin/env bash
# The GPU check in one call (adafuse/harness/gpu_check.py; the models and the reference timings it is compared with:
# experiments/gpu_check.json), sized for one 600 s call of the lent machine: within ~480 s on an H200.
#
# Here, once (network to PyPI; writes ignored folders, ~50 MB to carry):
#   bench/gpu_check.sh --prepare     # tokenizers + prompts into bench/gpu, the project's pinned wheels into .whl
# There (carry bench/gpu and .whl; torch is the machine's own):
#   bench/gpu_check.sh               # prints the checks and three tables; every number in ${OUT:-/tmp}/gpu_check.json
# Here, to check the script itself on 2-layer models of the same vocabularies (a few minutes on 2 cores):
#   bench/gpu_check.sh --tiny
#
# What one call runs, and what it costs on an H200 (results/gpu/gpu_check.log: 0.29 s per B=3 round, one word per
# round on random weights; a model's build and the cache checks ~30 s):
#   --attention 1 8 32       ms per packed forward of 1, 8, 32 requests with each attention mode (loop, one, rows,
#                            auto): ~10 s
#   --questions 3 --words 8  the methods' table (12 runs: each model greedy, AdaFuse B=1/3 × τΔ 0.7/0 × side by side
#                            or not, speculative) on 3 questions: ~12 × 3 × 8 × 0.25 s ≈ 75 s
#   --concurrency 1 8 32 --prompts 32   many decodes at once, B=3: one at a time 32 × 8 × 0.29 s ≈ 75 s, then 8 and
#                            32 in flight (target: ≥ 10× the examples per minute of one at a time at 32)
#   first, the conformance suite (tests/test_conformance.py, tiny models of 13 families on the GPU: each packed mode
#   against each family's own forward): ~20 s; its log in ${OUT:-/tmp}/conformance.log, the summary printed
# Later arguments override these (e.g. --questions 0 skips the methods' table).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
PINS="transformers==5.2.0 tokenizers==0.22.2 gguf==0.19.0 pytest==9.0.3 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0"
if [ "${1:-}" = "--prepare" ]; then
  "$PY" -m adafuse.harness.gpu_check --prepare bench/gpu
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl $PINS
  du -sh bench/gpu .whl
  exit 0
fi
if [ -d .whl ] && ! "$PY" -c "import transformers, sys; sys.exit(transformers.__version__ != '5.2.0')" 2>/dev/null; then
  # the project's pins, carried as wheels (the machine reaches no index): ../shared/GPU.md
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
DEVICE=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
ADAFUSE_CONFORMANCE_DEVICE=$DEVICE timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_conformance.py \
    > "${OUT:-/tmp}/conformance.log" 2>&1 || true
echo "conformance suite on $DEVICE:"; grep -E "^(FAILED|ERROR)|passed|failed" "${OUT:-/tmp}/conformance.log" | tail -n 20
exec "$PY" -m adafuse.harness.gpu_check --spec experiments/gpu_check.json --dir bench/gpu \
    --out "${OUT:-/tmp}/gpu_check.json" --attention 1 8 32 --questions 3 --words 8 --concurrency 1 8 32 --prompts 32 \
    "$@"
