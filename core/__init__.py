"""lvrl's leaf package: the vocabulary every other package shares, importing none of them.

The prompt, as every stage lays it out:

- :mod:`core.layout`: :class:`~core.layout.PromptLayout`, one prompt's tokens, video slots and
  positions, built once per sample; and :class:`~core.layout.ScoringBatch`, the
  ``prompt + completion`` rows derived from layouts for a forward pass.
- :mod:`core.positions`: the one M-RoPE position rule of training, rollout and evaluation.
- :mod:`core.placeholders`: video placeholder tokens collapsed to one per video.
- :mod:`core.video`: :class:`~core.video.VideoEmbedding`, a video as the language model sees it.

Questions and answers, and frames on request:

- :mod:`core.qa`: the question/answer vocabulary and the one ``<answer>`` pattern.
- :mod:`core.tool_use`: the model's frame request and its checks, the episode of turns and
  replies, the tool's reply as a video segment.

What a run shares across its layers:

- :mod:`core.failures`: the errors that stop training in a state worth saving.
- :mod:`core.settings`: optional YAML blocks of settings read into frozen dataclasses.
- :mod:`core.rng`: a process's random number generator states.

Nothing of lvrl is imported here (tests/unit/test_import_graph.py checks), only the standard
library, torch and NumPy.
"""
