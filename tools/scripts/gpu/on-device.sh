#!/usr/bin/env bash
# On the GPU machine (see bundle.sh beside this file): unpack, find the machine's CUDA libraries, then run the GPU
# checks in order of value. Every run has its own limit and all of them share one deadline (ZO_GPU_BUDGET_S,
# default 320 s from the start), so the summary and the results always come back inside the device call's limit.
# Everything lands in $OUT as summary.txt and results.tar.gz. Pass run names to choose and order them:
#   tests tiny small flash front 1b 7b plan attn torch torch1b io
set -uo pipefail
cd "$(dirname "$0")"
start=$SECONDS budget=${ZO_GPU_BUDGET_S:-320}
OUT=${OUT:-/tmp/zo-gpu-out}; R=$PWD/results; mkdir -p "$OUT" "$R"
[ -d stage ] || tar -xJf bundle.tar.xz
B=$PWD/stage/bin L=$PWD/stage/lib
libdirs=$L
# the toolkit's own folder first, then wherever a file (or link to one) of that name is: PyTorch's wheels hold them too
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  f=$(ls /usr/local/cuda/lib64/"$n" /usr/local/cuda/targets/x86_64-linux/lib/"$n" 2>/dev/null | head -n 1)
  [ -n "$f" ] || f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$n" \( -type f -o -type l \) -print 2>/dev/null | head -n 1)
  [ -n "$f" ] && libdirs="$libdirs:$(dirname "$f")" || echo "warning: $n not found" >&2
