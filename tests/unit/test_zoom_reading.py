"""bench/zoom_reading.py's masks: which target tokens count as the first turn, the last turn and the
colour-by-colour lookup of a zoom-task tool trace."""

from __future__ import annotations

import torch

from bench.zoom_reading import lookup_mask, turn_masks
from datamodules.collate import IGNORE_INDEX

X = IGNORE_INDEX


class PieceTokenizer:
    """Decodes each id to a fixed piece of text (id i is ``PIECES[i]``)."""

    PIECES = (
        "<pad>", "<think>", "Markers", " by", " colour:", " red", " none", ",", " white",
        " small", " at", " 00:06", ".", " In", " time", " order", ":", " white", "</think>", "Ask",
    )  # fmt: skip

    def decode(self, ids: list[int]) -> str:
        return "".join(self.PIECES[i] for i in ids)


def test_a_trace_row_has_two_turns_and_a_row_given_its_first_request_only_its_last() -> None:
    labels = torch.tensor(
        [
            [X, 19, 19, X, X, 2, 3, X],  # its request (trained), the tool's reply, its reading
            [X, X, X, X, X, 2, 3, 4],  # its request given (untrained), then its reading
        ]
    )
    first, last = turn_masks(labels)  # aligned with labels[:, 1:]
    assert first.tolist() == [[1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]]
    assert last.tolist() == [[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]]


def test_the_lookup_is_the_text_between_by_colour_and_in_time_order() -> None:
    # "<think>Markers by colour: red none, white small at 00:06. In time order: white</think>"
    reading = list(range(1, 19))
    without_lookup = [1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 0, 0]  # no "colour:"
    input_ids = torch.tensor([[0, *reading], [0, *without_lookup]])
    last = torch.ones(2, 18, dtype=torch.bool)
    lookup = lookup_mask({"input_ids": input_ids}, last, PieceTokenizer())
    looked_up = [PieceTokenizer.PIECES[int(input_ids[0, p + 1])] for p in lookup[0].nonzero().flatten()]
    assert looked_up == [" red", " none", ",", " white", " small", " at", " 00:06", "."]
    assert not lookup[1].any()
