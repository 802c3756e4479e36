# Source on the GPU machine (no network there): installs the wheels carried in .whl/ (torchrl, tensordict,
# gymnasium, ale-py, submitit and their small dependencies; torch itself is the machine's CUDA build) into
# /tmp/site and puts the package on PYTHONPATH. How the wheels are fetched: benchmarks/gpu/README.md.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RL_WARNINGS=False
