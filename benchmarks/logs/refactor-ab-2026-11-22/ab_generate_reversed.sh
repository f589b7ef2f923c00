#!/usr/bin/env bash
# One more generation A/B round with the trees in the other order (drift check).
PY=/work/main/.venv/bin/python
for shape in a b; do for tree in baseline main; do
  (cd /tmp && PYTHONPATH=/work/$tree $PY /work/notes/ab_generate.py $shape 5) >> /work/notes/ab_generate.log 2>&1
done; done
echo "== end $(date -u '+%H:%M:%S')" >> /work/notes/ab_generate.log
