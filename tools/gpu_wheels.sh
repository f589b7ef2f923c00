#!/usr/bin/env bash
# Fill .whl/ with the wheels a CUDA machine's image lacks, at the versions this machine's .venv tests
# with, for the image's Python (3.12, manylinux x86_64): tools/gpu_check.sh installs them first, and a
# device call carries them (`carry: [".whl"]`; .whl/ is ignored by git). About 30 MB.
#     bash tools/gpu_wheels.sh [PYTHON_VERSION]
set -euo pipefail
PY_VERSION=${1:-3.12}
PIP=${PIP:-.venv/bin/pip}
# The serving extra, the Hub client tformer[hub] needs, the tokenizers/transformers versions the tests
# pin their references to, soxr for the speech tests' 8 kHz recordings, and what those bring.
PACKAGES="pydantic pydantic-core annotated-types typing-inspection starlette uvicorn h11
huggingface_hub hf-xet httpx2 httpcore2 truststore tokenizers transformers typer annotated-doc
shellingham rich markdown-it-py mdurl sniffio openai jiter soxr"
pins=$("$PIP" show $PACKAGES 2>/dev/null | awk '/^Name:/{name=$2} /^Version:/{print name "==" $2}')
mkdir -p .whl
# shellcheck disable=SC2086
"$PIP" download -q --only-binary=:all: --no-deps --dest .whl --python-version "$PY_VERSION" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_28_x86_64 $pins
ls .whl/*.whl | wc -l
