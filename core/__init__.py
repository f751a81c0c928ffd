"""lvrl's leaf package: the vocabulary every other package shares, importing none of them.

- :mod:`core.qa`: the question/answer vocabulary (problem types, option letters, categories).
- :mod:`core.positions`: the one M-RoPE position rule of training, rollout and evaluation.
- :mod:`core.placeholders`: video placeholder tokens (how many, expanded, collapsed).
- :mod:`core.video`: :class:`~core.video.VideoEmbedding`, a video as the language model sees it.
- :mod:`core.layout`: :class:`~core.layout.PromptLayout`, one prompt's tokens, video slots and
  positions, built once per sample; and :class:`~core.layout.ScoringBatch`, prompt + completion
  rows derived from layouts for a forward pass.

Only torch and the standard library are imported here (tests/unit/test_import_graph.py checks).
"""
