"""Two builds of the same shards, compared member by member: which files differ in content.

Two runs of ``lvrl data synth`` (or ``zoom``) with one seed should write the same bytes; tar
headers aside, this says which members do not, and for videos how far their decoded frames are
apart. What the demo's run-to-run drift was traced to (README, "The run is one draw").

Usage: python bench/shard_diff.py DIR_A DIR_B [--out bench/results/demo/data-builds.json]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluation.provenance import provenance


def member_digests(shard: Path) -> dict[str, str]:
    """MD5 of each file member's content (headers, such as mtimes, left out)."""
    with tarfile.open(shard) as tar:
        return {
            m.name: hashlib.md5(tar.extractfile(m).read()).hexdigest()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def frame_difference(shard_a: Path, shard_b: Path, name: str) -> dict[str, Any]:
    """How two versions of one video member differ once decoded."""
    import av
    import numpy as np

    def frames(shard: Path) -> Any:
        with tarfile.open(shard) as tar:
            data = tar.extractfile(name).read()  # type: ignore[union-attr]
        with av.open(io.BytesIO(data)) as container:
            return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])

    a, b = frames(shard_a), frames(shard_b)
    if a.shape != b.shape:
        return {"shapes": [list(a.shape), list(b.shape)]}
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {
        "frames": len(a),
        "frames_differing": int((diff.reshape(len(diff), -1).max(1) > 0).sum()),
        "max_abs_difference": int(diff.max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shards = []
    for shard_a in sorted(args.a.glob("*.tar")):
        shard_b = args.b / shard_a.name
        digests_a, digests_b = member_digests(shard_a), member_digests(shard_b)
        differing = sorted(n for n in digests_a if digests_a[n] != digests_b.get(n))
        first_video = next((n for n in differing if n.endswith(".mp4")), None)
        shards.append(
            {
                "shard": shard_a.name,
                "members": len(digests_a),
                "videos": sum(n.endswith(".mp4") for n in digests_a),
                "differing": differing,
                "example": None
                if first_video is None
                else {"member": first_video, **frame_difference(shard_a, shard_b, first_video)},
            }
        )
        print(f"{shard_a.name}: {len(differing)} of {len(digests_a)} members differ")
    if args.out:
        result = {**provenance(["python", "bench/shard_diff.py", *sys.argv[1:]]), "shards": shards}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
