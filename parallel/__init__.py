"""MR-SP: sequence parallelism for long-video RL.

- :mod:`parallel.mesh`: the device mesh (``data`` x ``sequence`` axes) and the size checks.
- :mod:`parallel.ulysses` and :mod:`parallel.ring`: attention over a sequence split across a
  process group (all-to-all over heads; or key/value blocks passed around a ring).
- :mod:`parallel.attention`: registers both with transformers' attention registry as
  ``lvrl_sequence_parallel`` (plain SDPA when no shard is passed).
- :mod:`parallel.prefill`: log-probs of completion tokens with the sequence split across the
  group, autograd included.
- :mod:`parallel.collectives`: every rank's state gathered for the rank-0 checkpoint.
"""
