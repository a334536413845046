#!/usr/bin/env bash
# Measure one CUDA GPU into data/measured: the microbenchmark database (3 shuffled passes, every
# family but collectives: one GPU cannot host an NCCL group), then the end-to-end iterations with
# their execution and Kineto traces, back to back. Run from the repository root on the GPU machine:
#     bash tools/measure_gpu.sh [PREFIX]      # PREFIX names the files (default h100)
set -euo pipefail
prefix=${1:-h100}
out=data/measured
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "error: no CUDA GPU visible to torch here; run this on the GPU machine (torch with CUDA installed)" >&2
    exit 2
fi
python3 -m itercast profile run --device cuda --db "$out/${prefix}_profile.db" --passes 3 \
    --families gemm,conv,attention,norm,elementwise,embedding,host
python3 validation/e2e_local.py --device cuda --measure --iterations 50 --db "$out/${prefix}_profile.db" \
    --csv "$out/e2e_${prefix}.csv" --traces "$out/${prefix}_traces"
