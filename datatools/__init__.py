"""Offline dataset tooling (``lvrl data ...``): nothing here is imported by a training run.

- :mod:`datatools.synthetic`: the synthetic long-video task (``lvrl data synth``).
- :mod:`datatools.released_build`: WebDataset shards from the released LongVideo-Reason JSONL and
  video files (``lvrl data build``), with :mod:`datatools.released` (row normalisation),
  :mod:`datatools.jsonl_rows` (reading JSONL lines as bytes) and :mod:`datatools.ingest`
  (shard keys, video paths); with ``--format``, the annotation files of long-video benchmarks
  (:mod:`datatools.benchmarks`, read by :mod:`datatools.annotation_files`).
- :mod:`datatools.shard_writer`: writing shards and their ``dataset.json`` manifest.
- :mod:`datatools.video_encode`: frames to video bytes; :mod:`datatools.video_probe`: checking a
  video's headers and frames before it goes into a shard.
- :mod:`datatools.progress`: progress bars that read well in a terminal and in a log file.

Runtime code (the DataModule, shard reading, video decoding) lives in :mod:`datamodules`, which
never imports this package; this package imports :mod:`datamodules` (the row schema, video
decoding, the accepted video extensions) and :mod:`core`.
"""
