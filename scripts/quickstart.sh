#!/usr/bin/env bash
# The main job on a fresh machine: set up, train a RevGRU on Multi30K for a few minutes (CPU is
# fine), translate test2016, print BLEU and the activation-memory table.
#   bash scripts/quickstart.sh [extra revnmt-train options]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
run=runs/quickstart
bin=.venv/bin
# Multi30K is found in $REVNMT_DATA or ./data/multi30k, else downloaded into ./data/multi30k.
$bin/revnmt-train --data multi30k --save-dir "$run" --epochs 2 --test-beam 5 "$@"
data=$($bin/python -c "from revnmt.data import find_multi30k; print(find_multi30k())")
echo "== translating test2016 with $run/best.pt"
$bin/revnmt-translate --checkpoint "$run" -i "$data/test_2016_flickr.en.gz" -o "$run/test2016.de" \
    --reference "$data/test_2016_flickr.de.gz"
echo "== activation memory of the trained model (20 training batches of 64 sentences)"
$bin/revnmt-memory --checkpoint "$run" --batches 20 --json "$run/memory.json"
