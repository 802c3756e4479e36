#!/usr/bin/env bash
# On the GPU machine, after `source benchmarks/gpu/setup.sh`, in one device call of about 9 minutes: the tests
# marked gpu (4 pytest workers, each test stopped after 150 s so that the summary names any failure), then the
# main process's costs per batch, env steps/s and loop efficiency of the ACER and LASER `atari_gpu` presets on
# Pong (60 s of learning each, benchmarks/pipeline_costs.py). Writes under $1 (default: results/):
# gpu_tests.log, pipeline-costs.jsonl, nvidia-smi.txt.
out=${1:-results}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/nvidia-smi.txt"
timeout -k 10 280 python3 -m pytest -m gpu tests/test_gpu.py -n 4 --timeout 150 -p no:cacheprovider -q -rfE 2>&1 \
  | grep -v "INFO\|PytestBenchmarkWarning\|warner(" > "$out/gpu_tests.log"
tail -6 "$out/gpu_tests.log"
for algo in acer laser; do
  timeout -k 10 120 python3 benchmarks/pipeline_costs.py "$algo" atari_gpu --seconds 60 --alone 60 \
    replay.min_size=5000 --out "$out/pipeline-costs.jsonl" 2>&1 | grep -v "INFO\|warn" | tail -3
done
echo "checks.sh: $SECONDS s"
