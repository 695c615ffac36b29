# syntax=docker/dockerfile:1
# kdedup: a static binary on distroless (CA certificates, /etc/passwd with
# nonroot, nothing else). Build:
#   docker build -t kdedup --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) .
# VERSION and COMMIT are what `kdedup version` prints; the build context has
# no .git, so the commit cannot be read from the checkout.
# The chart (deploy/helm/kdedup) and tests/chart_image_test.go rely on the
# UID/GID, the data directory, the port and the entrypoint set here.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=""
ARG COMMIT=""
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# CGO off: a static binary that runs on distroless/static (no libc).
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT}" -o /out/kdedup ./cmd/kdedup \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kdedup /kdedup
# The data directory, owned by the nonroot user so that it is writable
# without a volume too; in Kubernetes a PersistentVolumeClaim is mounted here
# (fsGroup 65532 makes it writable).
COPY --from=build --chown=65532:65532 /out/data /var/lib/kdedup
ENV KDEDUP_DATA_DIR=/var/lib/kdedup
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/kdedup"]
CMD ["run"]
