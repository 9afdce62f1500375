#!/usr/bin/env bash
# Everything that needs a GPU, in one command (well under 10 minutes on one H100):
#   bash scripts/gpu_check.sh OUTDIR
# 1. the test suite's CUDA cases (buffer backends on CUDA, host syncs under torch.cuda.set_sync_debug_mode,
#    a whole reversible training step on the GPU, the memory budget against the allocator's peak);
# 2. ops dispatched per layer and step on CUDA (benchmarks/layers.py --count-kernels);
# 3. reversible layers against cuDNN nn.GRU / nn.LSTM, B = 64, T = 14 and 50 (benchmarks/layers.py);
# 4. two Hogwild! workers on one GPU, and torchrun with NCCL on one GPU, on a toy corpus.
# Writes a log and JSON per step into OUTDIR and a summary, OUTDIR/gpu_check.json; exits 1 if a step failed.
# Uses .venv if there is one (bash scripts/setup.sh dev), else the python3 on PATH with torch and triton.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/gpu_check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$py" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: no CUDA device here; nothing to check" >&2
    exit 2
fi
"$py" - >"$out/device.json" <<'PY'
import json, torch
info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
try:
    import triton
    info["triton"] = triton.__version__
except ImportError:
    info["triton"] = None
print(json.dumps(info))
PY
cat "$out/device.json"

results=()
step() {  # step NAME COMMAND...: run it, log to OUTDIR/NAME.log, remember its status
    local name=$1
    shift
    echo "== $name: $*"
    local start=$SECONDS
    "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    results+=("\"$name\": {\"exit\": $rc, \"seconds\": $((SECONDS - start))}")
}

step tests "$py" -m pytest -q -m "not slow" -p no:cacheprovider --junitxml "$out/tests.xml" \
    tests/buffers tests/revnmt/rnn tests/revnmt/model tests/revnmt/memory
step kernels "$py" benchmarks/layers.py --device cuda --count-kernels --json "$out/kernels.json"
step layers "$py" benchmarks/layers.py --device cuda --repeats 7 --json "$out/layers.json"

toy="$out/toy"
mkdir -p "$toy"
"$py" - "$toy" <<'PY'
import random, sys
from pathlib import Path

words = {"a": "ein", "the": "der", "man": "mann", "dog": "hund", "runs": "läuft", "sleeps": "schläft",
         "in": "in", "park": "park", "big": "großer", "red": "roter"}
rng, folder = random.Random(0), Path(sys.argv[1])
for split, size in {"train": 400, "valid": 40}.items():
    lines = [rng.choices(list(words), k=rng.randint(2, 9)) for _ in range(size)]
    (folder / f"{split}.en").write_text("".join(" ".join(s) + " .\n" for s in lines))
    (folder / f"{split}.de").write_text("".join(" ".join(words[w] for w in s) + " .\n" for s in lines))
PY
tiny=(--train "$toy/train" --valid "$toy/valid" --emb-dim 32 --hidden-size 32 --slice-dim 4 --min-freq 1
      --batch-size 32 --epochs 2 --log-every 5 --device cuda)
step hogwild "$py" -m revnmt.cli.train "${tiny[@]}" --save-dir "$out/runs/hogwild" --hogwild 2
step torchrun "$py" -m torch.distributed.run --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29517 \
    -m revnmt.cli.train "${tiny[@]}" --save-dir "$out/runs/torchrun"
rm -rf "$out/runs" "$toy"  # checkpoints are large and prove nothing the logs do not

summary=$(IFS=,; echo "{${results[*]}}")
echo "$summary" >"$out/gpu_check.json"
echo "$summary"
[[ "$summary" != *'"exit": '[1-9]* ]]
