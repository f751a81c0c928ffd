"""A process reward for the synthetic zoom task: how much of the markers' listing is right.

The zoom task's readings (:mod:`datatools.zoom_task`) say what the frames show before they name
an answer: ``Markers by colour: red none, green small at 00:14, yellow huge at 00:00, white small
at 00:06.`` The answer follows from that listing by text work alone, so a model that misreads the
markers can only guess. The accuracy reward cannot tell a group's episodes that saw the markers
right but drew the wrong letter from those that misread them; this reward can, by comparing each
episode's listing with the row's reference reasoning (``reasoning``, written by the generator from
its ground truth).

Only colours and sizes are compared, not times: the reference gives each marker's first frame in
the whole video, an episode the first frame it was *served*, which depends on the span and rate it
asked for (both are right readings). Score: the fraction of the reference's colours whose entry
(a size, or ``none``) the episode's last listing gives the same. A colour the episode lists twice
counts as wrong (which entry would be meant is unknown); a colour it adds that the reference lacks
is ignored. A row whose reference has no listing (another task's data) scores 0 for every episode,
so it adds nothing to a group's advantages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rewards.functions import per_sample
from rewards.registry import register

# The clause ends at its first full stop: a period not inside a number ("35.5 seconds").
_LISTING = re.compile(r"Markers by colour:\s*(.*?)\.(?!\d)")


def listing_clause(text: str) -> str | None:
    """The body of the last ``Markers by colour: ...`` clause of ``text``, None without one.

    >>> listing_clause("Markers by colour: red small at 14.5 seconds, green none. In time order: red.")
    'red small at 14.5 seconds, green none'
    """
    clauses = _LISTING.findall(text)
    return clauses[-1] if clauses else None


def marker_listing(text: str) -> dict[str, str | None] | None:
    """The last ``Markers by colour: ...`` clause of ``text`` as colour -> size (``none`` when
    the colour is absent), or None without one. A colour given twice maps to None (ambiguous).

    >>> marker_listing("<think>Markers by colour: red none, green small at 00:14. In time order: green.")
    {'red': 'none', 'green': 'small'}
    >>> marker_listing("Markers by colour: red small at 00:02, red huge at 00:09.")
    {'red': None}
    >>> marker_listing("no listing") is None
    True
    """
    clause = listing_clause(text)
    if clause is None:
        return None
    listed: dict[str, str | None] = {}
    for entry in clause.split(","):
        words = entry.split()
        if len(words) < 2:
            continue
        colour, size = words[0].lower(), words[1].lower()
        listed[colour] = None if colour in listed else size
    return listed


def listing_score(completion: str, reference: str) -> float:
    """The fraction of ``reference``'s listed colours that ``completion`` lists with the same
    size (or ``none``); 0.0 when either has no listing.

    >>> ref = "Markers by colour: red none, green small at 00:14, yellow huge at 00:00, white none."
    >>> seen = "Markers by colour: red none, green small at 00:20, yellow large at 00:00, white none."
    >>> listing_score(seen, ref)
    0.75
    """
    truth = marker_listing(reference)
    seen = marker_listing(completion)
    if not truth or seen is None:
        return 0.0
    right = sum(1 for colour, size in truth.items() if size is not None and seen.get(colour) == size)
    return right / len(truth)


@register("marker_listing")
def marker_listing_reward(
    completions: Sequence[str], *, reasoning: Sequence[str | None] | None = None, **_: Any
) -> list[float]:
    """Per completion, :func:`listing_score` against its row's reference ``reasoning``."""
    references = per_sample("reasoning", reasoning, len(completions))
    return [listing_score(c, r or "") for c, r in zip(completions, references, strict=True)]
