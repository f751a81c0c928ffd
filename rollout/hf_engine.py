"""A rollout engine on plain transformers, for machines without vLLM (and as a cross-check).

It samples with the policy module itself (no copy, so ``update_weights`` has nothing to do),
from cached video embeddings, in the request's own layout and positions (the rule of
:mod:`core.positions` that the trainer and vLLM share): prefill once, then decode token by
token on the KV cache, each new token one position past the largest so far. Much slower than
vLLM; correct, not fast.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from core.video import VideoEmbedding
from families import VisualFeatures, family_of
from rollout.base import (
    Completion,
    PolicyHandle,
    RolloutEngine,
    RolloutRequest,
    RolloutResult,
    SamplingConfig,
    TurnRequest,
)
from rollout.guardrails import STOP_TOKENS, banned_token_ids


def _sample(
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
    banned: torch.Tensor | None = None,
) -> torch.Tensor:
    if banned is not None and banned.numel():  # never sampled (rollout.guardrails)
        logits = logits.index_fill(-1, banned.to(logits.device), float("-inf"))
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= sampling.top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class TransformersEngine(RolloutEngine):
    """Samples completions with a HF VLM, batched over the G completions of one prompt.

    No settings: it samples with the policy itself, on the policy's device and dtype (so no
    weights are gathered or pushed after an update, and it has nothing to put to sleep).
    """

    needs_weight_sync = False

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self.stop_ids: set[int] = set()
        self.banned: torch.Tensor | None = None
        """Token ids never sampled (:func:`rollout.guardrails.banned_token_ids`)."""

    @classmethod
    def for_model(cls, model: torch.nn.Module, tokenizer: Any) -> TransformersEngine:
        """An engine already started on ``model`` (evaluation uses one per batch)."""
        engine = cls()
        engine.start(PolicyHandle("", model, tokenizer))
        return engine

    def start(self, policy: PolicyHandle) -> None:
        self.model = policy.model
        self.tokenizer = policy.tokenizer
        self.stop_ids = {self.tokenizer.convert_tokens_to_ids(token) for token in STOP_TOKENS}
        self.banned = torch.tensor(banned_token_ids(policy.model.config, policy.tokenizer), dtype=torch.long)

    @torch.no_grad()
    def _complete(
        self,
        prompt: list[int],
        slots: torch.Tensor,
        positions: torch.Tensor,
        videos: Sequence[VideoEmbedding],
        n: int,
        sampling: SamplingConfig,
        seed: int | None,
    ) -> list[Completion]:
        """``n`` completions of ``prompt`` (videos expanded; ``slots`` marks their placeholders,
        filled with ``videos`` in order), prefilled once at ``positions``."""
        model = self.model
        assert model is not None, "TransformersEngine.start was not called"
        device = next(model.parameters()).device
        ids = torch.tensor([prompt] * n, device=device)
        embeddings = model.get_input_embeddings()(ids)
        family = family_of(model.config)
        visual = None
        if videos:
            slots = slots.to(device).expand(n, -1)
            parts = [family.split_encoding(video.embeds.to(device)) for video in videos]
            placeholders = torch.cat([placeholder for placeholder, _ in parts])
            cached = placeholders.to(dtype=embeddings.dtype).repeat(n, 1)
            embeddings = embeddings.masked_scatter(slots.unsqueeze(-1), cached)
            if parts[0][1] is not None:  # per-visual-token features (DeepStack), injected in the prefill
                extra = torch.cat([features for _, features in parts])
                visual = VisualFeatures(slots, extra.repeat(n, 1))
        attention = torch.ones(n, len(prompt), dtype=torch.long, device=device)
        out = family.forward(
            model,
            visual=visual,
            inputs_embeds=embeddings,
            attention_mask=attention,
            position_ids=positions.to(device).unsqueeze(1).expand(3, n, -1),
            use_cache=True,
            # Only the last position's logits are sampled from: over a long video prompt the
            # full-vocabulary logits of every position would be the largest tensor of the pass
            # (a 7B model at 512 frames: ~11 GiB a row in bf16).
            logits_to_keep=1,
        )
        stop_ids = self.stop_ids | {self.tokenizer.convert_tokens_to_ids(t) for t in sampling.stop_tokens}
        generator = torch.Generator(device=device)
        generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**31, (1,))))
        next_position = int(positions.max()) + 1 if len(prompt) else 0
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        done = [False] * n
        logits = out.logits[:, -1]
        past = out.past_key_values
        for _ in range(sampling.max_new_tokens):
            chosen = _sample(logits, sampling, generator, self.banned)
            # Log-probs under the model's own distribution (temperature 1, nothing banned), as
            # vLLM reports them.
            chosen_logprobs = (
                torch.log_softmax(logits.float(), dim=-1).gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
            )
            for i in range(n):
                if not done[i]:
                    tokens[i].append(int(chosen[i]))
                    logprobs[i].append(float(chosen_logprobs[i]))
                    done[i] = int(chosen[i]) in stop_ids
            if all(done):
                break
            attention = torch.cat([attention, torch.ones(n, 1, dtype=torch.long, device=device)], dim=1)
            step_positions = torch.full((3, n, 1), next_position, dtype=torch.long, device=device)
            out = model(
                inputs_embeds=model.get_input_embeddings()(chosen.unsqueeze(-1)),
                attention_mask=attention,
                position_ids=step_positions,
                past_key_values=past,
                use_cache=True,
            )
            logits, past = out.logits[:, -1], out.past_key_values
            next_position += 1
        return [
            Completion(
                t,
                lp,
                self.tokenizer.decode(t, skip_special_tokens=True),
                "stop" if t and t[-1] in stop_ids else "length",
            )
            for t, lp in zip(tokens, logprobs, strict=True)
        ]

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        assert self.model is not None, "TransformersEngine.start was not called"
        was_training = self.model.training
        self.model.eval()
        try:
            results = []
            for i, request in enumerate(requests):
                layout = request.layout
                videos = [request.video] if request.video is not None else []
                seed = None if sampling.seed is None else sampling.seed + i
                completions = self._complete(
                    layout.token_ids.tolist(),
                    layout.video_slots,
                    layout.positions,
                    videos,
                    sampling.n,
                    sampling,
                    seed,
                )
                results.append(RolloutResult(completions))
            return results
        finally:
            self.model.train(was_training)

    def generate_turns(self, requests: Sequence[TurnRequest], sampling: SamplingConfig) -> list[Completion]:
        """The next turn of each episode, one episode at a time (each has its own videos)."""
        assert self.model is not None, "TransformersEngine.start was not called"
        rule = family_of(self.model.config).position_rule
        was_training = self.model.training
        self.model.eval()
        try:
            return [
                self._complete(
                    request.token_ids(),
                    torch.tensor(request.video_slots()),
                    request.episode.positions(rule),
                    request.videos(),
                    1,
                    sampling,
                    None if sampling.seed is None else sampling.seed + i,
                )[0]
                for i, request in enumerate(requests)
            ]
        finally:
            self.model.train(was_training)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Nothing to do: this engine samples with the policy module itself."""
