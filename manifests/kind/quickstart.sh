#!/usr/bin/env bash
# sluice on kind, from source to a curl through it.
#
#   manifests/kind/quickstart.sh         # needs docker (with BuildKit), kind, kubectl, openssl, curl
#
# 1. creates the kind cluster from manifests/kind/cluster.yaml (host ports 80/443 -> the node),
# 2. builds the image from the repo's Dockerfile under the name the manifests use,
#    ghcr.io/sluice-dev/sluice:0.1.0 (it is not published in any registry), and loads it into the
#    node with kind load docker-image,
# 3. applies the kind overlay (manifests/kind), whose imagePullPolicy IfNotPresent uses that copy,
# 4. deploys an echo app (agnhost netexec) behind an Ingress of class sluice for host echo.local,
#    with a self-signed TLS certificate,
# 5. waits for the DaemonSet and for the Ingress status address, then curls it over HTTP and HTTPS.
#
# Environment: CLUSTER_NAME (default sluice), IMAGE (default: the image manifests/base names,
# ghcr.io/sluice-dev/sluice:0.1.0; another name is substituted into the manifests),
# SKIP_BUILD=1 to reuse an image already built. Remove everything with manifests/kind/teardown.sh.
set -euo pipefail

CLUSTER_NAME="${CLUSTER_NAME:-sluice}"
SKIP_BUILD="${SKIP_BUILD:-0}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KIND_DIR="$REPO_ROOT/manifests/kind"
# The image the DaemonSet names (ghcr.io/sluice-dev/sluice:0.1.0), read from the manifest so that
# the image built and loaded here is always the one the manifests ask for.
MANIFEST_IMAGE="$(awk '$1 == "image:" { print $2; exit }' "$REPO_ROOT/manifests/base/daemonset.yaml")"
IMAGE="${IMAGE:-$MANIFEST_IMAGE}"
CONTEXT="kind-$CLUSTER_NAME"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'quickstart: %s\n' "$*" >&2; exit 1; }
k() { kubectl --context "$CONTEXT" "$@"; }

for tool in docker kind kubectl openssl curl; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is required but not on PATH"
done
[[ -n "$MANIFEST_IMAGE" ]] || die "no image: line found in manifests/base/daemonset.yaml"
[[ "$IMAGE" == *:* && "$IMAGE" != *:latest ]] || die "IMAGE must carry an explicit tag other than latest (got $IMAGE)"

# 1. Cluster.
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  log "kind cluster $CLUSTER_NAME exists, reusing it"
else
  log "creating kind cluster $CLUSTER_NAME"
  kind create cluster --name "$CLUSTER_NAME" --config "$KIND_DIR/cluster.yaml" --wait 180s
fi

# 2. Image. It is not published, so it is built here and loaded into the node; a non-latest tag
# plus imagePullPolicy IfNotPresent makes the kubelet use the loaded copy instead of pulling.
if [[ "$SKIP_BUILD" != 1 ]]; then
  log "building $IMAGE"
  DOCKER_BUILDKIT=1 docker build -t "$IMAGE" "$REPO_ROOT"
fi
log "loading $IMAGE into the cluster"
if ! kind load docker-image "$IMAGE" --name "$CLUSTER_NAME"; then
  # With Docker's containerd image store (the default from Docker 29) this can fail with
  # "content digest ... not found"; kind's documented workaround is a single-platform archive.
  log "kind load docker-image failed; retrying with a single-platform image archive"
  docker image save --platform "linux/$(docker version -f '{{.Server.Arch}}')" \
    -o "$WORK/sluice-image.tar" "$IMAGE"
  kind load image-archive "$WORK/sluice-image.tar" --name "$CLUSTER_NAME"
fi

# 3. sluice: the kind overlay, with the image set to $IMAGE (a no-op for the default). kustomize
# refuses absolute resource paths, so a copy of base/ and kind/ gets a small overlay beside it.
log "applying manifests/kind with image $IMAGE"
mkdir -p "$WORK/manifests/dev"
cp -R "$REPO_ROOT/manifests/base" "$REPO_ROOT/manifests/kind" "$WORK/manifests/"
cat > "$WORK/manifests/dev/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../kind
images:
  - name: ${MANIFEST_IMAGE%:*}
    newName: ${IMAGE%:*}
    newTag: ${IMAGE##*:}
YAML
k apply -k "$WORK/manifests/dev"
log "waiting for the sluice DaemonSet"
k -n sluice-system rollout status daemonset/sluice --timeout=180s

# 4. Echo app, its TLS certificate and its Ingress.
log "deploying the echo app (host echo.local)"
k create namespace echo --dry-run=client -o yaml | k apply -f -
openssl req -x509 -newkey rsa:2048 -nodes -days 7 \
  -keyout "$WORK/tls.key" -out "$WORK/tls.crt" \
  -subj "/CN=echo.local" -addext "subjectAltName=DNS:echo.local" 2>/dev/null
k -n echo create secret tls echo-tls --cert "$WORK/tls.crt" --key "$WORK/tls.key" \
  --dry-run=client -o yaml | k apply -f -
k apply -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: echo
  namespace: echo
spec:
  replicas: 2
  selector:
    matchLabels:
      app: echo
  template:
    metadata:
      labels:
        app: echo
    spec:
      containers:
        - name: agnhost
          image: registry.k8s.io/e2e-test-images/agnhost:2.53
          args: ["netexec", "--http-port=8080"]
          ports:
            - name: http
              containerPort: 8080
          readinessProbe:
            httpGet:
              path: /
              port: http
            periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: echo
spec:
  selector:
    app: echo
  ports:
    - name: http
      port: 80
      targetPort: http
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: echo
  namespace: echo
  annotations:
    # Serve plain HTTP too (sluice redirects HTTP to HTTPS for TLS hosts by default).
    sluice.dev/ssl-redirect: "false"
spec:
  ingressClassName: sluice
  tls:
    - hosts: ["echo.local"]
      secretName: echo-tls
  rules:
    - host: echo.local
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service:
                name: echo
                port:
                  number: 80
YAML
k -n echo rollout status deployment/echo --timeout=180s

# 5. Ingress status, then requests through sluice.
log "waiting for the Ingress status address"
address=""
for _ in $(seq 1 60); do
  address="$(k -n echo get ingress echo \
    -o jsonpath='{.status.loadBalancer.ingress[0].ip}{.status.loadBalancer.ingress[0].hostname}')"
  [[ -n "$address" ]] && break
  sleep 2
done
[[ -n "$address" ]] || die "Ingress echo/echo got no status address in 120 s (see: kubectl -n sluice-system logs ds/sluice)"
echo "Ingress echo/echo address: $address"

# Retry: the route can reach the data plane a moment after the status is written.
try_curl() {
  local i
  for i in $(seq 1 30); do
    if curl -fsS --max-time 5 "$@"; then
      echo
      return 0
    fi
    echo "  (attempt $i failed, retrying)" >&2
    sleep 2
  done
  return 1
}
log "HTTP:  curl --resolve echo.local:80:127.0.0.1 http://echo.local/hostname"
try_curl --resolve echo.local:80:127.0.0.1 http://echo.local/hostname || die "HTTP request through sluice failed"
log "HTTPS: curl -k --resolve echo.local:443:127.0.0.1 https://echo.local/hostname"
try_curl -k --resolve echo.local:443:127.0.0.1 https://echo.local/hostname || die "HTTPS request through sluice failed"

log "done: sluice serves echo.local on 127.0.0.1:80 and :443 (tear down with manifests/kind/teardown.sh)"
