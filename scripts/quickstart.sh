#!/usr/bin/env bash
# One command from a fresh checkout to a running gridtune service with an answer:
# sets up .venv, starts `gridtune serve` on an embedded SQLite file, asks it for the best
# layout of GPT-3 175B on 1,024 A100s of Selene, prints the answer, and keeps serving
# (Ctrl-C stops it). Pass --no-wait to stop the server after the example query.
# It checks that the server answering is the one it started: a port already in use, or a server
# that exits or never answers, ends the script with exit status 1 and the reason.
# GRIDTUNE_PORT picks the port (8000); GRIDTUNE_SKIP_SETUP=1 skips the venv step (tests).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${GRIDTUNE_SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh
fi
PORT=${GRIDTUNE_PORT:-8000}
export GRIDTUNE_DATABASE_URL=${GRIDTUNE_DATABASE_URL:-sqlite:///$PWD/gridtune.db}
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then  # something already listens there
  echo "quickstart: port $PORT is already in use (another server?); stop it or set GRIDTUNE_PORT=<free port>" >&2
  exit 1
fi
LOG=$(mktemp "${TMPDIR:-/tmp}/gridtune-quickstart.XXXXXX.log")
.venv/bin/gridtune serve --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
ready=0
for _ in $(seq 1 300); do
  if ! kill -0 "$SERVER" 2>/dev/null; then
    echo "quickstart: the server exited before answering; its log ($LOG):" >&2
    tail -n 20 "$LOG" >&2
    exit 1
  fi
  if curl -sf "http://127.0.0.1:$PORT/livez" >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.1
done
if [ "$ready" != 1 ] || ! kill -0 "$SERVER" 2>/dev/null; then
  echo "quickstart: the server did not answer on port $PORT within 30 s; its log ($LOG):" >&2
  tail -n 20 "$LOG" >&2
  exit 1
fi
echo "== POST /v1/recommend (GPT-3 175B on 1,024 A100-80GB, Selene, global batch 1536)"
if ! ANSWER=$(curl -sf -X POST "http://127.0.0.1:$PORT/v1/recommend" -H 'content-type: application/json' \
  -d '{"model": {"preset": "gpt3-175b"}, "cluster": {"preset": "selene", "num_gpus": 1024},
       "training": {"global_batch_size": 1536, "dtype": "bf16"}, "top_k": 3}'); then
  echo "quickstart: POST /v1/recommend failed; server log ($LOG):" >&2
  tail -n 20 "$LOG" >&2
  exit 1
fi
printf '%s' "$ANSWER" | .venv/bin/python scripts/print_recommendation.py
if [ "${1:-}" = "--no-wait" ]; then exit 0; fi
echo "serving on http://127.0.0.1:$PORT (docs at /docs); Ctrl-C to stop"
wait $SERVER
