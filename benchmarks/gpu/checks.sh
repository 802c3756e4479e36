#!/usr/bin/env bash
# On the GPU machine, after `source benchmarks/gpu/setup.sh`: the tests marked gpu, then the learner's
# updates/s of the ACER and LASER Atari presets on cuda and on cpu. Writes under $1 (default: results/).
out=${1:-results}; mkdir -p "$out"
python3 -m pytest -m gpu tests/test_gpu.py -p no:cacheprovider -q -rA 2>&1 | grep -v INFO > "$out/gpu_tests.log"
tail -3 "$out/gpu_tests.log"
for algo in acer laser; do
  timeout -k 10 100 python3 benchmarks/device_updates.py $algo atari --devices cuda cpu --updates 60 \
    --stored 3000 --out "$out/device-updates-$algo-atari.json" 2>&1 | grep "updates/s\|Error"
done
# the main process's costs per batch and the loop efficiency of the GPU presets (issue 45), 60 s of learning each
for algo in acer laser; do
  timeout -k 10 200 python3 benchmarks/pipeline_costs.py $algo atari_gpu --seconds 60 --alone 100 \
    replay.min_size=5000 --out "$out/pipeline-costs.jsonl" 2>&1 | grep -v "INFO\|warn" | tail -2
done
