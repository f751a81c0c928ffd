"""vLLM as the rollout engine, in the training process, fed cached video embeddings.

Facts this relies on (vLLM 0.32, measured; see ../shared/ENVIRONMENT.md):
- ``LLM(..., enable_mm_embeds=True)`` accepts ``{"video": {"video_embeds", "video_grid_thw",
  "second_per_grid_ts"}}``; with ``second_per_grid_ts`` the positions, greedy tokens and
  log-probs equal those of the raw-frames path (without it vLLM assumes 1 s per patch).
- ``logprobs=0`` returns the log-probability of each sampled token; the default
  ``logprobs_mode="raw_logprobs"`` reports them before temperature and top-p, i.e. under the
  model's own distribution, which is what the trainer computes.
- Live weight update: ``collective_rpc("reload_weights", kwargs={"weights_iterator": ...})``,
  then reset the prefix cache and the encoder cache (without the encoder-cache reset the next
  request on the same video killed the engine). ``reload_weights`` takes part of the weights
  per call, provided each fused layer (q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``:
  the model's ``packed_modules_mapping``) arrives whole in one call: a layer split across calls
  is rebuilt from uninitialised memory (its log-probs became NaN).
- Sleep mode is GPU-only, so on CPU :meth:`VLLMEngine.sleep` and :meth:`VLLMEngine.wake` do
  nothing (not measured on a GPU yet; from vLLM's documentation): level 1 offloads the weights
  to CPU memory and drops the KV cache, and ``wake_up(tags)`` brings back "weights" and
  "kv_cache" separately. Level 2 (weights dropped) would not do: only the trainable weights
  are pushed back, the frozen vision tower is not.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from core.rng import rng_states, set_rng_states
from core.video import VideoEmbedding
from families import ModelFamily, family_of
from rollout.base import (
    Completion,
    RolloutEngine,
    RolloutRequest,
    RolloutResult,
    SamplingConfig,
    TurnRequest,
)
from rollout.engine_limits import EngineLimitError, RolloutShape, batched_tokens_for, limit_problems
from rollout.guardrails import banned_token_ids
from rollout.weight_sync import fused_module_key

if TYPE_CHECKING:
    from rollout.base import PolicyHandle

log = logging.getLogger(__name__)

# In-process engine: starts in ~3 s instead of ~16 s and shares the trainer's memory space,
# which `weights_iterator` updates need. The CPU build also needs an explicit KV-cache size.
CPU_ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
# What sleep level 1 releases, woken separately: the weights before a sync, the KV cache after it.
SLEEP_TAGS = ("weights", "kv_cache")


CPU_UNSYNCABLE_MODEL_TYPES = ("qwen3_vl_moe",)
"""Models vllm-cpu serves from their files but whose weights it cannot reload in place (see
:meth:`VLLMEngine.start`); GPU builds are untested."""


@contextlib.contextmanager
def _long_max_model_len_allowed(allowed: bool) -> Iterator[None]:
    """vLLM reads ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` while it checks its config: set it for that
    moment only, when the engine's ``allow_long_max_model_len`` asks for it.

    An in-process engine core caches vLLM's environment when it starts
    (``vllm.envs.enable_envs_cache``), so a second engine in the same process would read the first
    one's value: the cache is dropped first, and the engine starting re-reads the environment."""
    import vllm.envs

    name = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
    before = os.environ.get(name)
    if allowed:
        os.environ[name] = "1"
    vllm.envs.disable_envs_cache()
    try:
        yield
    finally:
        if allowed:
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


UNSHAPED_MAX_MODEL_LEN = 4096
"""``max_model_len`` of an engine given no :class:`~rollout.engine_limits.RolloutShape` (one started
outside a run)."""


class UnsupportedOnThisBuild(RuntimeError):
    """The installed vLLM build cannot do what lvrl needs of it for this model."""


class VLLMEngine(RolloutEngine):
    """A colocated vLLM engine (in the training process).

    Args:
        dtype: ``float32`` (exact agreement with the trainer on CPU) or ``bfloat16``.
        max_model_len: longest prompt + completion, in tokens. null: the run's longest row, from
            the data (``data.num_frames`` at ``data.max_pixels_per_frame``, the prompt text bound
            ``data.max_prompt_tokens``, the rollouts' ``max_new_tokens``: :mod:`rollout.engine_limits`),
            or 4,096 for an engine started outside a run.
        max_num_seqs: sequences decoded together.
        gpu_memory_utilization: GPU share for weights + KV cache (ignored on CPU).
        enable_sleep_mode: between rollouts, offload the weights to CPU memory and drop the KV
            cache (vLLM's sleep level 1), leaving the GPU to training (GPU only: on CPU vLLM has
            no sleep mode and sleep/wake do nothing).
        seed: engine seed.
        videos_per_prompt: most videos one prompt holds: 1, or for tool-use episodes one more
            than the requests an episode may make (each reply adds a video segment).
        max_num_batched_tokens: tokens per vLLM forward; it also sizes vLLM's encoder cache,
            which must hold the longest video. null: derived from the data (the longest video
            ``data.num_frames`` at ``data.max_pixels_per_frame`` can give), or vLLM's default
            where that suffices (:mod:`rollout.engine_limits`).
        allow_long_max_model_len: let ``max_model_len`` exceed the model's
            ``max_position_embeddings`` (vLLM's ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``). Safe only when
            the rows' positions stay below it: under M-RoPE a video's positions grow with its
            duration, not its tokens.
    """

    def __init__(
        self,
        dtype: str = "float32",
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        gpu_memory_utilization: float = 0.4,
        enable_sleep_mode: bool = False,
        seed: int = 0,
        videos_per_prompt: int = 1,
        max_num_batched_tokens: int | None = None,
        allow_long_max_model_len: bool = False,
    ) -> None:
        if (max_model_len is not None and max_model_len < 1) or max_num_seqs < 1 or videos_per_prompt < 1:
            raise ValueError("max_model_len, max_num_seqs and videos_per_prompt must be at least 1")
        self.max_model_len = max_model_len
        if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be at least 1 (or null), got {max_num_batched_tokens}"
            )
        self.max_num_batched_tokens = max_num_batched_tokens
        self.batched_tokens = max_num_batched_tokens
        """What vLLM starts with (:meth:`admit` derives it when not configured); None: its default."""
        self.allow_long_max_model_len = allow_long_max_model_len
        self.videos_per_prompt = videos_per_prompt
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        self.dtype = dtype
        # vLLM's own arguments: always, and those only a GPU build takes.
        self.llm_args = {
            "max_model_len": max_model_len or UNSHAPED_MAX_MODEL_LEN,
            "max_num_seqs": max_num_seqs,
            "seed": seed,
        }
        self.gpu_args = {
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_sleep_mode": enable_sleep_mode,
        }
        self.llm: Any = None
        self.sleep_supported = False
        self.per_request_seed = False
        self.compile_stance = "default"
        self._in_process = False
        self.packed_modules: dict[str, list[str]] = {}
        self.asleep: set[str] = set()
        """The sleep tags (``SLEEP_TAGS``) not woken yet."""
        self.allowed_token_ids: list[int] | None = None
        """Every token id but the banned ones (:func:`rollout.guardrails.banned_token_ids`)."""
        self.tokenizer: Any = None
        self.family: ModelFamily | None = None
        """The policy's model family (what vLLM is given beside a cached encoding), set by :meth:`start`."""

    def admit(self, shape: RolloutShape, max_position_embeddings: int | None) -> None:
        """Size vLLM for rollouts of ``shape`` (its encoder cache must hold the longest video), or
        raise :class:`~rollout.engine_limits.EngineLimitError` with what vLLM would refuse."""
        self.batched_tokens = batched_tokens_for(shape, self.max_num_batched_tokens)
        self.llm_args["max_model_len"] = self.max_model_len or shape.row_tokens
        problems = limit_problems(
            shape,
            max_model_len=self.llm_args["max_model_len"],
            batched_tokens=self.batched_tokens,
            max_position_embeddings=max_position_embeddings,
            allow_long_max_model_len=self.allow_long_max_model_len,
            where="the VLLMEngine's init_args",
        )
        if problems:
            raise EngineLimitError("vLLM would refuse this run's rollouts:\n- " + "\n- ".join(problems))

    def start(self, policy: PolicyHandle) -> None:
        # vLLM collects the whole heap several times while it is imported, loads and warms up,
        # then freezes what is alive for serving (vllm.utils.gc_utils.freeze_gc_heap; its
        # EngineCore.shutdown unfreezes). Frozen before (and again once vLLM is imported), what
        # is already alive (torch, transformers, Lightning, the policy, vLLM's modules) stays out
        # of those collections: each walks only what was built since.
        gc.freeze()
        try:
            self._start(policy)
        except BaseException:
            gc.unfreeze()  # no engine will unfreeze at its shutdown
            raise

    def _start(self, policy: PolicyHandle) -> None:
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            for key, value in CPU_ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
        from vllm import LLM

        self.family = family_of(policy.model.config)
        self.tokenizer = policy.tokenizer
        if not on_gpu and policy.model.config.model_type in CPU_UNSYNCABLE_MODEL_TYPES:
            raise UnsupportedOnThisBuild(
                f"vllm-cpu 0.32 serves {policy.model.config.model_type} but cannot take its weights "
                "back after an update: reloading its fused experts in place leaves them wrong (syncing "
                "unchanged weights moved its log-probs by 10 nats; measured), so RL would sample from "
                "another model. Use the transformers engine for this model: trainer.callbacks' "
                "RolloutCallback init_args.engine.class_path: rollout.hf_engine.TransformersEngine"
            )
        self.sleep_supported = on_gpu and bool(self.gpu_args["enable_sleep_mode"])
        # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a request with its
        # own seed has a sampled token discarded during a chunked prefill; on CPU the
        # engine-level seed alone keeps runs reproducible.
        self.per_request_seed = on_gpu
        # vLLM compiles a few helper ops with torch.compile whatever enforce_eager says; on the CPU
        # that is inductor's C++ build of its log-prob rank count, at the warm-up's first sampled
        # log-prob: seconds of every process that starts an engine, for an op of microseconds
        # at these sizes. The CPU engine starts and generates with them eager (the same
        # integers); on the GPU vLLM's compilation is its own.
        self.compile_stance = "default" if on_gpu else "force_eager"
        self._in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        # An in-process vLLM engine seeds the global RNGs when it starts; keep the caller's
        # (a trainer's, restored from a checkpoint on a resume).
        caller_rng = rng_states()
        sized = {"max_num_batched_tokens": self.batched_tokens} if self.batched_tokens is not None else {}
        gc.freeze()  # vLLM's modules too, now imported (see start)
        with (
            _long_max_model_len_allowed(self.allow_long_max_model_len),
            torch.compiler.set_stance(self.compile_stance),
        ):
            self.llm = LLM(
                model=policy.model_path,
                dtype=self.dtype,
                enforce_eager=not on_gpu,
                limit_mm_per_prompt={"image": 0, "video": self.videos_per_prompt},
                enable_mm_embeds=True,
                **self.llm_args,
                **sized,
                **(self.gpu_args if on_gpu else {}),
            )
        set_rng_states(caller_rng)
        banned = set(banned_token_ids(policy.model.config, policy.tokenizer))
        vocabulary = self.llm.llm_engine.model_config.get_vocab_size()
        # vLLM masks everything else to -inf before sampling, after taking the raw log-probs.
        self.allowed_token_ids = [i for i in range(vocabulary) if i not in banned] if banned else None
        self.asleep = set()
        self.packed_modules = self._packed_modules()

    def _packed_modules(self) -> dict[str, list[str]]:
        """vLLM's fused layers for this model, each with the HF modules it packs (the class that
        vLLM's loader resolves for the model's config; read here, not in the workers)."""
        from vllm.model_executor.model_loader.utils import get_model_cls

        mapping = getattr(get_model_cls(self.llm.llm_engine.model_config), "packed_modules_mapping", {})
        return {fused: list(parts) for fused, parts in mapping.items()}

    def refusal(self, request: RolloutRequest) -> str | None:
        """What vLLM answers when ``request`` is submitted and withdrawn before it runs: None if
        it takes it, else its reason (nothing is computed beyond vLLM's input checks)."""
        from vllm.exceptions import VLLMClientError

        request_id = f"lvrl-admission-{id(request)}"
        params = self._params(SamplingConfig(n=1, temperature=0.0, max_new_tokens=1), 1)
        try:
            self.llm.llm_engine.add_request(request_id, self._prompt(request), params)
        except (VLLMClientError, ValueError) as refused:
            return str(refused)
        self.llm.llm_engine.abort_request([request_id])
        return None

    def _prompt(self, request: RolloutRequest) -> dict[str, Any]:
        # The prompt as the chat template wrote it (one placeholder per video): vLLM expands it
        # from the embeddings' grid itself; the family says what vLLM needs beside them.
        prompt: dict[str, Any] = {"prompt_token_ids": request.layout.collapsed_ids()}
        if request.video is not None:
            assert self.family is not None, "VLLMEngine.start was not called"
            prompt["multi_modal_data"] = {"video": self.family.vllm_video_input(request.video)}
        return prompt

    def _params(self, sampling: SamplingConfig, n: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            seed=sampling.seed if self.per_request_seed else None,
            allowed_token_ids=self.allowed_token_ids,
            stop_token_ids=[self.tokenizer.convert_tokens_to_ids(t) for t in sampling.stop_tokens] or None,
        )

    def _run(self, prompts: list[dict[str, Any]], params: Any, seed: int | None) -> list[Any]:
        if self.asleep:  # woken without a sync in between
            self.llm.wake_up(sorted(self.asleep))
            self.asleep.clear()
        if self.per_request_seed or seed is None or not self._in_process:
            return self._generate(prompts, params)
        # Without per-request seeds the in-process sampler draws from torch's global CPU
        # generator, whose state would depend on every earlier rollout: seed it for this call
        # (the same seed gives the same samples, also after a resume) and give the trainer
        # its own generator state back.
        trainer_state = torch.get_rng_state()
        torch.manual_seed(seed)
        try:
            return self._generate(prompts, params)
        finally:
            torch.set_rng_state(trainer_state)

    def _generate(self, prompts: list[dict[str, Any]], params: Any) -> list[Any]:
        with torch.compiler.set_stance(self.compile_stance):
            return self.llm.generate(prompts, params, use_tqdm=False)

    @staticmethod
    def _completions(output: Any, expected_prompt: list[int]) -> list[Completion]:
        if list(output.prompt_token_ids) != expected_prompt:
            # The trainer scores the completions in the request's layout: a different
            # expansion would put the video embeddings (and positions) elsewhere.
            raise RuntimeError("vLLM expanded the prompt differently from the request's layout")
        completions = []
        for sample in output.outputs:
            ids = list(sample.token_ids)
            assert sample.logprobs is not None
            logprobs = [
                float(position[token].logprob) for token, position in zip(ids, sample.logprobs, strict=True)
            ]
            completions.append(Completion(ids, logprobs, sample.text, str(sample.finish_reason)))
        return completions

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        outputs = self._run(
            [self._prompt(r) for r in requests], self._params(sampling, sampling.n), sampling.seed
        )
        return [
            RolloutResult(self._completions(output, request.layout.token_ids.tolist()))
            for request, output in zip(requests, outputs, strict=True)
        ]

    def generate_turns(self, requests: Sequence[TurnRequest], sampling: SamplingConfig) -> list[Completion]:
        """The next turn of each episode: the tokens so far as the prompt (each video one
        placeholder, vLLM expands them from their encodings' grids), one sample each."""
        assert self.family is not None, "VLLMEngine.start was not called"
        prompts = []
        for request in requests:
            videos = request.videos()
            if len(videos) > self.videos_per_prompt:
                raise ValueError(
                    f"an episode holds {len(videos)} videos but the engine takes {self.videos_per_prompt} "
                    "per prompt: raise the vLLM engine's videos_per_prompt"
                )
            prompt: dict[str, Any] = {"prompt_token_ids": request.episode.engine_prompt()}
            if videos:
                prompt["multi_modal_data"] = {"video": _merged_videos_input(self.family, videos)}
            prompts.append(prompt)
        outputs = self._run(prompts, self._params(sampling, 1), sampling.seed)
        return [
            self._completions(output, request.token_ids())[0]
            for request, output in zip(requests, outputs, strict=True)
        ]

    def weight_group(self, name: str) -> str:
        """The vLLM layer ``name`` loads into: q/k/v and gate/up projections share one."""
        return fused_module_key(name, self.packed_modules)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (HF parameter names, whole fused layers) into the engine;
        :meth:`finish_weight_update` after the last call of a sync."""
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        assert self.family is not None, "VLLMEngine.start was not called"
        # vLLM loads the released checkpoints' layout (Qwen3-VL-MoE's transposed experts).
        released = self.family.released_state_dict(dict(weights))
        if released is not None:
            weights = list(released.items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    def finish_weight_update(self) -> None:
        """Drop the cached prefixes and encoder outputs, computed with the old weights. The KV
        cache stays asleep until the next :meth:`generate` wakes it: what runs between the sync
        and the next rollout (a validation, a checkpoint) has the device without it."""
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()

    def shutdown(self) -> None:
        """Stop the engine's core (best effort: used on an engine that has failed)."""
        if self.llm is None:
            return
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    def sleep(self) -> None:
        """Offload the weights to CPU memory and drop the KV cache (GPU with
        ``enable_sleep_mode``; nothing otherwise)."""
        if self.sleep_supported and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = set(SLEEP_TAGS)

    def wake(self) -> None:
        """Bring the weights back, so that the sync can load into them; the KV cache follows at
        :meth:`finish_weight_update` (or the next :meth:`generate`)."""
        if "weights" in self.asleep:
            self.llm.wake_up(["weights"])
            self.asleep.discard("weights")


def _merged_videos_input(family: ModelFamily, videos: Sequence[VideoEmbedding]) -> dict[str, Any]:
    """One ``multi_modal_data["video"]`` entry for several cached encodings: vLLM takes a prompt's
    videos as one batch (embeddings and per-video fields concatenated in placeholder order), not
    as a list of entries."""
    entries = [family.vllm_video_input(video) for video in videos]
    merged: dict[str, Any] = {}
    for key, first in entries[0].items():
        values = [entry[key] for entry in entries]
        merged[key] = torch.cat(values) if isinstance(first, torch.Tensor) else [x for v in values for x in v]
    return merged
