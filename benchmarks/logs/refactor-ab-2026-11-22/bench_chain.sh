#!/usr/bin/env bash
# Issue 10's no-regression figures, one after another on an otherwise idle machine.
set -u
PY=/work/main/.venv/bin/python
N=/work/notes
stamp() { echo "== $1 $(date -u '+%H:%M:%S') load: $(cut -d' ' -f1-3 /proc/loadavg)"; }
cd /work/main
stamp train_throughput > $N/train_throughput.log
$PY benchmarks/train_throughput.py --precisions fp32 >> $N/train_throughput.log 2>&1
stamp end >> $N/train_throughput.log
stamp generate_speed > $N/generate_speed.log
$PY benchmarks/generate_speed.py --part hf --repeats 5 --no-no-cache >> $N/generate_speed.log 2>&1
stamp end >> $N/generate_speed.log
: > $N/shakespeare_ab.log
for side in baseline main main baseline; do
  stamp "shakespeare $side" >> $N/shakespeare_ab.log
  if [ $side = baseline ]; then
    (cd /work/baseline && $PY benchmarks/shakespeare_char_now.py --repeat 1 --no-peer --threads 2) >> $N/shakespeare_ab.log 2>&1
  else
    (cd /work/main && $PY benchmarks/shakespeare_char.py --repeat 1 --no-peer --threads 2) >> $N/shakespeare_ab.log 2>&1
  fi
done
stamp end >> $N/shakespeare_ab.log
