"""The tiny model edited to put almost all next-token mass on one token, whatever the input."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoProcessor

from models.loading import load_model


def save_biased_model(
    model_dir: Path, out: Path, token: str, margin: float = 40.0, share: float | None = None
) -> Path:
    """A copy of ``model_dir`` in ``out`` that emits ``token`` next, ``margin`` logits above the
    rest (40: always; about 0: as often as the likeliest other token), or, given ``share``, with
    that probability (the other tokens keep their own distribution, scaled by ``1 - share``).

    The last layer's value bias becomes large and its value weights zero: attention weights sum
    to 1, so every position gets the same large vector added (through ``o_proj``), and after
    the final norm every position's hidden state points the same way. The token's output row
    is then set along that direction, ``margin`` logits above the rest.
    """
    model = load_model(model_dir)
    processor = AutoProcessor.from_pretrained(model_dir)
    token_id = processor.tokenizer.convert_tokens_to_ids(token)
    text = model.model.language_model
    attention = text.layers[-1].self_attn
    with torch.no_grad():
        attention.v_proj.weight.zero_()
        attention.v_proj.bias.copy_(
            torch.randn(attention.v_proj.bias.shape, generator=torch.Generator().manual_seed(0))
        )
        attention.v_proj.bias.mul_(1e4)
        hidden = text(input_ids=torch.tensor([[40, 41, 42, 43]])).last_hidden_state[0]  # after the norm
        direction = hidden.mean(dim=0)
        assert torch.nn.functional.cosine_similarity(hidden, direction.expand_as(hidden)).min() > 0.999
        head = model.lm_head.weight
        others = head @ direction
        if share is None:
            logit = float(others.max()) + margin
        else:  # p = e^l / (e^l + sum of the others' e^l)  <=>  l = log(p / (1 - p)) + logsumexp(others)
            others[token_id] = -torch.inf
            logit = math.log(share / (1 - share)) + float(torch.logsumexp(others, dim=0))
        head[token_id] = direction / direction.norm() ** 2 * logit
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
