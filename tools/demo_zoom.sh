#!/usr/bin/env bash
# `make demo-zoom`: frames on request, end to end on the zoom task (lvrl data zoom): build the
# small model, CoT-SFT on the tool traces (16-frame overview + one request of up to 16 frames),
# CoT-SFT on dense 256-frame input for comparison (same steps), GRPO with frame requests from the
# tool SFT export, then evaluate each on the 400 held-out questions: tool use (the rollout code
# answers), and the dense model at 16, 64 and 256 frames; a paired comparison and a table of
# accuracy against frames seen (runs/zoom/accuracy.md).
#
# DATA_DIR: the task's shards (built there if missing; default data/zoom). FAMILY: the small
# model's family (default qwen3_vl; qwen2_5_vl also runs). DEMO_ARGS: arguments
# added to every fit and validate, e.g. a smoke run of the whole pipeline in minutes:
#   DEMO_ARGS="--trainer.max_steps 2 --trainer.val_check_interval 2 --trainer.limit_val_batches 1"
set -euo pipefail
run_dir=${1:-runs/zoom}
data_dir=${DATA_DIR:-data/zoom}
# Qwen3-VL writes each temporal patch's time as text, which the small model reads; the small
# Qwen2.5-VL model did not learn to read times from M-RoPE positions alone (docs/tool-use.md).
family=${FAMILY:-qwen3_vl}
lvrl=.venv/bin/lvrl
export WANDB_MODE=${WANDB_MODE:-offline}
start=$(date +%s)
data_args=(--data.init_args.train_shards "$data_dir/train-*.tar" --data.init_args.val_shards "$data_dir/val-*.tar")
held_out=(--trainer.limit_val_batches null --data.init_args.val_shards "$data_dir/{val,test}-*.tar")
read -ra extra <<<"${DEMO_ARGS:-}"

if [ ! -f "$data_dir/dataset.json" ]; then
  "$lvrl" data zoom --out "$data_dir"
fi
# --reuse keeps the model the stages in $run_dir were trained from and refuses another family's.
"$lvrl" model build --family "$family" --preset small --out "$run_dir/model-small" --reuse \
  --corpus "$data_dir"/train-00000.tar

# train_and_evaluate NAME CONFIG START: fit CONFIG from the model START into $run_dir/NAME, then
# answer the held-out questions with its export into $run_dir/NAME-eval.
train_and_evaluate() {
  local name=$1 config=$2 start_from=$3
  "$lvrl" fit --config "$config" --trainer.default_root_dir "$run_dir/$name" \
    --model.init_args.model_path "$start_from" "${data_args[@]}" "${extra[@]}"
  "$lvrl" validate --config "$config" --trainer.default_root_dir "$run_dir/$name-eval" \
    --model.init_args.model_path "$run_dir/$name/hf" "${data_args[@]}" "${held_out[@]}" "${extra[@]}"
}

echo "== CoT-SFT on tool traces"
train_and_evaluate sft-tool configs/zoom/sft_tool.yaml "$run_dir/model-small"
echo "== CoT-SFT on dense frames (the baseline)"
train_and_evaluate sft-dense configs/zoom/sft_dense.yaml "$run_dir/model-small"
echo "== GRPO with frame requests"
train_and_evaluate grpo-tool configs/zoom/grpo_tool.yaml "$run_dir/sft-tool/hf"

echo "== held-out accuracy"
"$lvrl" report compare --run "tool SFT=$run_dir/sft-tool-eval" --run "tool GRPO=$run_dir/grpo-tool-eval" \
  --run "dense SFT=$run_dir/sft-dense-eval" --out "$run_dir/accuracy.md"
"$lvrl" report frames --run "tool SFT=$run_dir/sft-tool-eval" --run "tool GRPO=$run_dir/grpo-tool-eval" \
  --run "dense SFT=$run_dir/sft-dense-eval" --out "$run_dir/accuracy_vs_frames.png"
end=$(date +%s)
echo "demo-zoom finished in $((end - start)) s"
