#!/usr/bin/env bash
# On the GPU machine, after `source benchmarks/gpu/setup.sh`: one piece of a Pong run of ALGO's atari_gpu preset
# (or PRESET=...), SECONDS long, then SIGINT (the trainer checkpoints and exits); a second call with the same
# RUN_DIR resumes it (one killed before its first checkpoint is moved aside and started anew). INIT_FROM: weights
# (a checkpoint or cut_weights.py's file) a new run starts from; a resumed run keeps its own.
# usage: [PRESET=atari] [PYTHON=python3] [INIT_FROM=weights.pt] pong.sh ALGO SECONDS RUN_DIR [key=value ...]
algo=$1 secs=$2 dir=$3; shift 3
if [ -f "$dir/checkpoint/counters.json" ] || [ -f "$dir/checkpoint.old/counters.json" ]; then where="resume=$dir"
elif [ -e "$dir" ]; then mv "$dir" "$dir.unsaved-$(date +%s)"; where="run_dir=$dir"  # a piece killed before it saved
else where="run_dir=$dir"; fi
if [ "$where" = "run_dir=$dir" ]; then
  set -- preset="${PRESET:-atari_gpu}" eval.interval=100000 ${INIT_FROM:+"init_from=$INIT_FROM"} "$@"
  echo "pong.sh: a new run in $dir, ${INIT_FROM:+from $INIT_FROM}${INIT_FROM:-from scratch}" >&2
else echo "pong.sh: $dir resumed" >&2; fi
timeout -s INT -k 90 "$secs" "${PYTHON:-python3}" recipes/$algo.py "$where" "$@" 2>&1 | tr '\r' '\n' | grep -v "INFO\|warn"
