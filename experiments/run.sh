#!/usr/bin/env bash
# Reproduce docs/results.md with the embedded pair: every method on NQ/TriviaQA/SQuAD (N_QA), GSM8K (N_GSM) and Flores
# in both directions (N_MT), the ablations on NQ and TriviaQA (B, diversity, τΔ) and the exploration strategies
# (surface/embedding/beam × B=2..5) on NQ, TriviaQA and SQuAD, then the tables and figures. Results are appended to
# results/<task>.jsonl as they come and a rerun resumes; the committed per-example results (results/*.jsonl.gz) are
# unpacked first, so with the default sizes (the ones in docs/results.md) a rerun only rebuilds the report.
#   rm results/*.jsonl*; experiments/run.sh           # everything from scratch: about 3 hours on 2 CPU cores
#   N_QA=10 N_GSM=3 N_MT=5 OUT=/tmp/r experiments/run.sh   # a quick look (well under an hour)
#   REDO="mixture beam" experiments/run.sh                  # decode these methods again with the current code
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results}
mkdir -p "$OUT"
for f in "$OUT"/*.jsonl.gz; do [ -e "$f" ] && [ ! -e "${f%.gz}" ] && gunzip -k "$f"; done
${PYTHON:-.venv/bin/python} experiments/run.py --out "$OUT" --n-qa "${N_QA:-50}" --n-gsm "${N_GSM:-20}" --n-mt "${N_MT:-30}" \
    --workers "${WORKERS:-$(nproc)}" ${REDO:+--redo $REDO}
${PYTHON:-.venv/bin/python} -m experiments.report "$OUT" docs
gzip -nkf "$OUT"/*.jsonl
