#!/usr/bin/env bash
# Benchmark 4 in ONE device call on an H200 (no internet, no installs). From the repository root:
#   bash benchmarks/gpu_h200.sh [gpu_h200.py options]
# Wheels carried in .whl/ (see benchmarks/README.md: trl, datasets, dill, multiprocess) are unpacked into
# /tmp/site first; without them the TRL rows are skipped with the reason. Results: $OUT/gpu_h200.json and
# $OUT/gpu_h200.log (OUT defaults to /tmp/w2s-h200). The Python side stops starting rows after --budget-s
# (470 s); `timeout` below is the hard stop.
set -u
PY="${PYTHON:-python3}"  # the H200 image's python3 holds torch; here e.g. PYTHON=.venv-bench/bin/python
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/w2s-h200}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" \
    || echo "wheel install failed: TRL rows will be skipped"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | tee "$OUT/gpu_h200.log"
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT/gpu_h200.log"
import importlib
for m in ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "pydantic"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:
        print(m, "not importable:", type(e).__name__, str(e)[:120])
EOF
timeout 560 "$PY" benchmarks/gpu_h200.py --json "$OUT/gpu_h200.json" "$@" 2>&1 | tee -a "$OUT/gpu_h200.log"
exit "${PIPESTATUS[0]}"
