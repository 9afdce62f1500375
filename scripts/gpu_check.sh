#!/usr/bin/env bash
# Everything that needs a GPU, in one command (about 10 minutes on one H100 or H200; the steps' time limits bound it
# at 15):
#   bash scripts/gpu_check.sh OUTDIR [all|checks|timings|graphs]   (default all)
# (graphs: in about 5 minutes, the CUDA graphs' and the memory budget's CUDA tests, then step 6 at 64 and 2,048
# sentences, eager and replayed: a short first look where device time is scarce)
# Checks, run side by side (they time nothing):
# 1. the test suite's CUDA cases (every buffer backend on CUDA against the others, the fused Triton half-steps and
#    the persistent sweeps, host syncs under torch.cuda.set_sync_debug_mode, a whole reversible training step on the
#    GPU, its CUDA graphs against the eager step bit for bit, the memory budget against the allocator's peak);
# 2. ops dispatched per layer and step on CUDA (benchmarks/layers.py --count-kernels);
# 3. two Hogwild! workers on one GPU, and torchrun with NCCL on one GPU, on a toy corpus.
# Timings, one after the other with the GPU to themselves:
# 4. reversible layers against cuDNN nn.GRU / nn.LSTM, B = 64, T = 14 and 50 (benchmarks/layers.py);
# 5. the paper's IWSLT-size model (2+2 layers, 600 units, 600-dim embeddings, 60 slice units) on Multi30K:
#    revnmt-train's own tokens/s, the RevGRU's with --cuda-graphs on, against the cuDNN GRU's
#    (benchmarks/train_speed.py --device cuda --cuda-graphs on), and
#    revnmt-memory's report with the token batch that fits 8 GiB of the allocator's reserved memory. Needs
#    Multi30K (REVNMT_DATA or ./data/multi30k; skipped where neither has it: there is no download on a GPU node);
# 6. the IWSLT-size step as the batch grows, 64 to 32,768 sentences of 25 tokens, GRU on cuDNN against RevGRU on the
#    per-step kernels, eager and replayed from CUDA graphs, decoder chunks of 8 steps (benchmarks/batch_scaling.py:
#    step time, tokens/s, allocator peak).
# Every step has a time limit (seconds, in LIMITS below); a step past it counts as failed (exit 124).
# Writes a log and JSON per step into OUTDIR, a new or empty folder (its scratch files, the toy corpus and runs, are
# removed at the end), and a summary, OUTDIR/gpu_check.json; exits 1 if a step failed.
# Uses .venv if there is one (bash scripts/setup.sh dev), else the python3 on PATH with torch and triton.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/gpu_check.sh OUTDIR [all|checks|timings|graphs]}
what=${2:-all}
case $what in all|checks|timings|graphs) ;; *) echo "gpu_check: run all, checks, timings or graphs, not '$what'" >&2
                                             exit 2;; esac
# everything in OUTDIR is this script's, to write over and remove: a folder that holds anything is not
if [ -e "$out" ] && { [ ! -d "$out" ] || [ -n "$(ls -A "$out")" ]; }; then
    echo "gpu_check: $out exists and is not an empty folder; name a new one for the results" >&2
    exit 2
fi
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$py" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: no CUDA device here; nothing to check" >&2
    exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$py" - >"$out/device.json" <<'PY'
import json, torch
info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
for name in ("triton", "numba"):
    try:
        info[name] = __import__(name).__version__
    except ImportError:
        info[name] = None
print(json.dumps(info))
PY
cat "$out/device.json"

declare -A LIMITS=([tests]=300 [kernels]=150 [hogwild]=150 [torchrun]=150 [layers]=90 [iwslt-speed]=150
                   [iwslt-memory]=180 [batch-scale]=170)
