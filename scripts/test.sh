#!/usr/bin/env bash
# Set up (if needed) and run the whole default test suite: unit, multi-process (fork-launched
# gloo ranks), service (real uvicorn), and store tests on SQLite and on the PostgreSQL server
# named by GRIDTUNE_TEST_POSTGRES_URL (default: the local one at 127.0.0.1:5432).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
export GRIDTUNE_TEST_POSTGRES_URL=${GRIDTUNE_TEST_POSTGRES_URL:-postgresql+psycopg://postgres@127.0.0.1:5432/test}
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
