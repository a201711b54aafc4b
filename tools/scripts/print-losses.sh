#!/usr/bin/env bash
# The losses, validation loss and weights digest of the runs an engine change
# must leave bitwise the same: the default `zo-train --json` run, and the
# suite's multi-rank (ZeRO 1-3), pipeline and compact-state (int8 and bf16
# moments) runs on the cpu device. Run it before and after a change and diff
# the outputs: one line a run, "name: losses val_loss weights_digest".
#
# usage: print-losses.sh BUILD_DIR [SWAP_DIR]
#   BUILD_DIR  the build holding tools/zo-train/zo-train
#   SWAP_DIR   where the NVMe runs put their files (default: a fresh temporary one)
set -euo pipefail
build=${1:?usage: print-losses.sh BUILD_DIR [SWAP_DIR]}
exe="$build/tools/zo-train/zo-train"
[ -x "$exe" ] || { echo "print-losses.sh: no zo-train at $exe; build first" >&2; exit 2; }
swap=${2:-$(mktemp -d)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tiny=(--steps 3 --micro-batch 2 --seq 32 --val-batches 2 --json --weights-digest)

# One run: its name, the rank count (1 without mpirun), then zo-train's flags.
run() {
    local name=$1 ranks=$2
    shift 2
    local dir="$swap/$name" cmd=()
    rm -rf "$dir" && mkdir -p "$dir"
    [ "$ranks" -gt 1 ] && cmd=(mpirun --oversubscribe -np "$ranks")
    cmd+=("$exe" "$@" --nvme-path "$dir")
    local out
    if ! out=$("${cmd[@]}" 2>"$dir.err"); then
        echo "$name: FAILED (exit $?; see $dir.err)"
        return
    fi
    python3 -c 'import json,sys; j=json.loads(sys.stdin.read())
print("%s: %s %r %s" % (sys.argv[1], j["losses"], j.get("val_loss"), j.get("weights_digest")))' \
        "$name" <<<"$out"
}

run default 1 --json --weights-digest
run int8-host 1 "${tiny[@]}" --offload-param cpu --state-dtype int8
run int8-nvme 1 "${tiny[@]}" --offload-param cpu --offload-optimizer nvme --state-dtype int8
run bf16-nvme 1 "${tiny[@]}" --offload-param cpu --offload-optimizer nvme --state-dtype bf16
for stage in 1 2 3; do
    run zero$stage-host 2 "${tiny[@]}" --offload-param cpu --zero-stage $stage
    run zero$stage-nvme-overlap 2 "${tiny[@]}" --offload-param cpu --zero-stage $stage \
        --offload-optimizer nvme --optimizer-mode overlap
done
run zero2-int8-nvme-dpu 2 "${tiny[@]}" --offload-param cpu --zero-stage 2 --offload-optimizer nvme \
    --state-dtype int8 --optimizer-mode dpu
run zero1-param-nvme 2 "${tiny[@]}" --zero-stage 1 --offload-param nvme
run pipe2-nvme 2 "${tiny[@]}" --pipeline-stages 2 --grad-accum 4 --offload-optimizer nvme
run pipe2-dpu 2 "${tiny[@]}" --pipeline-stages 2 --grad-accum 4 --offload-optimizer nvme \
    --optimizer-mode dpu
run pipe2x2-zero2 4 "${tiny[@]}" --pipeline-stages 2 --grad-accum 4 --zero-stage 2
[ -n "${2:-}" ] || rm -rf "$swap"
