#!/usr/bin/env bash
# One command from a fresh checkout to a running gridtune service with an answer:
# sets up .venv, starts `gridtune serve` on an embedded SQLite file, asks it for the best
# layout of GPT-3 175B on 1,024 A100s of Selene, prints the answer, and keeps serving
# (Ctrl-C stops it). Pass --no-wait to stop the server after the example query.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PORT=${GRIDTUNE_PORT:-8000}
export GRIDTUNE_DATABASE_URL=${GRIDTUNE_DATABASE_URL:-sqlite:///$PWD/gridtune.db}
.venv/bin/gridtune serve --host 127.0.0.1 --port "$PORT" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "== POST /v1/recommend (GPT-3 175B on 1,024 A100-80GB, Selene, global batch 1536)"
curl -sf -X POST "http://127.0.0.1:$PORT/v1/recommend" -H 'content-type: application/json' \
  -d '{"model": {"preset": "gpt3-175b"}, "cluster": {"preset": "selene", "num_gpus": 1024},
       "training": {"global_batch_size": 1536, "dtype": "bf16"}, "top_k": 3}' \
  | .venv/bin/python scripts/print_recommendation.py
if [ "${1:-}" = "--no-wait" ]; then exit 0; fi
echo "serving on http://127.0.0.1:$PORT (docs at /docs); Ctrl-C to stop"
wait $SERVER
