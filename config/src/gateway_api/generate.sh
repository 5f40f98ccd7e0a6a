#!/usr/bin/env bash
# Regenerates the Gateway API spec/status types in this folder from the pinned CRDs (the
# experimental channel of sigs.k8s.io/gateway-api v1.6.3, the bundle manifests/gateway-api/
# ships and the conformance suite checks), with kopium 0.24.1 (`cargo install kopium --locked`).
# The object types themselves (metadata + spec + status, and their k8s-openapi Resource
# impls) are hand-written in mod.rs: `--hide-kube` keeps kube-derive and schemars out of the
# build.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version=v1.6.3
crds="$(go env GOMODCACHE)/sigs.k8s.io/gateway-api@$version/config/crd/experimental"
[ -d "$crds" ] || (cd "$(mktemp -d)" && go mod download "sigs.k8s.io/gateway-api@$version")
for kind in gatewayclasses gateways httproutes grpcroutes tlsroutes referencegrants; do
  out="$here/$kind.rs"
  crd="$crds/gateway.networking.k8s.io_$kind.yaml"
  version_of_kind=v1
  [ "$kind" = referencegrants ] && version_of_kind=v1beta1
  kopium --hide-kube --derive PartialEq --api-version "$version_of_kind" -f "$crd" \
    | sed "s#$crds#<sigs.k8s.io/gateway-api@$version>/config/crd/experimental#" > "$out.tmp"
  mv "$out.tmp" "$out"
done
rustfmt --edition 2024 "$here"/*.rs
