#!/usr/bin/env bash
# evidence-full in ONE device call on an H100 or H200 (no internet, no installs). From the repository root:
#   OUT=$OUT bash benchmarks/gpu_evidence.sh [gpu_evidence.py options]     (--smoke: tiny models, any CPU)
# Before it, the models travel in parts (python benchmarks/gpu_stage.py here; one call per .gpu-stage/K folder
# copies it to /tmp/w2s-stage there); this script joins them, checks their sha256 and builds the model cache from
# them, installs the dependency wheels carried in .whl/ into /tmp/site (when pydantic or gguf is missing), runs
# benchmarks/gpu_evidence.py. Both clocks start here: W2S_EVIDENCE_T0 tells the Python side when, so its budget
# (--budget-s, 360 s) counts the wheel install and the joining too, and `timeout` stops it HARD_S (420) seconds
# after this line. The summary is rewritten after every finished cell, so a hard stop still leaves the cells done.
# Results: $OUT/gpu_evidence.md, gpu_evidence.json, report.md, gpu_evidence.log (OUT defaults to /tmp/w2s-evidence):
# 4 files; the run and select folders live in /tmp/w2s-evidence-work, outside $OUT (8 files come back at most).
export W2S_EVIDENCE_T0="${W2S_EVIDENCE_T0:-$(date +%s.%N)}"
HARD_S="${HARD_S:-420}"
set -u -o pipefail  # a pipeline's status is its first failure, not tee's
PY="${PYTHON:-python3}"  # the device image's python3 holds torch; here e.g. PYTHON=.venv/bin/python
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/w2s-evidence}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if ! "$PY" -c "import pydantic, gguf" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" \
    || echo "dependency wheel install failed"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STAGE="${W2S_STAGE:-/tmp/w2s-stage}"
if [ -f "$STAGE/MANIFEST.json" ]; then
  "$PY" benchmarks/gpu_stage.py --assemble "$STAGE" --into /tmp/w2s-wheels 2>&1 | tee "$OUT/gpu_evidence.log" \
    && export W2S_SHIFT_WHEEL_DIR=/tmp/w2s-wheels
fi
export W2S_SHIFT_CACHE="${W2S_SHIFT_CACHE:-/tmp/w2s-cache}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/gpu_evidence.log"
LEFT=$(( HARD_S - ($(date +%s) - ${W2S_EVIDENCE_T0%.*}) ))
[ "$LEFT" -gt 10 ] || LEFT=10
timeout "$LEFT" "$PY" benchmarks/gpu_evidence.py --out "$OUT" "$@" 2>&1 | tee -a "$OUT/gpu_evidence.log"
exit "${PIPESTATUS[0]}"
