#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the built-in default training job.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
exec "${PSTAR_BUILD_DIR:-$root/build}/bin/pstar" train "$@"
