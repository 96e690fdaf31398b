#!/usr/bin/env bash
# Installs the pinned helm, kubeconform and promtool into .tools/bin (gitignored) with `go install`
# from the Go module proxy, the Kubernetes JSON schemas kubeconform validates against offline into
# .tools/schemas, generated from the OpenAPI document in the k8s.io/kubernetes module
# (deploy/tools/k8s-schemas.mjs), and those of the Prometheus Operator's CRDs (PodMonitor,
# PrometheusRule) into .tools/crd-schemas, from the CRDs in its Go module
# (deploy/tools/crd-schemas.mjs). Only what is missing or at another version is (re)built.
#
# Two caches keep CI from rebuilding them on every run: the binaries themselves are kept per
# version in $TOLLGATE_TOOLS_CACHE (default ~/.cache/tollgate/tools, outside the work tree, so a
# fresh clone on the same machine reuses them), and Go's module and build caches make a rebuild
# on a machine that lost the binaries cheap. The first build on a cold machine takes minutes
# (helm pulls in client-go, promtool most of Prometheus); every later run takes well under a second.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=versions.env
. "$root/deploy/tools/versions.env"
HELM_MODULE=helm.sh/helm/v3
KUBECONFORM_MODULE=github.com/yannh/kubeconform
PROMETHEUS_MODULE=github.com/prometheus/prometheus
OPERATOR_MODULE=github.com/prometheus-operator/prometheus-operator
bin="$root/.tools/bin"
cache="${TOLLGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/tollgate/tools}"
# Go's usual home when the PATH lacks it.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then PATH="$PATH:/usr/local/go/bin"; fi
mkdir -p "$bin" "$cache"

# version_of BINARY: the module version `go install` recorded in the binary, or nothing.
version_of() {
  [ -x "$1" ] || return 0
  go version -m "$1" 2>/dev/null | awk '$1 == "mod" { print $3; exit }'
}

# ensure NAME VERSION PACKAGE LDFLAGS [TAGS]: .tools/bin/NAME built from PACKAGE@VERSION.
ensure() {
  local name=$1 version=$2 pkg=$3 ldflags=$4 tags=${5:-}
  if [ "$(version_of "$bin/$name")" = "$version" ]; then return 0; fi
  local cached="$cache/$name-$version/$name"
  if [ "$(version_of "$cached")" != "$version" ]; then
    command -v go >/dev/null || { echo "install-tools: go is required to build $name" >&2; exit 1; }
    echo "install-tools: building $name $version with go install (first time on this machine)" >&2
    local start=$SECONDS
    mkdir -p "$(dirname "$cached")"
    # -mod=mod: resolve from the module's own go.mod; CGO off: a static binary; -trimpath and
    # the stripped symbols keep it small. The version is stamped as helm's release builds do.
    GOBIN="$(dirname "$cached")" GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local \
      go install -trimpath -tags "$tags" -ldflags "-s -w $ldflags" "$pkg@$version"
    echo "install-tools: built $name $version in $((SECONDS - start)) s" >&2
  fi
  cp -f "$cached" "$bin/$name.tmp" && mv -f "$bin/$name.tmp" "$bin/$name"
}

ensure helm "$HELM_VERSION" "$HELM_MODULE/cmd/helm" \
  "-X $HELM_MODULE/internal/version.version=$HELM_VERSION"
ensure kubeconform "$KUBECONFORM_VERSION" "$KUBECONFORM_MODULE/cmd/kubeconform" \
  "-X main.version=$KUBECONFORM_VERSION"
# Only `promtool check rules` is used: remove_all_sd leaves out every service-discovery plugin
# (the cloud SDKs and client-go), which is most of the build.
ensure promtool "$PROMETHEUS_VERSION" "$PROMETHEUS_MODULE/cmd/promtool" \
  "" remove_all_sd

# Schemas: kubeconform's layout, <dir>/v<version>-standalone-strict/<kind>-<group>-<version>.json.
schemas="$root/.tools/schemas"
layout="${KUBERNETES_VERSION}-standalone-strict"
stamp="$KUBERNETES_VERSION $(sha256sum "$root/deploy/tools/k8s-schemas.mjs" | cut -c1-16)"
if [ "$(cat "$schemas/$layout/.stamp" 2>/dev/null)" != "$stamp" ]; then
  cached="$cache/k8s-schemas/$layout"
  if [ "$(cat "$cached/.stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "install-tools: generating Kubernetes $KUBERNETES_VERSION JSON schemas" >&2
    dir=$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
    [ -f "$dir/api/openapi-spec/swagger.json" ] || { echo "install-tools: no OpenAPI document in k8s.io/kubernetes@$KUBERNETES_VERSION" >&2; exit 1; }
    rm -rf "$cached"
    node "$root/deploy/tools/k8s-schemas.mjs" "$dir/api/openapi-spec/swagger.json" "$cached" >&2
    echo "$stamp" >"$cached/.stamp"
  fi
  rm -rf "${schemas:?}/$layout"
  mkdir -p "$schemas"
  cp -R "$cached" "$schemas/$layout"
fi

# The Prometheus Operator's CRDs as schemas: <.tools/crd-schemas>/<group>/<kind>_<version>.json.
crd_schemas="$root/.tools/crd-schemas"
stamp="$PROMETHEUS_OPERATOR_VERSION $(sha256sum "$root/deploy/tools/crd-schemas.mjs" | cut -c1-16)"
if [ "$(cat "$crd_schemas/.stamp" 2>/dev/null)" != "$stamp" ]; then
  cached="$cache/crd-schemas/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  if [ "$(cat "$cached/.stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "install-tools: generating Prometheus Operator $PROMETHEUS_OPERATOR_VERSION CRD schemas" >&2
    dir=$(GOFLAGS=-mod=mod go mod download -json "$OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
    crds=("$dir"/jsonnet/prometheus-operator/*-crd.json)
    [ -f "${crds[0]}" ] || { echo "install-tools: no CRDs in $OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION" >&2; exit 1; }
    rm -rf "$cached"
    node "$root/deploy/tools/crd-schemas.mjs" "$cached" "${crds[@]}" >&2
    echo "$stamp" >"$cached/.stamp"
  fi
  rm -rf "$crd_schemas"
  cp -R "$cached" "$crd_schemas"
fi
