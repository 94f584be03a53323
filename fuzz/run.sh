#!/usr/bin/env bash
# Builds the cargo-fuzz targets of fuzz/ and runs each one for FUZZ_SECONDS
# (default 60), in sequence, as a single libFuzzer process (one core), then
# prints a one-line summary per target. Used by `make fuzz`; not part of
# `make test` or CI.
#
#   bash fuzz/run.sh [TARGET...]        (default: every target)
#
# Seeds are read from fuzz/corpus/<target>/ (tracked); the corpus libFuzzer
# grows goes to fuzz/work/<target>/, its log to fuzz/work/<target>.log, and
# crashing inputs to fuzz/artifacts/<target>/ (all git-ignored).
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
secs=${FUZZ_SECONDS:-60}
toolchain=${FUZZ_TOOLCHAIN:-+nightly}

if ! command -v cargo-fuzz >/dev/null; then
    cargo install cargo-fuzz --locked || exit 1
fi
if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo "$toolchain" fuzz list)
fi
if [ ${#targets[@]} -eq 1 ]; then
    cargo "$toolchain" fuzz build "${targets[0]}" || exit 1
else
    cargo "$toolchain" fuzz build || exit 1
fi

# `cargo fuzz build` puts the binaries here (release, with ASan and debug assertions).
bindir="$root/fuzz/target/$(rustc "$toolchain" -vV | sed -n 's/^host: //p')/release"

# Scratch files of delete_queue_entry (tmpfs when there is one: it is faster).
shm=/dev/shm
[ -d "$shm" ] && [ -w "$shm" ] || shm=${TMPDIR:-/tmp}
tmp=$(mktemp -d "$shm/podnet-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

summary=()
status=0
for t in "${targets[@]}"; do
    work="$root/fuzz/work/$t"
    log="$root/fuzz/work/$t.log"
    mkdir -p "$work" "$root/fuzz/corpus/$t"
    echo "fuzz: $t for ${secs}s (log $log)" >&2
    start=$(date +%s)
    mkdir -p "$root/fuzz/artifacts/$t"
    PODNET_FUZZ_TMP=$tmp "$bindir/$t" "$work" "$root/fuzz/corpus/$t" \
        -artifact_prefix="$root/fuzz/artifacts/$t/" -max_total_time="$secs" -timeout=10 -print_final_stats=1 >"$log" 2>&1
    rc=$?
    ran=$(($(date +%s) - start))
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 | awk '{print $2}')
    if [ "$rc" -eq 0 ]; then
        found="none"
    else
        status=1
        artifact=$(grep -o 'Test unit written to [^ ]*' "$log" | tail -1 | awk '{print $5}')
        # The panic message (the line after "panicked at") and the first podnet
        # frame of the backtrace.
        why=$(grep -m1 -A1 "panicked at" "$log" | tail -1 | cut -c1-120)
        [ -n "$why" ] || why=$(grep -m1 -E "ERROR: (libFuzzer|AddressSanitizer)" "$log" | cut -c1-120)
        where=$(grep -m1 -oE 'at \./src/[^ ]+' "$log" | cut -c4-)
        [ -z "$where" ] || why="$why (at $where)"
        found="FAILED (exit $rc) ${artifact:-no artifact}: ${why:-see log}"
    fi
    summary+=("$(printf '%-22s %5ss  %12s execs  corpus %-10s findings: %s' \
        "$t" "$ran" "${execs:-?}" "${corp:-?}" "$found")")
done

echo
printf '%s\n' "${summary[@]}"
exit $status
