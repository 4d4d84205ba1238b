# The controller's image: built from the module with the Go toolchain, run on a distroless base
# as a non-root user. (The agents run on Macs under launchd, not in containers.)
#
#   docker build -t synapse-fleet/synapse-controller:v0.1.0 .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY controllers/ controllers/
COPY main.go ./
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w" -o /out/synapse-controller .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/synapse-controller /synapse-controller
USER 65532:65532
ENTRYPOINT ["/synapse-controller"]
