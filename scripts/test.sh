#!/usr/bin/env bash
# Installs dependencies (with the test-only ones), builds, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
scripts/build.sh
# The openai npm package (the real-client test) and @huggingface/transformers
# (the tokenizer reference); no install scripts: the tests need no native parts.
# A failed attempt shows the end of npm's own log (the cause: network, disk)
# and is retried.
for attempt in 1 2 3; do
  if (cd tests/node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error); then
    break
  fi
  echo "npm ci failed (attempt $attempt of 3); free disk: $(df -h . | tail -1)" >&2
  log=$(ls -t "${npm_config_cache:-$HOME/.npm}"/_logs/*-debug-0.log 2>/dev/null | head -1 || true)
  if [[ -n "$log" ]]; then tail -n 30 "$log" >&2; fi
  if ((attempt == 3)); then exit 1; fi
  sleep 15
done
cd build
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
