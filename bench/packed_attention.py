"""The cost of one packed forward on this machine, attention as one call per layer against a call per request
(adafuse/models/packed.py), for 1, 8 and 32 requests of the shapes decodes send (adafuse/harness/attention_bench.py).

    python -m bench.packed_attention                         # the bundled pair, a 300-token context
    python -m bench.packed_attention --models smollm2-135m-instruct --context 1000 --repeats 7
Prints a table (ms per forward of each attention mode: a call per request, one dense call, one call over the rows
padded; 'waste': query-key pairs each single call computes over those needed; what "auto" picks) and writes it to
results/bench/packed_attention.txt with --out.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from adafuse.harness.attention_bench import attention_table
from adafuse.models import get_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--counts", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    lines = attention_table([get_model(n) for n in args.models], args.counts, args.context, args.repeats,
                            echo=lambda line: print(line, flush=True))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
