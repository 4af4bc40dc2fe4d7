# The server image: a static-ish Rust binary on a distroless base (glibc, CA
# certificates, nonroot user 65532), as the Helm chart expects.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p elemental-changelog-apiserver \
 && cp target/release/elemental-changelog-apiserver /elemental-changelog-apiserver

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /elemental-changelog-apiserver /usr/local/bin/elemental-changelog-apiserver
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/elemental-changelog-apiserver"]
