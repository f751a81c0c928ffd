#!/usr/bin/env bash
# `make demo`: build the small model and the synthetic data if missing, CoT-SFT, evaluate, GRPO
# from the SFT export, evaluate again, then print accuracy per category before and after GRPO
# and plot the reward curve. FAMILY=qwen2_vl|qwen3_vl runs it on another model family (the
# default is qwen2_5_vl; only the model directory changes, the configs are the same).
#
# A reduced run (the test suite runs one: tests/e2e/test_demo_script.py) sets its size, and only
# its size, from the environment; unset, each is the configs' own:
#   DEMO_SFT_STEPS, DEMO_GRPO_STEPS  training steps of each stage (validation runs at the last one)
#   DEMO_EVAL_BATCHES                held-out batches of each evaluation (of the configs'
#                                    val_batch_size questions; default: every question)
#   DEMO_EVAL_SAMPLES                answers sampled per question at temperature 1 (default 8)
#   DEMO_DATA_SAMPLES                synthetic questions built per split, when the data is
#                                    built here (default: lvrl data synth's 2,000 / 200 / 200)
# and LVRL the lvrl executable (default .venv/bin/lvrl), DATA_DIR the synthetic data's folder.
set -euo pipefail
run_dir=${1:-runs/demo}
data_dir=${DATA_DIR:-data/synth}
lvrl=${LVRL:-.venv/bin/lvrl}
export WANDB_MODE=${WANDB_MODE:-offline}
start=$(date +%s)
data_args=(--data.init_args.train_shards "$data_dir/train-*.tar" --data.init_args.val_shards "$data_dir/val-*.tar")

# A stage's step count, when reduced: train that many steps and validate at the last one, on at
# most DEMO_EVAL_BATCHES batches.
stage_size() {
  local steps=$1
  if [ -n "$steps" ]; then
    echo --trainer.max_steps "$steps" --trainer.val_check_interval "$steps"
  fi
  if [ -n "${DEMO_EVAL_BATCHES:-}" ]; then
    echo --trainer.limit_val_batches "$DEMO_EVAL_BATCHES"
  fi
}

if [ ! -f "$data_dir/dataset.json" ]; then
  # shellcheck disable=SC2046 # the counts are separate words on purpose
  "$lvrl" data synth --out "$data_dir" $(
    if [ -n "${DEMO_DATA_SAMPLES:-}" ]; then
      echo --num-train "$DEMO_DATA_SAMPLES" --num-val "$DEMO_DATA_SAMPLES" --num-test "$DEMO_DATA_SAMPLES"
    fi
  )
fi
if [ ! -f "$run_dir/model-small/config.json" ]; then
  "$lvrl" model build --family "${FAMILY:-qwen2_5_vl}" --preset small --out "$run_dir/model-small" \
    --corpus "$data_dir"/train-00000.tar
fi

# Evaluate an exported Hugging Face directory on every held-out question (validation + test
# splits, 400 questions: twice the power of the validation split alone for the before/after test):
# the greedy answer, and 8 answers sampled at temperature 1 (the policy RL trains; their mean
# accuracy moves before the greedy answer does).
evaluate() {
  "$lvrl" validate --config configs/demo/sft.yaml \
    --trainer.default_root_dir "$2" --trainer.limit_val_batches "${DEMO_EVAL_BATCHES:-null}" \
    --model.init_args.model_path "$1" --model.init_args.val_samples "${DEMO_EVAL_SAMPLES:-8}" "${data_args[@]}" \
    --data.init_args.val_shards "$data_dir/{val,test}-*.tar"
}

echo "== stage 1: CoT-SFT"
# shellcheck disable=SC2046 # stage_size prints separate words on purpose
"$lvrl" fit --config configs/demo/sft.yaml $(stage_size "${DEMO_SFT_STEPS:-}") \
  --trainer.default_root_dir "$run_dir/sft" \
  --model.init_args.model_path "$run_dir/model-small" "${data_args[@]}"
evaluate "$run_dir/sft/hf" "$run_dir/sft-eval"
sft_done=$(date +%s)

echo "== stage 2: GRPO from the SFT export"
# shellcheck disable=SC2046
"$lvrl" fit --config configs/demo/grpo.yaml $(stage_size "${DEMO_GRPO_STEPS:-}") \
  --trainer.default_root_dir "$run_dir/grpo" \
  --model.init_args.model_path "$run_dir/sft/hf" "${data_args[@]}"
evaluate "$run_dir/grpo/hf" "$run_dir/grpo-eval"

echo "== held-out accuracy (greedy answers, validation + test splits)"
"$lvrl" report compare --run "after SFT=$run_dir/sft-eval" --run "after GRPO=$run_dir/grpo-eval" \
  --out "$run_dir/accuracy.md"
"$lvrl" report curve --run "$run_dir/grpo" --metric reward/total_mean --metric rollout/accuracy \
  --smooth 20 --out "$run_dir/grpo_reward.png"
end=$(date +%s)
echo "library messages of each stage (vLLM, transformers, warnings): $run_dir/*/lvrl.log"
echo "demo finished in $((end - start)) s (SFT + eval $((sft_done - start)) s, GRPO + eval $((end - sft_done)) s)"
