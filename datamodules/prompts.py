"""The chat prompt and the assistant target of a video QA row.

The instruction follows the released LongVILA-R1 prompt: think inside ``<think>`` tags, then
answer inside ``<answer>`` tags. The same text is used by CoT-SFT (prompt + target), by
validation (prompt only, greedy) and by the RL rollouts, so a model is always asked the way
it was trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datamodules.rows import OPTION_LETTERS, QARow

if TYPE_CHECKING:
    from families import ModelFamily

THINK_INSTRUCTION = (
    "Please first think deeply about the question based on the given video, and then provide the final "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> {answer_hint} </answer>."
)


TOOL_INSTRUCTION = (
    "You may look closer before answering: to see the frames of a time span, write <tool_call>"
    '{"name": "get_frames", "arguments": {"start": "mm:ss", "end": "mm:ss", "fps": 1}}</tool_call> '
    "and wait for them."
)
"""The frames tool, as tool-use prompts describe it (:mod:`core.tool_use.requests` has the syntax)."""


def _letters_hint(num_options: int) -> str:
    letters = list(OPTION_LETTERS[:num_options])
    listed = ", ".join(letters[:-1]) + f", or {letters[-1]}" if num_options > 1 else letters[0]
    return f"the letter of your choice ({listed})"


def question_text(row: QARow, tool_use: bool = False) -> str:
    """The user's text: instruction (with the frames tool's when ``tool_use``), question and
    lettered options.

    >>> from datamodules.rows import QARow
    >>> row = QARow("q", "v.mp4", "Which colour?", "multiple choice", "", "B", None, ("red", "blue"))
    >>> print(question_text(row).split("Question: ")[1])
    Which colour?
    A. red
    B. blue
    """
    if row.is_multiple_choice and row.options:
        hint = _letters_hint(len(row.options))
        options = "\n".join(f"{OPTION_LETTERS[i]}. {text}" for i, text in enumerate(row.options))
        question = f"{row.problem}\n{options}"
    else:
        hint = "your final answer"
        question = row.problem
    instruction = THINK_INSTRUCTION.format(answer_hint=hint)
    if tool_use:
        instruction = f"{instruction} {TOOL_INSTRUCTION}"
    return f"{instruction}\n\nQuestion: {question}"


def chat_messages(row: QARow, tool_use: bool = False) -> list[dict[str, Any]]:
    """One user turn holding the video then the question (the processor expands the video)."""
    text = question_text(row, tool_use)
    return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]


def assistant_target(row: QARow) -> str:
    """What CoT-SFT teaches the model to write: reasoning in ``<think>``, the answer in ``<answer>``.

    >>> from datamodules.rows import QARow
    >>> assistant_target(QARow("q", "v.mp4", "?", "multiple choice", "Red comes first.", "A"))
    '<think>Red comes first.</think>\\n<answer>A</answer>'
    """
    return f"<think>{row.reasoning.strip()}</think>\n<answer>{row.answer}</answer>"


def encode_video_prompt(
    processor: Any,
    row: QARow,
    frames: Any,
    metadata: dict[str, Any],
    *,
    tool_use: bool,
    family: ModelFamily | None,
) -> dict[str, Any]:
    """The processor's output for ``row``'s prompt over ``frames`` (what the collator encodes;
    ``metadata``: the frames' times, as :func:`datamodules.collate.video_metadata` gives them),
    with ``second_per_grid_ts`` and, given the model's ``family``, ``template_ids`` (the prompt
    before the video was expanded) and ``timestamps`` (each temporal patch's)."""
    prompt = processor.apply_chat_template(
        chat_messages(row, tool_use), tokenize=False, add_generation_prompt=True
    )
    encoded = dict(processor(text=[prompt], videos=[frames], video_metadata=[metadata], return_tensors="pt"))
    if family is not None:
        encoded["second_per_grid_ts"] = family.second_per_grid(encoded, [metadata])
        encoded["template_ids"] = family.engine_template_ids(processor.tokenizer, prompt)
        encoded["timestamps"] = family.patch_timestamps(metadata)
    elif "second_per_grid_ts" not in encoded:
        raise ValueError("this processor returns no second_per_grid_ts: give the collator the model's family")
    return encoded
