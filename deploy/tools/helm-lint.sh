#!/usr/bin/env bash
# `make helm-lint`: for every values file (default: deploy/values/*.yaml and
# helm/tollgate/ci/*.yaml, or the files given as arguments), `helm lint --strict`, then
# `helm template`, then kubeconform -strict on every rendered object against the Kubernetes JSON
# schemas in .tools/schemas and the Prometheus Operator's in .tools/crd-schemas (PodMonitor,
# PrometheusRule), then `promtool check rules` on the rendered PrometheusRule's groups, offline.
# Every file is checked; the exit status is 1 if any failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bash deploy/tools/install.sh
# shellcheck source=versions.env
. deploy/tools/versions.env
helm=.tools/bin/helm
kubeconform=.tools/bin/kubeconform
promtool=.tools/bin/promtool
chart=helm/tollgate

if [ $# -gt 0 ]; then files=("$@"); else files=(deploy/values/*.yaml "$chart"/ci/*.yaml); fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

failed=0
for f in "${files[@]}"; do
  echo "helm-lint: $f"
  rendered="$out/$(basename "$f" .yaml)-$RANDOM.yaml"
  if ! "$helm" lint --strict --quiet "$chart" -f "$f" --kube-version "${KUBERNETES_VERSION#v}"; then
    echo "helm-lint: FAIL $f: helm lint --strict" >&2; failed=1; continue
  fi
  # helm lint reports a `fail` or `required` in a template only as [INFO]: render for real.
  if ! "$helm" template tollgate "$chart" -n tollgate -f "$f" --kube-version "${KUBERNETES_VERSION#v}" >"$rendered"; then
    echo "helm-lint: FAIL $f: helm template" >&2; failed=1; continue
  fi
  if ! "$kubeconform" -strict -summary -schema-location .tools/schemas \
    -schema-location '.tools/crd-schemas/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json' \
    -kubernetes-version "${KUBERNETES_VERSION#v}" "$rendered"; then
    echo "helm-lint: FAIL $f: kubeconform" >&2; failed=1; continue
  fi
  # The PrometheusRule's spec is a Prometheus rules file: the lines under its `spec:`, dedented.
  if grep -q '^kind: PrometheusRule$' "$rendered"; then
    rules="${rendered%.yaml}-rules.yaml"
    awk '/^---/ { rule = 0; spec = 0 }
      /^kind: PrometheusRule$/ { rule = 1 }
      rule && spec { sub(/^  /, ""); print }
      rule && /^spec:$/ { spec = 1 }' "$rendered" >"$rules"
    if ! "$promtool" check rules "$rules"; then
      echo "helm-lint: FAIL $f: promtool check rules" >&2; failed=1; continue
    fi
  fi
done
if [ "$failed" -ne 0 ]; then echo "helm-lint: failed" >&2; exit 1; fi
echo "helm-lint: ${#files[@]} values files linted, rendered and valid against Kubernetes ${KUBERNETES_VERSION}"
