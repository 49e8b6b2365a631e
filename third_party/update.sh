#!/usr/bin/env bash
# Writes third_party/kube-network-policies: sigs.k8s.io/kube-network-policies
# at the version below, from the Go module proxy, with the patches in
# third_party/patches/kube-network-policies applied (`make third-party`).
# go.mod replaces the module with it. Only what flock builds is kept: the
# networkpolicy package, go.mod, go.sum and the licence. Never edit the
# copy by hand: change a patch and run this again.
set -euo pipefail
cd "$(dirname "$0")/.."
module=sigs.k8s.io/kube-network-policies
version=v0.8.0
dst=third_party/kube-network-policies
src=$(GOFLAGS= GOWORK=off go mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "third-party: $module@$version not in the module cache" >&2; exit 1; }
rm -rf "$dst"
mkdir -p "$dst/pkg/networkpolicy"
cp "$src/go.mod" "$src/go.sum" "$src/LICENSE" "$dst/"
for f in "$src"/pkg/networkpolicy/*.go; do
  case "$f" in *_test.go) continue ;; esac
  cp "$f" "$dst/pkg/networkpolicy/"
done
chmod -R u+w "$dst"
for p in third_party/patches/kube-network-policies/*.patch; do
  [ -e "$p" ] || continue
  patch -s -p1 -d "$dst" < "$p"
done
echo "third-party: $dst is $module@$version with $(ls third_party/patches/kube-network-policies/*.patch 2>/dev/null | wc -l) patch(es)"
