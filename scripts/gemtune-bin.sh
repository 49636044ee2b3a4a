#!/usr/bin/env bash
# Prints the path of the gemtune binary the other scripts run: $GEMTUNE when
# set, else cargo's build of it, wherever cargo puts it (CARGO_TARGET_DIR and
# a configured build.target-dir are honoured: the directory comes from
# `cargo metadata`, never from a hard-coded target/).
#   scripts/gemtune-bin.sh [--release] [--no-build]
#     --release   the release build (default: debug)
#     --no-build  print the path without building first
set -euo pipefail
cd "$(dirname "$0")/.."
profile=debug
build=(cargo build --quiet --locked -p gemtune)
no_build=0
for a in "$@"; do
    case $a in
    --release)
        profile=release
        build+=(--release)
        ;;
    --no-build) no_build=1 ;;
    *)
        echo "usage: scripts/gemtune-bin.sh [--release] [--no-build]" >&2
        exit 4
        ;;
    esac
done
if [[ -n ${GEMTUNE:-} ]]; then
    echo "$GEMTUNE"
    exit 0
fi
if [[ $no_build == 0 ]]; then
    "${build[@]}" >&2
fi
target=$(cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
echo "$target/$profile/gemtune"
