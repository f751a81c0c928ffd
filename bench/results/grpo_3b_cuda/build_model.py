"""Write a random-weight model directory of Qwen2.5-VL-3B-Instruct's published widths
(models.architectures.PUBLISHED_CONFIGS), with the tokenizer, processor and special-token ids of
a small `lvrl model build --family qwen2_5_vl` directory; weights saved in bfloat16. With
--config-only: config and processor alone (for `lvrl plan`)."""

import json
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository
from models.architectures import PUBLISHED_CONFIGS

small, out = Path(sys.argv[1]), Path(sys.argv[2])
config_only = "--config-only" in sys.argv
started = time.perf_counter()
base = json.loads((small / "config.json").read_text())
ids = {
    k: base[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
}
text_ids = {k: base["text_config"][k] for k in ("bos_token_id", "eos_token_id")}
fields = {k: v for k, v in PUBLISHED_CONFIGS["qwen2.5-vl-3b"].items() if k != "model_type"}
config = Qwen2_5_VLConfig(**fields, **ids, **text_ids)
out.mkdir(parents=True, exist_ok=True)
for item in small.iterdir():
    if item.name not in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(item, out / item.name)
device = torch.device("meta" if config_only else ("cuda" if torch.cuda.is_available() else "cpu"))
torch.manual_seed(0)
previous = torch.get_default_dtype()
torch.set_default_dtype(torch.bfloat16)
with device:
    model = Qwen2_5_VLForConditionalGeneration(config)
torch.set_default_dtype(previous)
if config_only:
    config.save_pretrained(out)
else:
    model.save_pretrained(out)
count = sum(p.numel() for p in model.parameters())
print(
    f"qwen2.5-vl-3b widths: {count:,} parameters, written to {out} in {time.perf_counter() - started:.1f} s"
)
