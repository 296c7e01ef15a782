#!/usr/bin/env bash
# Installs dependencies (with the test-only ones), builds, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
scripts/build.sh
# The openai npm package (the real-client test) and @huggingface/transformers
# (the tokenizer reference); no install scripts: the tests need no native parts.
(cd tests/node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
cd build
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
