"""python -m adafuse.harness.lm_eval_tasks [OUT]: (re)write the lm-eval task YAMLs from TASKS (default: this folder)."""
import sys
from pathlib import Path

from . import HERE, write_yamls

for path in write_yamls(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
    print(path)
