#!/usr/bin/env bash
# Writes third_party/kube-network-policies: sigs.k8s.io/kube-network-policies
# at the version below, from the Go module proxy, with the patches in
# third_party/patches/kube-network-policies applied (`make third-party`).
# go.mod replaces the module with it. Only what flock builds is kept: the
# networkpolicy package, go.mod, go.sum and the licence. Never edit the
# copy by hand: change a patch and run this again.
#
# It also copies the AdminNetworkPolicy and BaselineAdminNetworkPolicy CRDs
# (standard channel) of sigs.k8s.io/network-policy-api, at the version
# go.mod requires (the one the engine is built against), into
# deploy/admin-network-policy/crd/, verbatim: the optional kustomize
# component that turns those APIs on ships them.
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

# The policy API's CRDs, for deploy/admin-network-policy.
npa=sigs.k8s.io/network-policy-api
npa_version=$(GOFLAGS= GOWORK=off go list -m -f '{{.Version}}' "$npa")
npa_channel=standard
npa_dst=deploy/admin-network-policy/crd
npa_src=$(GOFLAGS= GOWORK=off go mod download -json "$npa@$npa_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$npa_src" ] || { echo "third-party: $npa@$npa_version not in the module cache" >&2; exit 1; }
rm -rf "$npa_dst"
mkdir -p "$npa_dst"
for kind in adminnetworkpolicies baselineadminnetworkpolicies; do
  f=$npa_src/config/crd/$npa_channel/policy.networking.k8s.io_$kind.yaml
  [ -f "$f" ] || { echo "third-party: $npa@$npa_version has no $f" >&2; exit 1; }
  # kubectl apply (client-side) keeps a copy in an annotation, 256 KiB at most.
  [ "$(wc -c < "$f")" -lt 262144 ] || { echo "third-party: $f is 256 KiB or more: too big for kubectl apply" >&2; exit 1; }
  cp "$f" "$npa_dst/"
  chmod u+w,go-w "$npa_dst/$(basename "$f")"
done

echo "third-party: $dst is $module@$version with $(ls third_party/patches/kube-network-policies/*.patch 2>/dev/null | wc -l) patch(es); $npa_dst has the $npa_channel CRDs of $npa@$npa_version"
