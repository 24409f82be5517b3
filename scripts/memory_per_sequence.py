#!/usr/bin/env python3
"""Resident memory of a loaded engine with 1 and N sequences, and so the memory each extra sequence costs.

Usage: .venv/bin/python scripts/memory_per_sequence.py [--models qwen2.5-coder-0.5b,qwen2.5-coder-1.5b]
       [--ctx 4096] [--sequences 4]
Each measurement loads the model in a fresh process (llama.cpp clears the KV cache it allocates,
so its pages are resident from the start) and reads VmRSS from /proc.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

PROBE = """
import sys
from pathlib import Path
from proxy.engine.llama import EngineOptions, LlamaEngine
from proxy.models.fetch import resolve
engine = LlamaEngine(EngineOptions(resolve(sys.argv[1]), n_ctx=int(sys.argv[2]), n_threads=1, n_seq=int(sys.argv[3])))
print(Path("/proc/self/status").read_text())
"""


def resident_mib(model: str, ctx: int, sequences: int) -> float:
    """VmRSS of a process that loaded `model` with this many sequences of ctx tokens."""
    out = subprocess.run([sys.executable, "-c", PROBE, model, str(ctx), str(sequences)], check=True,
                         capture_output=True, text=True).stdout
    return int(re.search(r"VmRSS:\s+(\d+) kB", out).group(1)) / 1024  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--sequences", type=int, default=4)
    args = parser.parse_args()
    for model in args.models.split(","):
        one, many = resident_mib(model, args.ctx, 1), resident_mib(model, args.ctx, args.sequences)
        print(f"{model}: ctx {args.ctx} per sequence: 1 sequence {one:.0f} MiB, {args.sequences} sequences "
              f"{many:.0f} MiB: {(many - one) / (args.sequences - 1):.0f} MiB per extra sequence")


if __name__ == "__main__":
    main()
