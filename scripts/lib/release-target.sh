#!/usr/bin/env bash
# Prints the target triple `make release` builds podnet for, and so where the
# binary to install is: target/<triple>/release/podnet.
#
# x86_64-unknown-linux-musl when its Rust standard library and musl-gcc (ring's
# C code) are installed (scripts/setup installs both): every CNI exec of a
# glibc binary, even a static one, first runs glibc's CPU and cache detection,
# dozens of CPUID instructions, each a trap to the hypervisor on a VM (0.6 ms
# per exec on the machine of BENCHMARKS.md; musl has none of it). Otherwise the
# host triple (static glibc), with a warning on stderr.
set -euo pipefail
export PATH="${HOME:-/root}/.cargo/bin:$PATH"
musl=x86_64-unknown-linux-musl
host=$(rustc -vV | sed -n 's/^host: //p')
if [ "$host" = x86_64-unknown-linux-gnu ] && command -v musl-gcc >/dev/null &&
    rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
    echo "$musl"
else
    echo "release-target: the $musl target or musl-gcc is missing (scripts/setup installs them): building for $host (static glibc, slower to start)" >&2
    echo "$host"
fi
