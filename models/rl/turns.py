"""Which turns of a tool-use episode the policy gradient trains.

An episode's completion is the model's turns with the tool's replies between them: the
scoring batch's ``completion_mask`` is 1 at the tokens the engine sampled and 0 at the tokens
the tool wrote (and at padding). Every turn before the last reply ends in a frame request; the
turn after it is the answer. Training the request turns only (``request_turns``) puts the
answer reward's whole policy gradient on where the model looks, and leaves the reading, which
an answer reward marks down whenever a request missed, to the KL term alone.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

PolicyGradientTurns = Literal["all", "requests"]
POLICY_GRADIENT_TURNS: tuple[PolicyGradientTurns, ...] = ("all", "requests")


def request_turn_mask(completion_mask: Tensor, completion_lengths: list[int]) -> Tensor:
    """1.0 at the sampled tokens that stand before a row's last tool-written token, else 0.0.

    ``completion_mask``: ``(rows, width)``, 1.0 at sampled tokens; ``completion_lengths``: each
    row's tokens after its prompt (the rest is padding). A row with no tool reply (an episode
    that answered at once, or a single-turn rollout) has no request turn: all 0.

    >>> mask = torch.tensor([[1., 1., 0., 0., 1., 1.], [1., 1., 1., 0., 0., 0.]])
    >>> request_turn_mask(mask, [6, 3])
    tensor([[1., 1., 0., 0., 0., 0.],
            [0., 0., 0., 0., 0., 0.]])
    """
    rows, width = completion_mask.shape
    if len(completion_lengths) != rows:
        raise ValueError(f"{len(completion_lengths)} completion lengths for {rows} rows")
    columns = torch.arange(width, device=completion_mask.device)
    written = (completion_mask == 0) & (
        columns < torch.as_tensor(completion_lengths, device=completion_mask.device).unsqueeze(-1)
    )
    # The last tool-written column of each row (-1 where there is none): the request turns
    # are the sampled tokens left of it.
    last_written = torch.where(written, columns, torch.full_like(columns, -1)).amax(dim=-1)
    return completion_mask * (columns < last_written.unsqueeze(-1))


def request_turn_advantages(
    advantages: Tensor, completion_mask: Tensor, completion_lengths: list[int]
) -> Tensor:
    """The advantage each token trains with under ``policy_gradient_turns: requests``: the
    row's own on its request turns, 0 on the rest, ``(rows, width)``. (Under ``all`` every
    token trains with its row's advantage: the ``(rows,)`` advantages are used as they are.)

    >>> mask = torch.tensor([[1., 0., 1.], [1., 1., 0.]])
    >>> request_turn_advantages(torch.tensor([0.5, 2.0]), mask, [3, 2])
    tensor([[0.5000, 0.0000, 0.0000],
            [0.0000, 0.0000, 0.0000]])
    """
    request_turns = request_turn_mask(completion_mask, completion_lengths).to(advantages.device)
    return advantages.unsqueeze(-1) * request_turns
