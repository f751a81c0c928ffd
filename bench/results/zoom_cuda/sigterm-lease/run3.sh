#!/bin/bash
# Device check 3: RolloutCallback's per-phase memory metrics, 2 GRPO steps of run 1's config (its steps 1-2: the same batches).
set -u; export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
Z=.gpu/z26; t0=$(date +%s); R=/tmp/run; mkdir -p $R
mkdir -p /tmp/site && tar -C /tmp/site -xJf $Z/site.tar.xz || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/bench/results/grpo_3b_cuda
mkdir -p /tmp/m && cp $Z/hf/* /tmp/m/ && xz -dc $Z/model.safetensors.xz > /tmp/m/model.safetensors
printf "import sys\nfrom app.cli import main\nif __name__ == \"__main__\":\n    main(sys.argv[1:])\n" > $R/lvrl.py
python3 $R/lvrl.py data zoom --out /tmp/data --num-test 0 --workers 15 > $OUT/data.log 2>&1
echo "setup $(( $(date +%s) - t0 )) s"
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/unit/test_device_memory.py 2>&1 | tail -2
sed -e "s#OUTDIR#$R#g" $Z/grpo.yaml | grep -v "class_path: peak_memory" > $R/grpo.yaml
s=$(date +%s); timeout ${FIT_TIMEOUT:-110} python3 $R/lvrl.py fit --config $R/grpo.yaml --trainer.max_steps 2 > $OUT/grpo.log 2>&1; echo "fit rc=$? $(( $(date +%s)-s )) s"
cp $R/grpo/csv/version_0/metrics.csv $OUT/metrics.csv
grep -h "\[memory\]" $OUT/grpo.log
python3 -c "
import csv
for r in csv.DictReader(open('$OUT/metrics.csv')):
    print({k: r[k] for k in r if (k.startswith('memory/') or k.startswith('cuda/')) and r[k]})
"
echo "total $(( $(date +%s) - t0 )) s"
