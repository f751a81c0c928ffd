#!/usr/bin/env bash
# `make demo`: build the small model and the synthetic data if missing, CoT-SFT, evaluate.
set -euo pipefail
run_dir=${1:-runs/demo}
data_dir=${DATA_DIR:-data/synth}
lvrl=.venv/bin/lvrl
export WANDB_MODE=${WANDB_MODE:-offline}
start=$(date +%s)

if [ ! -f "$data_dir/dataset.json" ]; then
  "$lvrl" data synth --out "$data_dir"
fi
if [ ! -f "$run_dir/model-small/config.json" ]; then
  "$lvrl" model build --preset small --out "$run_dir/model-small" --corpus "$data_dir"/train-00000.tar
fi

"$lvrl" fit --config configs/demo/sft.yaml \
  --trainer.default_root_dir "$run_dir/sft" \
  --model.init_args.model_path "$run_dir/model-small" \
  --data.init_args.train_shards "$data_dir/train-*.tar" --data.init_args.val_shards "$data_dir/val-*.tar"

# Evaluate the exported Hugging Face directory on the whole validation split.
"$lvrl" validate --config configs/demo/sft.yaml \
  --trainer.default_root_dir "$run_dir/sft-eval" --trainer.limit_val_batches null \
  --model.init_args.model_path "$run_dir/sft/hf" \
  --data.init_args.val_shards "$data_dir/val-*.tar"

echo "demo finished in $(( $(date +%s) - start )) s"
