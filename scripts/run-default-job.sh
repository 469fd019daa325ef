#!/usr/bin/env bash
# Installs what building and running pstar needs, builds pstar alone (no
# operator, no tests), and runs the built-in default training job.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh" run
PSTAR_BUILD_TARGET=pstar bash "$root/scripts/build.sh" -DPSTAR_BUILD_TESTS=OFF -DPSTAR_BUILD_OPERATOR=OFF
exec "${PSTAR_BUILD_DIR:-$root/build}/bin/pstar" train "$@"
