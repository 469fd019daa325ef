#!/usr/bin/env bash
# Copies the files the Helm chart ships from their sources into
# charts/patrickstar/files/, so that the chart folder is self-contained (a
# copied or packaged chart needs nothing outside it): the CRD from crds/, the
# Grafana dashboards from dashboards/ and the alerting rules from alerts/. Run after changing either; the
# chart tests fail while a copy differs from its source.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
files="$root/charts/patrickstar/files"
rm -rf "$files/crds" "$files/dashboards" "$files/alerts"
mkdir -p "$files/crds" "$files/dashboards" "$files/alerts"
cp "$root/crds/patrickstarjob.yaml" "$files/crds/patrickstarjob.yaml"
cp "$root"/dashboards/*.json "$files/dashboards/"
cp "$root/alerts/patrickstar.rules.yaml" "$files/alerts/patrickstar.rules.yaml"
echo "sync-chart-files: $(ls "$files/crds" "$files/dashboards" "$files/alerts" | grep -c '\.') files in $files"
