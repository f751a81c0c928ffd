"""The checks of ``lvrl data build`` between a row's text and its video's bytes: shard key and video path.

Shard keys. A sample's key is a pure function of its ``problem_id``: the id with every
character outside ``[A-Za-z0-9_-]`` replaced by ``_`` and cut to 64 characters (readable, and
safe as a tar member name and a WebDataset key, which may hold no dot), then ``-`` and the
first 16 hex digits of the SHA-256 of the id's UTF-8 bytes. Ids that clean to the same text
(``a/b`` and ``a_b``, ``.`` and ``_``, two long ids with one prefix, ids differing in case or
in non-ASCII characters) keep distinct keys, and a key depends on no other row, the number of
workers or where a build was resumed. The build still checks that no two rows share a key.

Video paths. The row's ``videos`` name is resolved under ``--videos-root`` (``..`` and symlinks
followed) and must stay inside the resolved root: an absolute path elsewhere, a ``..`` that
climbs out (both refused by the name, so nothing outside is looked up) or a symlink that points
out is ``outside_root``, unless ``allow_outside_root``; an absolute path inside the root is fine.
Only a regular file counts (a folder, a FIFO or a device is ``missing_video``: opening a FIFO
would block the build). A name with no file is matched case-insensitively over the video
extensions (:func:`video_otherwise_named`: ``abc.mp4`` finds ``abc.MP4`` or ``abc.mkv``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
from pathlib import Path

from datamodules.stream import VIDEO_EXTENSIONS
from datatools.released import (
    MISSING_VIDEO,
    OUTSIDE_ROOT,
    UNSUPPORTED_CONTAINER,
    VIDEO_TOO_LARGE,
    RowRejected,
)

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
KEY_PREFIX_CHARS = 64
KEY_HASH_HEX = 16
_OUTSIDE_HINT = "pass --allow-outside-root to accept such paths"


def sample_key(problem_id: str) -> str:
    """The shard key of a problem id: its readable part and a hash of the whole id.

    >>> sample_key("open/2.x")
    'open_2_x-2cef5fefee64cb8b'
    >>> sample_key("a/b") != sample_key("a_b")
    True
    """
    readable = _KEY_UNSAFE.sub("_", problem_id)[:KEY_PREFIX_CHARS] or "_"
    digest = hashlib.sha256(problem_id.encode("utf-8", "surrogatepass")).hexdigest()[:KEY_HASH_HEX]
    return f"{readable}-{digest}"


def video_otherwise_named(path: Path) -> Path | None:
    """The one regular file beside ``path`` named like it but for the case of its letters or its
    video extension (Video-MME's videos come as ``.mp4``, ``.MP4`` and ``.mkv``, which lmms-eval
    accepts); None when there is none, or more than one (which is meant is not known)."""
    stem = path.stem.casefold()
    try:
        names = _folder_names(str(path.parent), path.parent.stat().st_mtime_ns)
    except OSError:
        return None
    matches = [
        name
        for name in names.get(stem, ())
        if Path(name).suffix.lower().lstrip(".") in VIDEO_EXTENSIONS and _is_regular_file(path.parent / name)
    ]
    return path.parent / matches[0] if len(matches) == 1 else None


def _is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:  # a symlink loop, a name too long, gone meanwhile
        return False


@functools.lru_cache(maxsize=64)
def _folder_names(folder: str, mtime_ns: int) -> dict[str, tuple[str, ...]]:
    """A folder's file names by case-folded stem, listed once per folder and modification time
    (a build asks for thousands of videos in one folder)."""
    names: dict[str, list[str]] = {}
    for name in os.listdir(folder):
        names.setdefault(Path(name).stem.casefold(), []).append(name)
    return {stem: tuple(sorted(found)) for stem, found in names.items()}


YOUTUBE_ID = re.compile(r"(?:[?&]v=|youtu\.be/|/shorts/)([A-Za-z0-9_-]{11})")


def downloaded_videos(videos_root: Path) -> dict[str, str]:
    """YouTube id -> video path (relative to ``videos_root``) of a folder that video2dataset filled
    (``--output_format files``, as LVBench's ``scripts/download.sh`` runs it): numbered shard folders
    of numbered videos, ``00000/000000000.mp4``, each with a sidecar ``000000000.json`` whose
    ``url`` is the video's YouTube address. Sidecars that name no YouTube video, have no video
    beside them or cannot be read are skipped; an id two sidecars name is left out (which is
    meant is not known)."""
    found: dict[str, list[str]] = {}
    for sidecar in sorted(videos_root.glob("*/*.json")):
        try:
            meta = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        url = meta.get("url") if isinstance(meta, dict) else None
        match = YOUTUBE_ID.search(url) if isinstance(url, str) else None
        video = video_otherwise_named(sidecar.with_suffix(".mp4")) if match else None
        if match and video is not None:
            found.setdefault(match.group(1), []).append(str(video.relative_to(videos_root)))
    return {youtube_id: paths[0] for youtube_id, paths in found.items() if len(paths) == 1}


def _leaves_by_name(videos_root: Path, name: str) -> bool:
    """Whether a path is outside the (resolved) root by its name alone: an absolute path not under
    the root, or a relative one whose ``..`` climb above it."""
    normal = os.path.normpath(name)
    if os.path.isabs(normal):
        return not Path(normal).is_relative_to(videos_root)
    return normal.split(os.sep)[0] == ".."


def locate_video(videos_root: Path, name: str, *, allow_outside_root: bool, max_bytes: int) -> Path:
    """The resolved path of a row's video file, or :class:`RowRejected` saying why not.

    ``videos_root`` must already be resolved. Reasons: ``outside_root``, ``missing_video`` (no
    such regular file, or one that cannot be looked up), ``unsupported_container`` (by the
    name's extension), ``video_too_large`` (more than ``max_bytes``).
    """
    if "\x00" in name:  # the row checks reject it first; an OS call would raise ValueError
        raise RowRejected(MISSING_VIDEO, "the path holds a NUL character")
    if not allow_outside_root and _leaves_by_name(videos_root, name):
        raise RowRejected(OUTSIDE_ROOT, f"{name[:200]} is outside --videos-root by its name; {_OUTSIDE_HINT}")
    # realpath follows symlinks (looking up only the links on the way) and never raises in its
    # lenient mode; a loop or a name too long leaves a path that the stat below refuses.
    try:
        path = Path(os.path.realpath(videos_root / name))
    except (OSError, ValueError, RecursionError) as err:  # e.g. a chain of thousands of links
        raise RowRejected(MISSING_VIDEO, f"cannot resolve {name[:200]}: {err}") from err
    shown = name[:200]
    if not allow_outside_root and not path.is_relative_to(videos_root):
        message = f"{shown} resolves to {str(path)[:200]}, outside --videos-root; {_OUTSIDE_HINT}"
        raise RowRejected(OUTSIDE_ROOT, message)
    try:
        info = path.stat()
    except OSError as err:  # absent, a symlink loop, a name too long, no permission
        found = video_otherwise_named(path) if isinstance(err, FileNotFoundError) else None
        if found is None:
            message = f"no file {shown} under the videos root ({err.strerror})"
            raise RowRejected(MISSING_VIDEO, message) from err
        path, info = found, found.stat()
    if not stat.S_ISREG(info.st_mode):
        raise RowRejected(MISSING_VIDEO, f"{shown} is not a regular file")
    extension = path.suffix.lower().lstrip(".")
    if extension not in VIDEO_EXTENSIONS:
        message = f"{path.name[:200]}: not one of {', '.join(VIDEO_EXTENSIONS)}"
        raise RowRejected(UNSUPPORTED_CONTAINER, message)
    if info.st_size > max_bytes:
        raise RowRejected(VIDEO_TOO_LARGE, f"{shown} has {info.st_size:,} bytes; at most {max_bytes:,}")
    return path
