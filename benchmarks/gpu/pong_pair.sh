#!/usr/bin/env bash
# On the GPU machine, after `source benchmarks/gpu/setup.sh`: one piece of ACER's and LASER's Pong runs side by
# side on the one GPU (7 collector workers each, 14 of the 16 cores), SECONDS long, each ended by SIGINT (the
# trainer checkpoints); the next call resumes both from /tmp/pong-{acer,laser}. Copies each run's metrics.csv
# and the piece's log under OUT. usage: pong_pair.sh SECONDS OUT
secs=$1 out=$2; mkdir -p "$out"
piece=$(date +%H%M%S)
for algo in acer laser; do
  bash benchmarks/gpu/pong.sh "$algo" "$secs" "/tmp/pong-$algo" collector.workers=7 > "$out/pong-$algo-$piece.log" 2>&1 &
done
wait
for algo in acer laser; do cp "/tmp/pong-$algo/metrics.csv" "$out/pong-$algo-metrics.csv"; done
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