done
export LD_LIBRARY_PATH="$libdirs:${LD_LIBRARY_PATH:-}"
export PYTHONPATH=$PWD/stage/python ZOFFLOAD_LIBRARY=$L/libzoffload.so ZOFFLOAD_CONFIG_LIBRARY=$L/libzoffload_dsconfig.so
export PYTHONUNBUFFERED=1
S=$OUT/summary.txt
say() { echo "$*" | tee -a "$S"; }
left() { echo $((budget - (SECONDS - start))); }
# lim N: N seconds, or what is left of the deadline less 10 s for packing, whichever is less (0: skip)
lim() { local l; l=$(($(left) - 10)); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 5 ] && l=0; echo "$l"; }
runs=${*:-tests tiny small flash front 1b 7b plan attn torch torch1b io}
{ nvidia-smi; echo; nproc; free -g; df -h /tmp; echo; ldd "$B/zo-train" | grep -i 'not found'; } >"$R/machine.txt" 2>&1
say "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1)"
timeout 20 "$B/zo-report" >"$R/zo-report.txt" 2>&1; say "zo-report rc=$?"
swap=/tmp/zo-swap; mkdir -p "$swap"
train() { # name limit args...
  local name=$1 l; l=$(lim "$2"); shift 2
  [ "$l" = 0 ] && { say "$name skipped: deadline"; return; }
  SECONDS_0=$SECONDS; timeout "$l" "$B/zo-train" --device cuda --json "$@" >"$R/$name.json" 2>"$R/$name.err"
  local rc=$?
  say "$name rc=$rc $((SECONDS - SECONDS_0))s $(python3 -c "import json;d=json.load(open('$R/$name.json'));print('tok/s',round(d['tokens_per_s']),'TFLOPS',round(d['model_tflops'],1),'loss',round(d['first_loss'],3),'->',round(d['last_loss'],3),'peak',d['peak_bytes'],'train_s',round(d['train_s'],2),'stall%',d.get('stall_pct'))" 2>/dev/null || tail -n 3 "$R/$name.err" | tr '\n' ' ')"
}
py() { # name limit script args... (stdout is the JSON)
  local name=$1 l; l=$(lim "$2"); shift 2
  [ "$l" = 0 ] && { say "$name skipped: deadline"; return; }
  SECONDS_0=$SECONDS; timeout "$l" python3 "$@" >"$R/$name.json" 2>"$R/$name.err"
  say "$name rc=$? $((SECONDS - SECONDS_0))s $(tail -c 600 "$R/$name.json" 2>/dev/null) $(tail -n 2 "$R/$name.err" | tr '\n' ' ' | tail -c 400)"
}
for r in $runs; do case $r in
  tests) while read -r name bin args; do # the gpu-labelled tests (bundle.sh lists them)
           l=$(lim 60); [ "$l" = 0 ] && { say "$name skipped: deadline"; continue; }
           timeout "$l" "$B/$bin" $args >"$R/$name.log" 2>&1
           say "$name rc=$? $(grep -Ei 'passed|failed|error' "$R/$name.log" | tail -n 3 | tr '\n' ' ')"
         done <stage/gpu-tests.txt ;;
  tiny)  train tiny 45 --steps 120 ;;
  small) train small 60 --preset small --steps 20 --seq 1024 --micro-batch 8 --offload-optimizer cpu --offload-param none
         train small-offload 60 --preset small --steps 20 --seq 1024 --micro-batch 8 --offload-optimizer cpu --offload-param cpu ;;
  flash) train small-flash 60 --preset small --steps 20 --seq 1024 --micro-batch 8 --offload-optimizer cpu --offload-param none --attention flash ;;
  torch) py torch-small 60 torch_baseline.py --dim 640 --layers 12 --heads 10 --ffn 1728 --vocab 32000 --seq 1024 \
           --micro-batch 8 --steps 20 ;;
  front) py front 90 -m zoffload.bench --device cuda --runs torch,resident,offload --rounds 1 --steps 4 \
           --seq 512 --micro-batch 8 --nvme-path "$swap" --json ;;
  attn)  for c in "2048 0" "256 8192"; do set -- $c; l=$(lim 40); [ "$l" = 0 ] && break
           timeout "$l" "$B/zo-bench" attention --device cuda --seq $1 --window-seq $2 --window 1024 --batch 1 \
             --heads 16 --head-dim 128 --reps 3 --json >"$R/attn-$1-$2.json" 2>"$R/attn-$1-$2.err"
           say "attn-$1-$2 rc=$? $(cat "$R/attn-$1-$2.json") $(tail -n 2 "$R/attn-$1-$2.err" | tr '\n' ' ')"
         done
         py sdpa-2048 30 sdpa_bench.py --seq 2048 --batch 1 --heads 16 --head-dim 128
         py sdpa-8192 30 sdpa_bench.py --seq 8192 --batch 1 --heads 16 --head-dim 128 ;;
  1b)    train 1b-offload 90 --preset 1b --steps 6 --seq 2048 --micro-batch 4 --offload-optimizer cpu --offload-param cpu
         train 1b 60 --preset 1b --steps 6 --seq 2048 --micro-batch 4 --offload-optimizer cpu --offload-param none ;;
  torch1b) py torch-1b 60 torch_baseline.py --dim 2048 --layers 18 --heads 16 --ffn 5632 --vocab 32000 --seq 2048 \
           --micro-batch 4 --steps 8 ;;
  plan)  l=$(lim 90); if [ "$l" != 0 ]; then
           timeout "$l" "$B/zo-plan" --device cuda --preset small --seq 1024 --micro-batch 8 --measure --validate 2 \
             --nvme-path "$swap" --json >"$R/plan.json" 2>"$R/plan.err"
           say "plan rc=$? $(python3 -c "
import json; d=json.load(open('$R/plan.json'))
for x in d['strategies']: print(x['name'], x['fits'], round(x['step_seconds'] or 0, 4), json.dumps(x.get('validation'))[:160])" 2>/dev/null || tail -n 3 "$R/plan.err" | tr '\n' ' ')"
         fi ;;
  io)    for rw in read write; do l=$(lim 30); [ "$l" = 0 ] && break
           timeout "$l" "$B/zo-bench" io --path "$swap" --size 2G --bs 1M --qd 32 --rw $rw --json >"$R/io-$rw.json" 2>"$R/io-$rw.err"
           say "io-$rw rc=$? $(cat "$R/io-$rw.json" | head -c 400) $(tail -n 1 "$R/io-$rw.err")"
         done ;;
  7b)    train 7b-24GiB 150 --preset 7b --steps 3 --seq 2048 --micro-batch 2 --device-mem 24GiB --offload-optimizer cpu --offload-param cpu --state-dtype int8 ;;
esac; done
say "elapsed $((SECONDS - start))s"
tar -C "$R/.." -czf "$OUT/results.tar.gz" results
say "done; results.tar.gz holds every log and JSON"