step() {  # step NAME COMMAND...: run it under its time limit, log to OUTDIR/NAME.log, write OUTDIR/NAME.status
    local name=$1
    shift
    echo "== $name: $*"
    local start=$SECONDS
    timeout --kill-after 10 "${LIMITS[$name]}" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "{\"exit\": $rc, \"seconds\": $((SECONDS - start))}" >"$out/$name.status"
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    tail -n 25 "$out/$name.log"
}

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

# The checks share the GPU and the cores; their logs say only whether they passed. The tests run in 8 processes
# where pytest-xdist is installed: in one process they do not finish within their time limit on an H200.
workers=()
"$py" -c "import xdist" 2>/dev/null && workers=(-n 8)
if [ "$what" = graphs ]; then
    step tests "$py" -m pytest -q -m "not slow" -p no:cacheprovider --tb=short --junitxml "$out/tests.xml" \
        -k "cuda and (graph or budget or sync)" tests/revnmt/training tests/revnmt/memory tests/revnmt/model
    step batch-scale "$py" benchmarks/batch_scaling.py --device cuda --rnn gru revgru --lengths 25 \
        --sentences 64 2048 --decoder-chunk-steps 8 --sweep-kernels steps --cuda-graphs off on --deadline 140 \
        --json "$out/batch-scale.json"
fi
if [ "$what" = all ] || [ "$what" = checks ]; then
    step tests "$py" -m pytest -q -m "not slow" -p no:cacheprovider "${workers[@]}" --tb=short \
        --junitxml "$out/tests.xml" -k "cuda or test_triton_steps or test_triton_sweeps or triton_kernels" tests/buffers tests/revnmt &
    step kernels "$py" benchmarks/layers.py --device cuda --count-kernels --json "$out/kernels.json" &
    step hogwild "$py" -m revnmt.cli.train "${tiny[@]}" --save-dir "$out/runs/hogwild" --hogwild 2 &
    step torchrun "$py" -m torch.distributed.run --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29517 \
        -m revnmt.cli.train "${tiny[@]}" --save-dir "$out/runs/torchrun" &
    wait
fi

if [ "$what" = all ] || [ "$what" = timings ]; then
    step layers "$py" benchmarks/layers.py --device cuda --repeats 7 --json "$out/layers.json"
    if data=$("$py" -c "from revnmt.data import find_multi30k; print(find_multi30k(download=False))" 2>/dev/null); then
        iwslt=(--layers 2 --emb-dim 600 --hidden-size 600 --slice-dim 60)
        # one tokenization of the corpus for every run (revnmt-prepare's format, read memory-mapped)
        step iwslt-speed "$py" benchmarks/train_speed.py --device cuda --cuda-graphs on --threads 4 --steps 120 \
            --skip 40 --log-every 40 --runs "$out/runs/speed" --json "$out/iwslt-speed.json" \
            -- "${iwslt[@]}" --prepared "$out/prepared"
        step iwslt-memory "$py" -m revnmt.cli.memory --data-dir "$data" "${iwslt[@]}" --rnn revgru --batches 4 \
            --device cuda --memory-budget 8GiB --prepared "$out/prepared" --json "$out/iwslt-memory.json"
    else
        echo "== iwslt: skipped, Multi30K not found (set REVNMT_DATA)"
    fi
    step batch-scale "$py" benchmarks/batch_scaling.py --device cuda --lengths 25 --decoder-chunk-steps 8 \
        --sweep-kernels steps --cuda-graphs off on --deadline 140 --json "$out/batch-scale.json"
fi
rm -rf "$out/runs" "$out/prepared" "$toy"  # checkpoints are large and prove nothing the logs do not

summary=$(for f in "$out"/*.status; do n=$(basename "$f" .status); echo "\"$n\": $(cat "$f"),"; done)
summary="{${summary%,}}"
rm -f "$out"/*.status
echo "$summary" | tr -d '\n' >"$out/gpu_check.json"
cat "$out/gpu_check.json"
echo
[[ "$summary" != *'"exit": '[1-9]* ]]
