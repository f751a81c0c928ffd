"""What a zoom-task model sees, from its held-out answers: how many list the markers right, and
how often it answers right given a right or a wrong listing.

Each answer's last ``Markers by colour: ...`` clause is compared with its row's reference
reasoning, colours and sizes without the times (:func:`rewards.zoom.listing_score`; the
``marker_listing`` reward scores the same way). A listing is right when every colour's entry
is. A model whose listings are right but whose answers are not has the seeing and lacks the
step from listing to letter (what GRPO trains, docs/tool-use.md "What sets each seed's gain"); one whose
listings are wrong can only guess.

The times are checked apart: a listing's times are right when each marker it gives a time has the
reference's (the marker's first frame, which is the frame a request for the blue stretch at 1 fps
serves it in; a request at another span or rate can see it later, so "right" is a lower bound),
and tied when two colours share a time (the listing then cannot order them). A model whose
written times are neither right nor distinct but whose order is (measured: docs/tool-use.md "What the
written times show") does not order the markers from the times it writes.

Usage: python bench/zoom_listings.py EVAL_DIR [EVAL_DIR ...] [--data data/zoom]
(an evaluation folder as ``bench/zoom.py`` writes it: ``<run>-eval`` with ``predictions/``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.commands.report import last_records
from core.qa import CATEGORIES
from rewards.zoom import listing_clause, listing_score

_TIMED_ENTRY = re.compile(r"^\s*(\w+)\s+\w+\s+at\s+(\d+:\d\d|[\d.]+ seconds)\s*$")


def written_times(text: str) -> dict[str, str]:
    """Colour -> the time the last ``Markers by colour: ...`` clause of ``text`` writes for it
    (colours listed as ``none`` or without a time are left out).

    >>> written_times("Markers by colour: red none, green small at 00:14, white huge at 00:02. In")
    {'green': '00:14', 'white': '00:02'}
    >>> written_times("Markers by colour: red small at 14.5 seconds, green none. In time order: red.")
    {'red': '14.5 seconds'}
    """
    entries = (_TIMED_ENTRY.match(entry) for entry in (listing_clause(text) or "").split(","))
    return {match[1].lower(): match[2] for match in entries if match}


def reference_readings(data: Path) -> dict[str, str]:
    """``{problem_id: reasoning}`` of the held-out rows (validation and test shards)."""
    readings: dict[str, str] = {}
    for shard in sorted([*data.glob("val-*.tar"), *data.glob("test-*.tar")]):
        with tarfile.open(shard) as tar:
            for member in tar:
                extracted = tar.extractfile(member) if member.name.endswith(".json") else None
                if extracted is not None:
                    row = json.load(extracted)
                    readings[row["problem_id"]] = row["reasoning"]
    if not readings:
        raise SystemExit(f"{data}: no val-*.tar or test-*.tar shards (`lvrl data zoom --out {data}`)")
    return readings


@dataclass
class Listings:
    answers: int = 0
    listed_right: int = 0
    right_given_listed_right: int = 0
    right_given_listed_wrong: int = 0
    timed: int = 0  # answers whose reference gives at least one marker (so a time)
    times_right: int = 0
    times_tied: int = 0

    def line(self) -> str:
        wrong = self.answers - self.listed_right
        return (
            f"listing right {self.listed_right}/{self.answers}; answer right given a right listing "
            f"{self.right_given_listed_right}/{self.listed_right}, given a wrong one "
            f"{self.right_given_listed_wrong}/{wrong}; written times right {self.times_right}/{self.timed}, "
            f"two colours at one time {self.times_tied}/{self.timed}"
        )


def tally(eval_dir: Path, readings: dict[str, str]) -> dict[str, Listings]:
    """Per category (and ``all``), the listings of the folder's last evaluation's answers."""
    records = last_records(eval_dir)
    if records is None:
        raise SystemExit(f"{eval_dir}: no predictions")
    counts = {name: Listings() for name in ("all", *CATEGORIES)}
    for record in records:
        reference = readings.get(record.get("problem_id", ""))
        if reference is None:
            raise SystemExit(f"{eval_dir}: {record.get('problem_id')!r} is not a held-out row of the data")
        listed_right = listing_score(record["completion"], reference) == 1.0
        truth, written = written_times(reference), written_times(record["completion"])
        times_right = bool(truth) and written == truth
        times_tied = len(set(written.values())) < len(written)
        for name in ("all", record["category"]):
            entry = counts[name]
            entry.answers += 1
            entry.listed_right += listed_right
            entry.timed += bool(truth)
            entry.times_right += times_right
            entry.times_tied += bool(truth) and times_tied
            if listed_right:
                entry.right_given_listed_right += bool(record["correct"])
            else:
                entry.right_given_listed_wrong += bool(record["correct"])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("eval_dirs", nargs="+", type=Path)
    parser.add_argument("--data", type=Path, default=Path("data/zoom"))
    args = parser.parse_args()
    readings = reference_readings(args.data)
    for eval_dir in args.eval_dirs:
        counts = tally(eval_dir, readings)
        print(f"{eval_dir}: {counts['all'].line()}")
        for category in CATEGORIES:
            print(f"  {category}: {counts[category].line()}")


if __name__ == "__main__":
    main()
