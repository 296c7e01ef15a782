#!/usr/bin/env bash
# Installs dependencies, builds, and runs FailSafe's main job: the
# OpenAI-compatible server on 127.0.0.1:8000 with the default model (the real
# stories260K, which writes children's stories) on 8 devices (hybrid
# placement, load-aware routing, adaptive prefill, full recovery) and the
# admin API for failure injection (loopback only).
# Extra arguments go to `failsafe serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/src/cli/failsafe serve --enable-admin "$@"
