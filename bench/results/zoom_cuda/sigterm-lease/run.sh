#!/bin/bash
# Device check (session 27): the zoom task's tool-use evaluation and GRPO steps on CUDA.
set -u; export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Z=.gpu/z26; t0=$(date +%s); R=/tmp/run; mkdir -p $R
DATA=${DATA:-/tmp/data}; ACC=${ACC:-gpu}; PY=${PY:-python3}
if [ -z "${LOCAL:-}" ]; then
  mkdir -p /tmp/site && tar -C /tmp/site -xJf $Z/site.tar.xz || exit 1
  export PYTHONPATH=/tmp/site:$PWD:$PWD/bench/results/grpo_3b_cuda
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.txt
else export PYTHONPATH=$PWD:$PWD/bench/results/grpo_3b_cuda; fi
mkdir -p /tmp/m && cp $Z/hf/* /tmp/m/ && xz -dc $Z/model.safetensors.xz > /tmp/m/model.safetensors
$PY -c "import torch, transformers, lightning, av; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__, 'av', av.__version__)" >> $OUT/device.txt
printf "import sys\nfrom app.cli import main\nif __name__ == \"__main__\":\n    main(sys.argv[1:])\n" > $R/lvrl.py
lvrl() { $PY $R/lvrl.py "$@"; }
if [ ! -f $DATA/dataset.json ]; then
  s=$(date +%s); lvrl data zoom --out $DATA --workers 14 > $OUT/data.log 2>&1; echo "data rc=$? $(( $(date +%s)-s )) s"
fi
sha256sum $DATA/val-00000.tar $DATA/test-00000.tar $DATA/train-00000.tar >> $OUT/device.txt
echo "setup $(( $(date +%s) - t0 )) s"
for c in eval grpo; do sed -e "s#OUTDIR#$R#g" -e "s#/tmp/data#$DATA#g" -e "s#accelerator: gpu#accelerator: $ACC#" $Z/$c.yaml > $R/$c.yaml; done
s=$(date +%s); timeout ${EVAL_TIMEOUT:-190} $PY $R/lvrl.py validate --config $R/eval.yaml ${EVAL_ARGS:-} > $OUT/eval.log 2>&1; echo "validate rc=$? $(( $(date +%s)-s )) s"
cp $R/eval/predictions/val-step000000.jsonl $OUT/predictions.jsonl 2>/dev/null
$PY $Z/compare.py bench/results/zoom/sft900/seed1/grpo-tool-eval/predictions/val-step000000.jsonl $OUT/predictions.jsonl
s=$(date +%s); timeout ${FIT_TIMEOUT:-130} $PY $R/lvrl.py fit --config $R/grpo.yaml ${FIT_ARGS:-} > $OUT/grpo.log 2>&1; echo "fit rc=$? $(( $(date +%s)-s )) s"
cp $R/grpo/csv/version_0/metrics.csv $OUT/grpo-metrics.csv 2>/dev/null
grep -h "\[memory\]" $OUT/grpo.log | tail -8
cat $OUT/device.txt; echo "total $(( $(date +%s) - t0 )) s"
