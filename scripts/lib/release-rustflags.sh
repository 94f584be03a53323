#!/usr/bin/env bash
# Prints the RUSTFLAGS of the release build (`make release`; the target comes from
# release-target.sh):
#
# - static (crt-static) and not position-independent (relocation-model=static):
#   no dynamic loader and no start-up relocations in each plugin exec;
# - linked by release-linker, which gathers the plugin's functions (its header
#   says why). Named relative to the workspace root, where cargo runs rustc:
#   RUSTFLAGS are part of every symbol's hash, and must be the same in every
#   checkout for scripts/lib/plugin-symbols.txt to name the functions.
echo "-C target-feature=+crt-static -C relocation-model=static -C linker=scripts/lib/release-linker"
