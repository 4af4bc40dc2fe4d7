# The server image: static-ish Rust binaries on a distroless base (glibc, CA
# certificates, nonroot user 65532), as the Helm chart expects. It also carries
# the built Rancher UI extension, which the chart serves to Rancher with
# elemental-changelog-extension-server (a UIPlugin endpoint inside the cluster).
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p elemental-changelog-apiserver -p elemental-changelog-extension-server \
 && cp target/release/elemental-changelog-apiserver target/release/elemental-changelog-extension-server /

# The extension, built as `make ui-extension` builds it: Rancher's shell, the
# extension creator's build-pkg, with its type check.
FROM docker.io/library/node:24-bookworm AS extension
WORKDIR /src
COPY ui ui
RUN cd ui/rancher \
 && CYPRESS_INSTALL_BINARY=0 npm ci --ignore-scripts --no-audit --no-fund \
 && npm run build-pkg elemental-changelog \
 && rm -f dist-pkg/*/report.html \
 && mv dist-pkg/elemental-changelog-* /extension

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /elemental-changelog-apiserver /elemental-changelog-extension-server /usr/local/bin/
COPY --from=extension /extension /usr/share/elemental-changelog/extension
USER 65532:65532
# glibc's malloc as the chart sets it (docs/operations.md, memory budget): two arenas instead of
# eight per CPU, blocks of 128 KiB or more returned when freed, the heap's top trimmed past 128 KiB.
ENV MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=131072 MALLOC_TRIM_THRESHOLD_=131072
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/elemental-changelog-apiserver"]
