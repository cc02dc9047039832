# The aether image: the one static `aether` binary on a minimal Debian with nftables and
# iproute2, and nothing else (docs/image.md). `scripts/image` builds it, checks it and saves
# target/image/aether-image.tar for `kind load image-archive`. By hand, once the base exists:
#
#   RUSTFLAGS='-C target-feature=+crt-static' \
#     cargo build --release --locked --target x86_64-unknown-linux-gnu
#   podman build --network=none --build-arg BASE=localhost/aether-base:bookworm \
#     --build-arg VERSION=0.1.0 -t aether:0.1.0 .
#
# The base is a build argument because no container registry is reachable where this is
# built: there is no `debian:bookworm-slim` to pull. `scripts/image` makes the base with
# `debootstrap --variant=minbase --include=nftables,iproute2` (apt lists and caches, docs, man
# pages and locales removed) and imports it as `localhost/aether-base:<suite>`. Any Debian
# image with `nft`, `ip` and `nsenter` (util-linux, part of every Debian base) on PATH would
# do as BASE where a registry is reachable.
#
# The binary is built on the host and copied in. A multi-stage build (a Rust builder stage,
# then this stage) would need a Rust toolchain image, which cannot be fetched here, and a
# builder made by hand would also need the crates downloaded inside the build: so there is no
# builder stage. The binary is statically linked (`+crt-static`) because `aether cni install`
# copies this same file to the host as /opt/cni/bin/aether-cni, where it runs against the
# host's libc, not the image's; `aether cni` is a subcommand of this one binary.
ARG BASE=localhost/aether-base:bookworm
FROM ${BASE}

ARG BASE
ARG VERSION=0.0.0
ARG REVISION=unknown
# The static binary, relative to the build context (the repository; .dockerignore lets only
# this file through).
ARG BINARY=target/x86_64-unknown-linux-gnu/release/aether

LABEL org.opencontainers.image.title="aether" \
      org.opencontainers.image.description="aether: a node-local service mesh for Kubernetes in one process per node (aether node), with its CNI plugin (aether cni)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE}"

# An image made by `podman import` carries no environment: the daemon runs `nsenter`, `nft`
# and `ip` by name.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

COPY --chmod=0755 ${BINARY} /usr/local/bin/aether

# root, by choice (docs/image.md, "Why root"). The daemon runs as uid 0 with exactly the
# capabilities it needs (NET_ADMIN, SYS_ADMIN, NET_BIND_SERVICE; every other one
# dropped). A non-root user would get none of them: Kubernetes puts added capabilities in the
# bounding set, and without ambient capabilities (which Kubernetes cannot set) a non-root
# process's execve leaves its effective set empty. File capabilities (setcap on the binary)
# would give the daemon its own, but it runs `nsenter`, `nft` and `ip` for every pod, which
# would each need file capabilities too, so any process in the container could take them.
USER 0:0

# No ENTRYPOINT: the DaemonSet names the command (`aether node`, and `aether cni install` in
# its second container), and `nft`, `ip` and `nsenter` run by name for debugging.
CMD ["aether", "node"]
