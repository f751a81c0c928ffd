#!/bin/bash
# Device check 2: the tool-use evaluation on CUDA against the CPU's predictions, 80 validation questions.
set -u; export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Z=.gpu/z26; t0=$(date +%s); R=/tmp/run; mkdir -p $R
mkdir -p /tmp/site && tar -C /tmp/site -xJf $Z/site.tar.xz || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/m && cp $Z/hf/* /tmp/m/ && xz -dc $Z/model.safetensors.xz > /tmp/m/model.safetensors
printf "import sys\nfrom app.cli import main\nif __name__ == \"__main__\":\n    main(sys.argv[1:])\n" > $R/lvrl.py
python3 $R/lvrl.py data zoom --out /tmp/data --num-train 0 --num-test 0 --workers 8 > $OUT/data.log 2>&1
sha256sum /tmp/data/val-00000.tar
echo "setup $(( $(date +%s) - t0 )) s"
sed -e "s#OUTDIR#$R#g" $Z/eval.yaml > $R/eval.yaml
s=$(date +%s); timeout ${EVAL_TIMEOUT:-200} python3 $R/lvrl.py validate --config $R/eval.yaml --data.val_shards '/tmp/data/val-*.tar' --trainer.limit_val_batches ${BATCHES:-10} > $OUT/eval.log 2>&1; echo "validate rc=$? $(( $(date +%s)-s )) s"
cp $R/eval/predictions/val-step000000.jsonl $OUT/predictions.jsonl
python3 $Z/compare.py bench/results/zoom/sft900/seed1/grpo-tool-eval/predictions/val-step000000.jsonl $OUT/predictions.jsonl
grep -h "val/" $OUT/eval.log | tail -12; echo "total $(( $(date +%s) - t0 )) s"
