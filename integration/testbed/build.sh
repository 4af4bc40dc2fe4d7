#!/usr/bin/env bash
# Builds the real parts of the test bed into target/testbed/bin:
# kube-apiserver, kubectl, etcd and the clusterrole-aggregation controller
# (k8s/go.mod), helm (helm/go.mod) and Rancher's Steve on loopback (steve/go.mod).
# A binary is rebuilt only when its module changes (a stamp keyed on go.mod,
# go.sum and the module's own .go files), so a second run costs seconds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${TESTBED_BIN:-$root/target/testbed/bin}"
mkdir -p "$out"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"

# The version every binary reports: the release pinned in k8s/go.mod.
k8s_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' "$here/k8s/go.mod")"
k8s_ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitTreeState=clean"
k8s_ldflags="$k8s_ldflags -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"

build() { # module-dir binary package [ldflags]
  local dir="$here/$1" bin="$2" pkg="$3" ldflags="${4:-}"
  local stamp="$out/.$bin.stamp" want
  want="$(cat "$dir/go.mod" "$dir/go.sum" $(find "$dir" -name "*.go" | sort) | sha256sum | cut -c1-16)"
  if [[ -x "$out/$bin" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  echo "testbed: building $bin ($pkg)" >&2
  (cd "$dir" && go build -ldflags="-s -w $ldflags" -o "$out/$bin.tmp" "$pkg")
  mv "$out/$bin.tmp" "$out/$bin"
  echo "$want" > "$stamp"
}

build k8s etcd ./cmd/etcd
build k8s kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build k8s kubectl k8s.io/kubernetes/cmd/kubectl "$k8s_ldflags"
# kube-controller-manager's clusterrole-aggregation controller alone (admin/edit/view).
build k8s clusterrole-aggregation ./cmd/clusterrole-aggregation "$k8s_ldflags"
build helm helm helm.sh/helm/v4/cmd/helm
# Rancher's Steve, served on one loopback address by our small main (steve/main.go).
build steve steve .
echo "$out"
