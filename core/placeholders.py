"""Video placeholder tokens: the two ways a prompt writes them.

The chat template writes **one** placeholder per video; the model's processor expands it to one
per visual token (the video's merged patches), the form :class:`~core.layout.PromptLayout`
holds; an engine that expands placeholders itself (vLLM) is given the collapsed one.
"""

from __future__ import annotations

from collections.abc import Sequence


def collapse_video_placeholders(prompt_ids: Sequence[int], video_slots: Sequence[bool]) -> list[int]:
    """Each run of video slots becomes one placeholder (the form a chat template writes).

    ``video_slots`` marks the placeholders (so a text token that happens to carry the
    placeholder id is never merged).

    >>> collapse_video_placeholders([1, 9, 9, 9, 2], [False, True, True, True, False])
    [1, 9, 2]
    """
    out: list[int] = []
    previous_slot = False
    for token, slot in zip(prompt_ids, video_slots, strict=True):
        if not (slot and previous_slot):
            out.append(token)
        previous_slot = slot
    return out
