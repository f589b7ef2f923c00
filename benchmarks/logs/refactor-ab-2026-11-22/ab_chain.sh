#!/usr/bin/env bash
# After bench_chain.sh: generation and training-step A/B between the tree before this session's
# refactor (/work/baseline = 34c244f) and main, alternated, on an otherwise idle machine.
set -u
PY=/work/main/.venv/bin/python
N=/work/notes
stamp() { echo "== $1 $(date -u '+%H:%M:%S') load: $(cut -d' ' -f1-3 /proc/loadavg)"; }
: > $N/ab_generate.log
for round in 1 2; do
  for tree in main baseline; do
    for shape in b a; do
      (cd /tmp && PYTHONPATH=/work/$tree $PY $N/ab_generate.py $shape 5) >> $N/ab_generate.log 2>&1
    done
  done
done
stamp end >> $N/ab_generate.log
: > $N/ab_train_throughput.log
for tree in main baseline main; do
  stamp "train_throughput b $tree" >> $N/ab_train_throughput.log
  (cd /tmp && PYTHONPATH=/work/$tree $PY /work/main/benchmarks/train_throughput.py --shapes b --precisions fp32) 2>&1 \
    | grep -v "^\[transformers\]" >> $N/ab_train_throughput.log
done
stamp end >> $N/ab_train_throughput.log
