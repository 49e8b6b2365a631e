# syntax=docker/dockerfile:1
# flock image: the CNI plugin, the agent, flockctl, the installer, the policy
# container and the pod relay, static.
#   docker build -t registry.example.com/flock:v1 .
# then point deploy/ at it:
#   (cd deploy && kustomize edit set image docker.io/fritzlab/flock=registry.example.com/flock:v1)

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
# --version: docker build --build-arg VERSION=$(cat VERSION)
# --build-arg COMMIT=$(git rev-parse --short HEAD); empty: what the go command
# stamps (nothing without .git: "dev", "unknown").
ARG VERSION=
ARG COMMIT=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo.version=${VERSION} -X code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo.commit=${COMMIT}" -o /out/ \
      ./cmd/flock ./cmd/flock-agent ./cmd/flockctl ./cmd/flock-installer ./cmd/flock-policy ./cmd/flock-relay

# Static binaries: nothing else is needed (the agent talks netlink and the
# API server with the in-cluster service account's CA).
FROM scratch
COPY --from=build /out/flock /out/flock-agent /out/flockctl /out/flock-installer /out/flock-policy /out/flock-relay /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/flock-agent"]
