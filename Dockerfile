# syntax=docker/dockerfile:1.7
#
# sluice container image.
#   docker build -t ghcr.io/sluice-dev/sluice:0.1.0 .
#   docker build --target bench -t ghcr.io/sluice-dev/sluice-bench:0.1.0 .   (load generator)
# Needs BuildKit (the default builder since Docker 23): the cache mounts below, and COPY --from
# keeping the file capability set on /sluice in the build stage.

FROM rust:1.95-bookworm AS source
WORKDIR /src
# setcap (libcap2-bin) grants /sluice cap_net_bind_service, so that uid 65532 can bind 80/443
# with allowPrivilegeEscalation=false and the capability added in the pod's securityContext.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libcap2-bin \
 && rm -rf /var/lib/apt/lists/*
# The whole workspace: Cargo.lock pins every dependency (--locked), rust-toolchain.toml the compiler
# (rustup may fetch its listed rustfmt/clippy components on first use: the build needs network).
COPY . .

FROM source AS build
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sluice \
 && install -D -m 0755 target/release/sluice /out/sluice \
 && setcap cap_net_bind_service=+ep /out/sluice \
 && getcap /out/sluice

# Load generator image for the in-cluster benchmark (manifests/bench). Not built by default.
FROM source AS bench-build
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sluice-bench \
 && install -D -m 0755 target/release/sluice-bench /out/sluice-bench

FROM gcr.io/distroless/cc-debian12:nonroot AS bench
COPY --from=bench-build /out/sluice-bench /sluice-bench
USER 65532:65532
ENTRYPOINT ["/sluice-bench"]

# The default target (last stage): the controller.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.source="https://github.com/sluice-dev/sluice" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="sluice Kubernetes Ingress controller"
COPY --from=build /out/sluice /sluice
USER 65532:65532
EXPOSE 80 443 10254
ENTRYPOINT ["/sluice"]
