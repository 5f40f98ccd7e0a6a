#!/usr/bin/env bash
# In-cluster benchmark on kind: sluice against ingress-nginx, the NGINX Ingress Controller (NGINX
# Inc., free edition, class nginx-inc), the HAProxy Kubernetes Ingress Controller and Traefik, each
# installed from its own published chart, one at a time, on the same cluster and backend.
#
#   bench/kind-bench.sh [CONTROLLER...]     # default: sluice ingress-nginx nginx-inc haproxy traefik
#
# For each controller and scenario:
#   1. install the controller (sluice: manifests/kind with the locally built image; the others:
#      helm upgrade --install from their chart repositories, Service type ClusterIP),
#   2. wait until https://bench.local/ answers through it,
#   3. run the load Job (manifests/bench/load-job.yaml: sluice-bench load, --rate/--connections/
#      --duration as below) aimed at the controller pod's IP, and, in the "dynamic" scenario, the
#      scaler loop at the same time: bench-backend 5 -> 7 replicas, sleep 12 s, 7 -> 5, sleep 10 s,
#      for the load's duration (the timing of NGINX's "dynamic Kubernetes" benchmark),
#   4. copy the Job's JSON report out (kubectl logs of its report container),
#   5. uninstall the controller and wait until its namespace is gone.
# All results land in one directory: OUT_DIR/<controller>-<scenario>.json plus logs, the chart
# versions that were installed, and results.json collecting every report.
#
# Needs: docker (BuildKit), kind, kubectl, helm 3, openssl. Uses the kind cluster CLUSTER_NAME,
# creating it from manifests/kind/cluster.yaml when missing.
#
# Environment (defaults in brackets):
#   CLUSTER_NAME [sluice]   OUT_DIR [bench-out/kind-<UTC time>]   SCENARIOS ["dynamic"; also "static"]
#   RATE [1000]  CONNECTIONS [50]  DURATION [60] (seconds)
#   SLUICE_IMAGE [ghcr.io/sluice-dev/sluice:0.1.0-dev]
#   BENCH_IMAGE [ghcr.io/sluice-dev/sluice-bench:0.1.0-dev]   SKIP_BUILD=1 to reuse built images
#   INGRESS_NGINX_VERSION, NGINX_INC_VERSION, HAPROXY_VERSION, TRAEFIK_VERSION: chart versions to
#   pin (empty: the newest; the versions used are recorded in OUT_DIR either way).
set -euo pipefail

CLUSTER_NAME="${CLUSTER_NAME:-sluice}"
CONTEXT="kind-$CLUSTER_NAME"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${OUT_DIR:-$REPO_ROOT/bench-out/kind-$(date -u +%Y%m%dT%H%M%SZ)}"
SCENARIOS="${SCENARIOS:-dynamic}"
RATE="${RATE:-1000}"
CONNECTIONS="${CONNECTIONS:-50}"
DURATION="${DURATION:-60}"
SLUICE_IMAGE="${SLUICE_IMAGE:-ghcr.io/sluice-dev/sluice:0.1.0-dev}"
BENCH_IMAGE="${BENCH_IMAGE:-ghcr.io/sluice-dev/sluice-bench:0.1.0-dev}"
SKIP_BUILD="${SKIP_BUILD:-0}"
BENCH_NS=sluice-bench
ALL_CONTROLLERS=(sluice ingress-nginx nginx-inc haproxy traefik)

WORK="$(mktemp -d)"
SCALER_PID=""
cleanup() {
  if [[ -n "$SCALER_PID" ]]; then
    kill "$SCALER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

log() { printf '\n==> [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf 'kind-bench: %s\n' "$*" >&2; exit 1; }
k() { kubectl --context "$CONTEXT" "$@"; }
h() { helm --kube-context "$CONTEXT" "$@"; }

# ---------------------------------------------------------------------------------------------
# Per-controller facts: namespace, pod label selector, name of the container port serving HTTPS.

controller_ns() {
  case "$1" in
    sluice) echo sluice-system ;;
    ingress-nginx) echo ingress-nginx ;;
    nginx-inc) echo nginx-inc ;;
    haproxy) echo haproxy ;;
    traefik) echo traefik ;;
  esac
}

controller_selector() {
  case "$1" in
    sluice) echo app.kubernetes.io/name=sluice ;;
    ingress-nginx) echo app.kubernetes.io/name=ingress-nginx,app.kubernetes.io/component=controller ;;
    nginx-inc) echo app.kubernetes.io/instance=nginx-inc ;;
    haproxy) echo app.kubernetes.io/instance=haproxy,app.kubernetes.io/name=kubernetes-ingress ;;
    traefik) echo app.kubernetes.io/name=traefik ;;
  esac
}

