#!/bin/bash
# Device check (2026-11-30), one call: the prepared gpu_check at this commit, the CUDA-only unit
# test, then the zoom task with given-oracle rows (issue 48) on CUDA through the rollout worker of
# issue 49: seed 0's recipe-5 GRPO export evaluated greedily (80 validation questions, up to two
# requests of 16 frames) and 3 GRPO steps of recipe 5 continued from it (8 prompts x 8 episodes).
# .gpu/ (ignored, carried) holds site.tar.xz (PyAV, webdataset, jsonargparse and their needs,
# installed from wheels and packed), the export (hf/ + model.safetensors.xz), eval.yaml, grpo.yaml.
# LOCAL=1 ACC=cpu PY=.venv/bin/python DATA=... rehearses it on the CPU machine.
set -u; export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Z=.gpu; t0=$(date +%s); R=/tmp/run; mkdir -p $R
ACC=${ACC:-gpu}; PY=${PY:-python3}; OUT=${OUT:-runs/zoom_cuda_given50}; DATA=${DATA:-/tmp/data}
mkdir -p "$OUT"
if [ -z "${LOCAL:-}" ]; then
  mkdir -p /tmp/site && tar -C /tmp/site -xJf $Z/site.tar.xz || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
else export PYTHONPATH=$PWD; fi
mkdir -p /tmp/m && cp $Z/hf/* /tmp/m/ && xz -dc $Z/model.safetensors.xz > /tmp/m/model.safetensors
sha256sum /tmp/m/model.safetensors
$PY -c "import sys, torch, transformers, lightning, av, webdataset, jsonargparse; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__, 'av', av.__version__)"
printf "import sys\nfrom app.cli import main\nif __name__ == \"__main__\":\n    main(sys.argv[1:])\n" > $R/lvrl.py
if [ ! -f $DATA/dataset.json ]; then
  ( s=$(date +%s); $PY $R/lvrl.py data zoom --out $DATA --trace-requests random --given-oracle-share 0.5 \
      --workers 12 > $R/data.log 2>&1; echo "data rc=$? $(( $(date +%s)-s )) s" > $R/data.done ) &
else echo "data rc=0 0 s (given)" > $R/data.done; fi
echo "setup $(( $(date +%s) - t0 )) s"
s=$(date +%s)
if [ "$ACC" = gpu ]; then timeout 150 $PY bench/gpu_check.py --layers 2 --frames 512 --out $OUT
else timeout 150 $PY bench/gpu_check.py --cpu-dry-run --out $OUT; fi
echo "gpu_check rc=$? $(( $(date +%s)-s )) s"
timeout 60 $PY -m pytest -q -p no:cacheprovider tests/unit/test_device_memory.py 2>&1 | tail -2
while [ ! -f $R/data.done ]; do sleep 2; done; cat $R/data.done; tail -c 600 $R/data.log 2>/dev/null | tr '\r' '\n' | tail -3
sha256sum $DATA/val-00000.tar $DATA/train-00000.tar
for c in eval grpo; do sed -e "s#OUTDIR#$R#g" -e "s#/tmp/data#$DATA#g" -e "s#accelerator: gpu#accelerator: $ACC#" $Z/$c.yaml > $R/$c.yaml; done
s=$(date +%s); timeout ${EVAL_TIMEOUT:-150} $PY $R/lvrl.py validate --config $R/eval.yaml \
  --trainer.limit_val_batches ${BATCHES:-10} > $OUT/eval.log 2>&1; echo "validate rc=$? $(( $(date +%s)-s )) s"
cp $R/eval/predictions/val-step000000.jsonl $OUT/predictions.jsonl
s=$(date +%s); timeout ${FIT_TIMEOUT:-150} $PY $R/lvrl.py fit --config $R/grpo.yaml ${FIT_ARGS:-} > $OUT/grpo.log 2>&1
echo "fit rc=$? $(( $(date +%s)-s )) s"
cp $R/grpo/csv/version_0/metrics.csv $OUT/grpo-metrics.csv; cp $R/grpo/rollout_samples.jsonl $OUT/ 2>/dev/null
grep -h "\[memory\]\|step [0-9]" $OUT/grpo.log | tail -8
echo "total $(( $(date +%s) - t0 )) s"
