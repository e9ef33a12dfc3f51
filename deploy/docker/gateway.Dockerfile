# The collector image the region chart's gateways and the global chart's sink run: built by the
# OpenTelemetry Collector Builder from collectors/builder-config.yaml (the manifest the native stack builds).
# Build from the repository root: docker build -f deploy/docker/gateway.Dockerfile -t <registry>/gateway:<tag> .
# The builder version is checked against stack/paths.py and the manifest by tests/unit/test_deploy_images.py.
FROM golang:1.26-bookworm AS build
ENV CGO_ENABLED=0 GOFLAGS=-mod=mod
RUN go install go.opentelemetry.io/collector/cmd/builder@v0.165.0
COPY collectors/builder-config.yaml /src/builder-config.yaml
RUN builder --config=/src/builder-config.yaml --output-path=/out

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/otelcol-infersight /otelcol-infersight
USER 10001
EXPOSE 4317 4318 8888 13133
ENTRYPOINT ["/otelcol-infersight"]
