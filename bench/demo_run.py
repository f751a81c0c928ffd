"""`make demo` on a fresh clone, as a user runs it, with its record: the figures of the demo's
README table come from the ``run.json`` and ``accuracy.md`` this writes.

Clones the repository at a commit into ``--work``, runs ``make setup`` and ``make demo`` there
(each timed; the load sampled every 30 s), then waits 20 s and lists every process whose command
line still names the clone. Writes to ``--out``: ``run.json`` (command, commit, machine, date,
load, seconds per part, what was left behind), ``accuracy.md`` (the table the demo printed),
``grpo_reward.png``, and the demo's output as ``demo.log``.

Usage: python bench/demo_run.py --work /tmp/demo --out bench/results/demo/NAME [--commit REV]
       [--family qwen3_vl]
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fresh_clone import (  # noqa: E402
    LoadSampler,
    clean_environment,
    fresh_clone,
    left_behind,
    machine,
    recorder_arguments,
    timed,
)

FINISHED = re.compile(r"demo finished in (\d+) s \(SFT \+ eval (\d+) s, GRPO \+ eval (\d+) s\)")


def main() -> None:
    parser = recorder_arguments(__doc__, "run.json and the table")
    parser.add_argument("--family", default=None, help="FAMILY for make demo (default: the demo's own)")
    args = parser.parse_args()

    commit, clone = fresh_clone(args.commit, args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    env = clean_environment(**({"FAMILY": args.family} if args.family else {}))
    print(f"demo_run: {commit} in {clone}", flush=True)
    setup = timed(["make", "setup"], clone, args.out / "setup.log", env)
    with LoadSampler() as load:
        demo = timed(["make", "demo"], clone, args.out / "demo.log", env)
    after = left_behind(clone)
    output = (args.out / "demo.log").read_text()
    finished = FINISHED.search(output)
    if finished is None:
        raise SystemExit(f"make demo printed no 'demo finished in' line: see {args.out / 'demo.log'}")
    run_dir = clone / "runs" / "demo"
    shutil.copy(run_dir / "accuracy.md", args.out / "accuracy.md")
    shutil.copy(run_dir / "grpo_reward.png", args.out / "grpo_reward.png")
    record = {
        "command": "python "
        + " ".join(["bench/demo_run.py", *sys.argv[1:]])
        + "  (git clone; make setup; make demo)",
        "commit": commit,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "family": args.family or "qwen2_5_vl",
        "load": load.describe("the demo", alone=not args.beside_other_work),
        "wall_seconds": {
            "setup": setup,
            "demo": demo,
            "sft_and_evaluation": int(finished.group(2)),
            "grpo_and_evaluation": int(finished.group(3)),
        },
        "left_behind": after,
        "table": "accuracy.md",
        "plot": "grpo_reward.png",
    }
    (args.out / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    print((args.out / "accuracy.md").read_text(), flush=True)
    print(f"demo_run: {demo} s; {after}", flush=True)


if __name__ == "__main__":
    main()
