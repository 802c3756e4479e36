#!/usr/bin/env bash
# One GPU window in one device call of at most BUDGET_S seconds (default 540), after `source benchmarks/gpu/setup.sh`:
#  tests: the tests marked gpu;
#  rows:  benchmarks/pipeline_costs.py rows of the ACER, LASER and Reactor atari_gpu presets (45 s of learning each);
#  pong:  the ACER Pong run for the rest of the budget, started from the weights the window before left in PONG_DIR
#         (benchmarks/results/gpu/pong-acer/weights.pt; none: from scratch) and ended by SIGINT (a checkpoint); then its
#         new weights cut (cut_weights.py), their dead ReLU units counted (dead_units.py) and its curve joined to the
#         earlier windows' (plot_pong.py).
# Each part runs under `timeout` within what the budget leaves. Everything is written under OUT (the device tool's
# output folder): gpu_tests.log, pipeline-costs.jsonl, pong-acer/ (weights.pt, pong-acer-metrics.csv, pong-acer.png,
# window.log: copy them into PONG_DIR and commit). Prints a summary.
# DRY=1: the same on CPU with tiny budgets (a MinAtar row, an ACER CartPole run instead of Pong), as
# tests/test_gpu_window.py runs it. PARTS: which parts (default "tests rows pong"; also "prefetch": ACER's row with
# replay.prefetch=true). tests and rows take ~410 s on an H100, leaving Pong ~55 s of 540: where the rows of this
# code are committed already, run PARTS="prefetch pong" or PARTS=pong; ALGOS=acer PARTS="rows prefetch pong": ACER's
# row without and with prefetch on one machine (~200 s), then Pong.
# PONG_ARGS: the Pong run's settings over the preset's (default below; a resumed run may change only applied ones).
# usage: [DRY=1] [OUT=dir] [PONG_DIR=dir] [PYTHON=python3] [BUDGET_S=540] [PARTS=...] [ALGOS=...] [PONG_ARGS=...] bash benchmarks/gpu/window.sh
set -u
out=${OUT:-results/window}
pong_dir=${PONG_DIR:-benchmarks/results/gpu/pong-acer}
export PYTHON=${PYTHON:-python3}
budget=${BUDGET_S:-540}
if [ "${DRY:-0}" = 1 ]; then
  tests_s=60 algos="acer" row_s=90 row_args="minatar --seconds 2 --alone 3 device=cpu replay.min_size=200 collector.workers=1"
  pong_preset=cartpole reserve_s=70 run_dir=${RUN_DIR:-$out/run} probe_states=100
  pong_args="collector.workers=1 total_frames=1000000 eval.interval=600 eval.episodes=2 replay.min_size=200"
else
  tests_s=150 algos=${ALGOS:-"acer laser reactor"} row_s=100 row_args="atari_gpu --seconds 45 --alone 60 replay.min_size=5000"
  # OpenAI Baselines' ACER settings for Pong on the preset's shape (16 games x k = 20 a batch, replay ratio 4):
  # RMSProp 7e-4 decayed linearly to 0 over the 10M steps, entropy 0.01, critic weight 0.5, clipping at 10. The
  # preset's Adam 1e-3 left the Nature CNN dead by 2.6M steps (gpu.md, 2026-11-28), the run in gpu/pong-acer-adam/
  pong_preset=atari_gpu reserve_s=75 run_dir=${RUN_DIR:-/tmp/pong-acer} probe_states=600
  pong_args=${PONG_ARGS-"optim.name=rmsprop optim.lr=7e-4 optim.lr_end_factor=0 acer.entropy_coeff=0.01 acer.critic_coeff=0.5 optim.max_grad_norm=10"}
fi
mkdir -p "$out/pong-acer"
quiet() { grep -Ev "INFO|[Ww]arn|resource_tracker"; }  # also the leaked-semaphore UserWarning of a killed pool

tests() {  # on CPU they skip; in parallel when pytest-xdist is there
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/nvidia-smi.txt"
  local plugins=()
  "$PYTHON" -c "import xdist" 2> /dev/null && plugins+=(-n 8)
  "$PYTHON" -c "import pytest_timeout" 2> /dev/null && plugins+=(--timeout "$((tests_s - 20))")
  timeout -k 10 "$tests_s" "$PYTHON" -m pytest -m gpu tests/test_gpu.py "${plugins[@]}" -p no:cacheprovider -q -rfE \
    > "$out/gpu_tests.log" 2>&1  # unfiltered: quiet() would drop pytest's "N passed, M warnings" line
  echo "-- gpu tests: $(tail -1 "$out/gpu_tests.log")"
}

rows() {  # the main process's costs per batch
  for algo in $algos; do
    timeout -k 10 "$row_s" "$PYTHON" benchmarks/pipeline_costs.py "$algo" $row_args --out "$out/pipeline-costs.jsonl" \
      2>&1 | quiet | tail -3 > "$out/pipeline-costs-$algo.txt"
    echo "-- $algo: $(tail -1 "$out/pipeline-costs-$algo.txt")"
  done
}

prefetch() {  # ACER's row again with the draw on a background thread (replay.prefetch=true), beside the plain row
  timeout -k 10 "$row_s" "$PYTHON" benchmarks/pipeline_costs.py acer $row_args replay.prefetch=true \
    --out "$out/pipeline-costs.jsonl" 2>&1 | quiet | tail -3 > "$out/pipeline-costs-acer-prefetch.txt"
  echo "-- acer, replay.prefetch=true: $(tail -1 "$out/pipeline-costs-acer-prefetch.txt")"
}

pong() {  # the run, from the last window's weights, until the reserve for its checkpoint, the cut and the plot
  local init="" pieces=() log="$out/pong-acer/window.log" seconds=$((budget - SECONDS - reserve_s))
  [ -f "$pong_dir/weights.pt" ] && init="$pong_dir/weights.pt"  # pong.sh applies it to a new run only
  [ -f "$pong_dir/pong-acer-metrics.csv" ] && pieces+=("$pong_dir/pong-acer-metrics.csv")
  if [ "$seconds" -lt 10 ]; then echo "-- pong: no time left ($seconds s)"; return; fi
  INIT_FROM=$init PRESET=$pong_preset bash benchmarks/gpu/pong.sh acer "$seconds" "$run_dir" $pong_args > "$log" 2>&1
  "$PYTHON" benchmarks/gpu/cut_weights.py "$run_dir" "$out/pong-acer/weights.pt" >> "$log" 2>&1
  # does the network still tell states apart (ReLU units off on every state; the policy's spread across states)
  "$PYTHON" benchmarks/gpu/dead_units.py acer "$out/pong-acer/weights.pt" "preset=$pong_preset" --states "$probe_states" 2>&1 | quiet >> "$log"
  [ -f "$run_dir/metrics.csv" ] && pieces+=("$run_dir/metrics.csv")
  [ "${#pieces[@]}" -gt 0 ] && "$PYTHON" benchmarks/gpu/plot_pong.py "$out/pong-acer" "acer=$(IFS=,; echo "${pieces[*]}")" >> "$log" 2>&1
  echo "-- pong, $seconds s: $(grep -m1 '^pong.sh: ' "$log")"
  grep -v "units off on all\|^policy: " "$log" | tail -3
  grep "units off on all\|^policy: " "$log"
}

for part in ${PARTS:-tests rows pong}; do "$part"; done
echo "== window.sh: $SECONDS s of $budget (DRY=${DRY:-0})"
