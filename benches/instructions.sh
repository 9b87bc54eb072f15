#!/usr/bin/env bash
# Instructions per round of the agent loop, counted by valgrind (callgrind): stable across
# runs and machine load. Needs valgrind. Usage: bash benches/instructions.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-200}
bin=$(cargo bench --bench instructions --no-run --message-format=json 2>/dev/null \
    | grep -o '"executable":"[^"]*instructions[^"]*"' | tail -1 | cut -d'"' -f4)
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$runs" "$2" 2>&1 \
        | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '%-26s %12s %12s\n' workload "history 10" "history 1000"
for len in 10 1000; do base[$len]=$(count baseline $len); done
for workload in reference agent agent_six_callbacks agent_patch_instructions agent_builtins_boxed agent_history_stack; do
    row=$(printf '%-26s' "$workload")
    for len in 10 1000; do
        total=$(count "$workload" "$len")
        row+=$(printf ' %12d' $(( (total - base[len]) / (runs * 100) )))
    done
    echo "$row"
done
echo "(instructions per round: 100 rounds x $runs runs, setup subtracted)"