controller_https_port_name() {
  case "$1" in
    traefik) echo websecure ;;
    *) echo https ;;
  esac
}

# Optional "--version X" for helm.
version_args() {
  if [[ -n "$1" ]]; then
    printf '%s\n' --version "$1"
  fi
}

install_controller() {
  local name="$1" ns
  ns="$(controller_ns "$name")"
  local -a ver=()
  case "$name" in
    sluice)
      # The kind overlay with the locally built image (a copy, since kustomize wants relative paths).
      mkdir -p "$WORK/manifests/dev"
      cp -R "$REPO_ROOT/manifests/base" "$REPO_ROOT/manifests/kind" "$WORK/manifests/"
      cat > "$WORK/manifests/dev/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../kind
images:
  - name: ghcr.io/sluice-dev/sluice
    newName: ${SLUICE_IMAGE%:*}
    newTag: ${SLUICE_IMAGE##*:}
YAML
      k apply -k "$WORK/manifests/dev"
      k -n "$ns" rollout status daemonset/sluice --timeout=180s
      ;;
    ingress-nginx)
      mapfile -t ver < <(version_args "${INGRESS_NGINX_VERSION:-}")
      h upgrade --install ingress-nginx ingress-nginx \
        --repo https://kubernetes.github.io/ingress-nginx "${ver[@]}" \
        --namespace "$ns" --create-namespace \
        --set controller.ingressClassResource.name=nginx \
        --set controller.ingressClassResource.controllerValue=k8s.io/ingress-nginx \
        --set controller.ingressClass=nginx \
        --set controller.service.type=ClusterIP \
        --set controller.admissionWebhooks.enabled=false \
        --wait --timeout 5m
      ;;
    nginx-inc)
      mapfile -t ver < <(version_args "${NGINX_INC_VERSION:-}")
      h upgrade --install nginx-inc oci://ghcr.io/nginx/charts/nginx-ingress "${ver[@]}" \
        --namespace "$ns" --create-namespace \
        --set controller.ingressClass.name=nginx-inc \
        --set controller.ingressClass.create=true \
        --set controller.ingressClass.setAsDefaultIngress=false \
        --set controller.service.type=ClusterIP \
        --set controller.replicaCount=1 \
        --wait --timeout 5m
      ;;
    haproxy)
      mapfile -t ver < <(version_args "${HAPROXY_VERSION:-}")
      h upgrade --install haproxy kubernetes-ingress \
        --repo https://haproxytech.github.io/helm-charts "${ver[@]}" \
        --namespace "$ns" --create-namespace \
        --set controller.ingressClass=haproxy \
        --set controller.ingressClassResource.name=haproxy \
        --set controller.service.type=ClusterIP \
        --set controller.replicaCount=1 \
        --wait --timeout 5m
      ;;
    traefik)
      mapfile -t ver < <(version_args "${TRAEFIK_VERSION:-}")
      h upgrade --install traefik traefik \
        --repo https://traefik.github.io/charts "${ver[@]}" \
        --namespace "$ns" --create-namespace \
        --set ingressClass.enabled=true \
        --set ingressClass.name=traefik \
        --set ingressClass.isDefaultClass=false \
        --set service.type=ClusterIP \
        --wait --timeout 5m
      ;;
    *) die "unknown controller $name" ;;
  esac
}

uninstall_controller() {
  local name="$1" ns
  ns="$(controller_ns "$name")"
  if [[ "$name" == sluice ]]; then
    k delete -k "$WORK/manifests/dev" --ignore-not-found --wait=true
  else
    h uninstall "$name" --namespace "$ns" --wait --timeout 5m || true
    k delete namespace "$ns" --ignore-not-found --wait=true --timeout=5m
  fi
}

record_versions() {
  local name="$1" dir="$2" ns
  ns="$(controller_ns "$name")"
  if [[ "$name" == sluice ]]; then
    printf '{"image":"%s"}\n' "$SLUICE_IMAGE" > "$dir/$name-version.json"
  else
    h list --namespace "$ns" --output json > "$dir/$name-version.json"
  fi
  k -n "$ns" get pods -l "$(controller_selector "$name")" \
    -o jsonpath='{range .items[*]}{range .spec.containers[*]}{.image}{"\n"}{end}{end}' \
    > "$dir/$name-images.txt"
}

