#!/usr/bin/env bash
# Installs dependencies, builds, and runs FailSafe's main job.
# Extra arguments are passed to the command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/src/cli/failsafe generate "$@"
