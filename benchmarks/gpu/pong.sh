#!/usr/bin/env bash
# On the GPU machine, after `source benchmarks/gpu/setup.sh`: one piece of a Pong run of ALGO's atari preset
# on the GPU with 14 collector workers, SECONDS long, then SIGINT (the trainer checkpoints and exits); a
# second call with the same RUN_DIR resumes it. usage: pong.sh ALGO SECONDS RUN_DIR [key=value ...]
algo=$1 secs=$2 dir=$3; shift 3
if [ -f "$dir/config.yaml" ]; then where="resume=$dir"; else where="run_dir=$dir"; fi
timeout -s INT -k 90 "$secs" python3 recipes/$algo.py preset=atari device=cuda collector.workers=14 \
  eval.interval=50000 "$where" "$@" 2>&1 | tr '\r' '\n' | grep -v "INFO\|warn"