# Prints "IP PORT" of one running controller pod.
controller_target() {
  local name="$1" ns sel port_name ip port
  ns="$(controller_ns "$name")"
  sel="$(controller_selector "$name")"
  port_name="$(controller_https_port_name "$name")"
  k -n "$ns" wait pod -l "$sel" --field-selector=status.phase=Running \
    --for=condition=Ready --timeout=180s >/dev/null
  ip="$(k -n "$ns" get pods -l "$sel" --field-selector=status.phase=Running \
    -o jsonpath='{.items[0].status.podIP}')"
  port="$(k -n "$ns" get pods -l "$sel" --field-selector=status.phase=Running \
    -o jsonpath="{.items[0].spec.containers[*].ports[?(@.name==\"$port_name\")].containerPort}")"
  port="${port%% *}"
  [[ -n "$ip" && -n "$port" ]] || die "$name: could not find the pod IP and the $port_name port"
  echo "$ip $port"
}

bench_url() {
  local port="$1"
  if [[ "$port" == 443 ]]; then
    echo "https://bench.local/"
  else
    echo "https://bench.local:$port/"
  fi
}

# Waits until bench.local answers 200 through the controller (its Ingress has been picked up).
wait_routable() {
  local name="$1" ip="$2" port="$3" url
  url="$(bench_url "$port")"
  log "$name: waiting for $url (via $ip) to answer"
  k -n "$BENCH_NS" delete pod "probe-$name" --ignore-not-found --wait=true >/dev/null
  # The probe script runs inside the pod: single quotes keep it from this shell.
  # shellcheck disable=SC2016
  k -n "$BENCH_NS" run "probe-$name" --rm -i --restart=Never --quiet \
    --image=curlimages/curl:8.11.1 --command -- sh -c \
    'for i in $(seq 1 90); do
       code=$(curl -sk -o /dev/null -w "%{http_code}" --max-time 3 --resolve "bench.local:$2:$1" "$3") || code=000
       [ "$code" = 200 ] && { echo "routable after $i tries"; exit 0; }
       sleep 2
     done
     echo "last status $code"; exit 1' \
    probe "$ip" "$port" "$url" \
    || die "$name: bench.local never answered 200 through the controller"
}

scaler() {
  local end=$((SECONDS + DURATION))
  while ((SECONDS < end)); do
    k -n "$BENCH_NS" scale deployment/bench-backend --replicas=7 >/dev/null
    sleep 12
    k -n "$BENCH_NS" scale deployment/bench-backend --replicas=5 >/dev/null
    sleep 10
  done
}

run_load() {
  local name="$1" scenario="$2" ip="$3" port="$4" job url phase started=""
  job="bench-load-$name-$scenario"
  url="$(bench_url "$port")"
  k -n "$BENCH_NS" delete job "$job" --ignore-not-found --wait=true >/dev/null
  sed -e "s|bench-load-__NAME__|$job|" \
    -e "s|__CONTROLLER__|$name|" \
    -e "s|__TARGET_IP__|$ip|" \
    -e "s|__BENCH_IMAGE__|$BENCH_IMAGE|" \
    -e "s|__URL__|$url|" \
    -e "s|__RATE__|$RATE|" \
    -e "s|__CONNECTIONS__|$CONNECTIONS|" \
    -e "s|__DURATION__|$DURATION|" \
    "$REPO_ROOT/manifests/bench/load-job.yaml" > "$WORK/$job.yaml"
  if grep -v '^[[:space:]]*#' "$WORK/$job.yaml" | grep -q '__[A-Z_]*__'; then
    die "unfilled placeholder in $WORK/$job.yaml"
  fi
  log "$name/$scenario: load $url -> $ip:$port, rate $RATE, $CONNECTIONS connections, ${DURATION}s"
  k create -f "$WORK/$job.yaml" >/dev/null

  # Start the scaler when the load container starts, so that both cover the same window.
  for _ in $(seq 1 180); do
    started="$(k -n "$BENCH_NS" get pods -l "job-name=$job" \
      -o jsonpath='{.items[0].status.initContainerStatuses[0].state.running.startedAt}{.items[0].status.initContainerStatuses[0].state.terminated.startedAt}' 2>/dev/null || true)"
    [[ -n "$started" ]] && break
    sleep 1
  done
  [[ -n "$started" ]] || die "$name/$scenario: the load container did not start in 180 s"
  if [[ "$scenario" == dynamic ]]; then
    scaler &
    SCALER_PID=$!
  fi

  phase=""
  for _ in $(seq 1 $((DURATION + 300))); do
    phase="$(k -n "$BENCH_NS" get job "$job" \
      -o jsonpath='{.status.succeeded}/{.status.failed}')"
    [[ "$phase" == 1/* || "$phase" == */1 ]] && break
    sleep 1
  done
  if [[ -n "$SCALER_PID" ]]; then
    wait "$SCALER_PID" || true
    SCALER_PID=""
  fi
  k -n "$BENCH_NS" scale deployment/bench-backend --replicas=5 >/dev/null
  k -n "$BENCH_NS" rollout status deployment/bench-backend --timeout=120s >/dev/null

  k -n "$BENCH_NS" logs "job/$job" -c load > "$OUT_DIR/$name-$scenario.load.log" 2>&1 || true
  [[ "$phase" == 1/* ]] || die "$name/$scenario: load Job did not succeed (status $phase); see $OUT_DIR/$name-$scenario.load.log"
  k -n "$BENCH_NS" logs "job/$job" -c report > "$OUT_DIR/$name-$scenario.json"
  [[ -s "$OUT_DIR/$name-$scenario.json" ]] || die "$name/$scenario: empty JSON report"
  echo "report: $OUT_DIR/$name-$scenario.json"
}

write_summary() {
  local file first=1
  {
    printf '{\n  "cluster": "%s",\n  "rate": %s,\n  "connections": %s,\n  "duration_s": %s,\n  "runs": [\n' \
      "$CLUSTER_NAME" "$RATE" "$CONNECTIONS" "$DURATION"
    for file in "$OUT_DIR"/*-static.json "$OUT_DIR"/*-dynamic.json; do
      [[ -e "$file" ]] || continue
      local base="${file##*/}"
      base="${base%.json}"
      if [[ "$first" == 1 ]]; then first=0; else printf ',\n'; fi
      printf '    {"controller": "%s", "scenario": "%s", "result": ' "${base%-*}" "${base##*-}"
      cat "$file"
      printf '}'
    done
    printf '\n  ]\n}\n'
  } > "$OUT_DIR/results.json"
}

# ---------------------------------------------------------------------------------------------

main() {
  local -a controllers=("$@")
  if ((${#controllers[@]} == 0)); then
    controllers=("${ALL_CONTROLLERS[@]}")
  fi
  local c s
  for c in "${controllers[@]}"; do
    [[ -n "$(controller_ns "$c")" ]] || die "unknown controller $c (known: ${ALL_CONTROLLERS[*]})"
  done
  for s in $SCENARIOS; do
    [[ "$s" == static || "$s" == dynamic ]] || die "unknown scenario $s (static, dynamic)"
  done
  for tool in docker kind kubectl helm openssl; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is required but not on PATH"
  done
  mkdir -p "$OUT_DIR"

  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
    log "using kind cluster $CLUSTER_NAME"
  else
    log "creating kind cluster $CLUSTER_NAME"
    kind create cluster --name "$CLUSTER_NAME" --config "$REPO_ROOT/manifests/kind/cluster.yaml" --wait 180s
  fi

  if [[ "$SKIP_BUILD" != 1 ]]; then
    log "building $SLUICE_IMAGE and $BENCH_IMAGE"
    DOCKER_BUILDKIT=1 docker build -t "$SLUICE_IMAGE" "$REPO_ROOT"
    DOCKER_BUILDKIT=1 docker build --target bench -t "$BENCH_IMAGE" "$REPO_ROOT"
  fi
  log "loading images into the cluster"
  docker save "$SLUICE_IMAGE" "$BENCH_IMAGE" -o "$WORK/images.tar"
  kind load image-archive "$WORK/images.tar" --name "$CLUSTER_NAME"

  log "deploying the backend (manifests/bench)"
  k apply -k "$REPO_ROOT/manifests/bench"
  openssl req -x509 -newkey rsa:2048 -nodes -days 7 \
    -keyout "$WORK/tls.key" -out "$WORK/tls.crt" \
    -subj "/CN=bench.local" -addext "subjectAltName=DNS:bench.local" 2>/dev/null
  k -n "$BENCH_NS" create secret tls bench-tls --cert "$WORK/tls.crt" --key "$WORK/tls.key" \
    --dry-run=client -o yaml | k apply -f -
  k -n "$BENCH_NS" scale deployment/bench-backend --replicas=5
  k -n "$BENCH_NS" rollout status deployment/bench-backend --timeout=180s

  local target ip port
  for c in "${controllers[@]}"; do
    log "$c: installing"
    install_controller "$c"
    record_versions "$c" "$OUT_DIR"
    target="$(controller_target "$c")"
    ip="${target% *}"
    port="${target#* }"
    wait_routable "$c" "$ip" "$port"
    for s in $SCENARIOS; do
      run_load "$c" "$s" "$ip" "$port"
    done
    log "$c: uninstalling"
    uninstall_controller "$c"
  done

  write_summary
  log "all results in $OUT_DIR (summary: $OUT_DIR/results.json)"
}

main "$@"
