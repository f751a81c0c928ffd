"""A Qwen2.5-VL-style tokenizer trained locally: byte-level BPE, Qwen's special tokens, a chat template.

Nothing may be downloaded on our machines, so the tiny and small test models get a tokenizer
trained here, in well under a second, on a built-in corpus (plus optional extra texts). It
copies what matters of Qwen2's tokenizer so that code written against the real checkpoints
works unchanged on ours:

- the same normalizer (NFC), pre-tokenizer (Qwen2's split regex, then byte-level without
  prefix space) and byte-level decoder, so every unicode string round-trips (up to NFC);
- Qwen2.5-VL's special tokens with their exact spellings (ids differ: they come first here);
- ``eos_token = <|im_end|>`` and ``pad_token = <|endoftext|>``, as in the Instruct checkpoints;
- a chat template that renders the same text as Qwen2.5-VL's (and Qwen2-VL's) for
  system/user/assistant turns with string or ``[{"type": "text" | "video" | "image"}]``
  content; :func:`chat_template` gives Qwen3-VL's variant, without the default system turn.
  The vision special tokens are spelled alike in all three families, so one tokenizer serves
  them all.

We add the reasoning tags ``<think> </think> <answer> </answer>`` as (non-special) added tokens:
each becomes one id, which shortens every CoT target, and they survive
``decode(..., skip_special_tokens=True)`` so reward functions still see them. The tool tags
``<tool_call> </tool_call> <tool_response> </tool_response>`` follow them, one id each as in
Qwen2.5/Qwen3's tokenizers (the end of a call is where the engines stop for a frame request).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from core.tool_use.requests import TOOL_TAGS
from families.presets.base import EOS_TOKEN, PAD_TOKEN

# Qwen2.5-VL's special tokens, in the order of the real vocabulary (151643 ... 151656).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
REASONING_TAGS: tuple[str, ...] = ("<think>", "</think>", "<answer>", "</answer>")
DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."

# Qwen2's pre-tokenization split: contractions, letter runs (with one leading non-letter),
# single digits, punctuation runs, newlines, whitespace. Single digits matter for timestamps:
# "01:23" is always five tokens, so numbers never fuse into arbitrary merges.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Renders the same text as Qwen2.5-VL-Instruct's template (written from its documented output):
#   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n
#   <|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>question<|im_end|>\n
#   <|im_start|>assistant\n
# A part is a video if its type says so or it carries a "video" key (the HF processors'
# convention), likewise for images; text parts contribute their "text".
_CONVERSATION = (
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'video' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'image' or 'image' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in part %}"
    "{{ part['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)


def chat_template(default_system_message: str | None = DEFAULT_SYSTEM_MESSAGE) -> str:
    """The chat template, adding ``default_system_message`` before a conversation that has no
    system turn (Qwen2-VL and Qwen2.5-VL do), or nothing when it is None (Qwen3-VL's Instruct
    template renders a system turn only when the conversation has one)."""
    if default_system_message is None:
        return "{% for message in messages %}" + _CONVERSATION
    return (
        "{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\n" + default_system_message + "<|im_end|>\n"
        "{% endif %}" + _CONVERSATION
    )


CHAT_TEMPLATE = chat_template()

_PAPER_PROMPT = (
    "Please first think deeply about the question based on the given video, and then provide the final "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> the letter of your choice "
    "(A, B, C, or D) </answer>.\n\n Question: "
)
_GENERIC_ENGLISH = (
    "The quick brown fox jumps over the lazy dog. A person walks into the room, opens the window and "
    "looks outside. It is a sunny afternoon and the children are playing in the park near the river.",
    "In this video a man is cooking dinner in a small kitchen. First he cuts the vegetables, then he "
    "puts them in a pan with some oil. Later he adds salt and pepper, and finally he serves the meal.",
    "Why did the woman leave the house early in the morning? She wanted to catch the first train to "
    "the city, because she had an important meeting at nine o'clock.",
    "The story has three parts. At the beginning the hero lives in a quiet village. In the middle he "
    "travels far away to find his lost brother. At the end they return home together.",
    "Which of the following best describes the goal of the people in the video? What happens after "
    "the car stops? Where is the cat sitting when the door opens? How many people appear in total?",
    "Machine learning models can answer questions about long videos when they reason step by step "
    "about what they see, when each event happens, and how the events relate to each other.",
)
_COLORS = ("red", "green", "blue", "yellow", "purple", "orange", "cyan", "pink", "white", "black")
_POSITIONS = ("top left", "top right", "bottom left", "bottom right")
_DOMAIN_WORDS = (
    "scene background square video question answer option options frame frames color colour corner "
    "first last next after before while during scenes shows show where which how many what when the a "
    "is are in of to and or moves stays travelling destination finish followed by"
)


def _timestamp(seconds: int) -> str:
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def default_corpus() -> list[str]:
    """The built-in training texts: the paper's prompt, generic English, and the video QA domain.

    The domain part is repeated in varied sentences so that BPE merges whole words such as
    "background" or "bottom right" early: the synthetic task's targets then stay short.
    """
    texts = [_PAPER_PROMPT, *_GENERIC_ENGLISH, _DOMAIN_WORDS, " ".join(str(i) for i in range(101))]
    texts.append(" ".join(f"{_timestamp(s)}-{_timestamp(s + 7)}" for s in range(0, 3600, 37)))
    for i, color in enumerate(_COLORS):
        position = _POSITIONS[i % len(_POSITIONS)]
        after = _COLORS[(i + 1) % len(_COLORS)]
        start, end = 13 * i, 13 * i + 11
        texts.append(
            f"{_timestamp(start)}-{_timestamp(end)} {color} background, square {position}. "
            f"Which background color comes right after the {color} scene? The {color} scene is followed "
            f"by the {after} scene. Where is the white square while the background is {color}? While the "
            f"background is {color}, the square is {position}. In which corner does it finish? In the last "
            f"scene the square is {position}. How many scenes does the video show? The video shows "
            f"{i % 5 + 1} scenes.\nA. {color}\nB. {after}\nC. {position}\nD. {i}\n"
            f"<think>The {color} square is in the {position}.</think>\n<answer>{'ABCD'[i % 4]}</answer>"
        )
    return texts


def train_tokenizer(
    vocab_size: int, extra_texts: Iterable[str] = (), *, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the default corpus plus ``extra_texts``.

    ``vocab_size`` bounds the total, added reasoning tags included; a small corpus can stop BPE
    before the bound (there is nothing left worth merging), so ``len(tokenizer)`` may be lower.
    Training is deterministic: the same texts give the same files.
    """
    tags = [AddedToken(tag, special=False, normalized=False) for tag in (*REASONING_TAGS, *TOOL_TAGS)]
    if vocab_size < len(SPECIAL_TOKENS) + len(tags) + 256:
        raise ValueError(
            f"vocab_size {vocab_size} cannot hold the 256 bytes plus the special tokens and tags"
        )
    backend = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(tags),
        min_frequency=min_frequency,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        # Every byte is in the vocabulary, whatever the corpus: no text is ever unencodable.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([*default_corpus(), *extra_texts], trainer=trainer)
    backend.add_tokens(tags)
    return wrap_tokenizer(backend)


def wrap_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer around ``backend`` with Qwen's eos/pad tokens and chat template.

    We save it as the generic ``PreTrainedTokenizerFast`` (``TokenizersBackend`` in transformers 5)
    on purpose: transformers 5 rebuilds model-specific classes such as ``Qwen2Tokenizer`` from
    vocab and merges with the class's own pipeline, while the generic class loads ``tokenizer.json``
    verbatim, in transformers and in vLLM alike.
    """
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)],
        model_max_length=32768,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def special_token_ids(
    tokenizer: PreTrainedTokenizerFast, tokens: Sequence[str] = SPECIAL_TOKENS
) -> dict[str, int]:
    """Map each of ``tokens`` to its id, failing loudly if one is missing or not a single id."""
    ids: dict[str, int] = {}
    for token in tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"{token!r} is not a single token in this tokenizer: {encoded}")
        ids[token] = encoded[0]
    return ids
