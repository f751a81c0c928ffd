"""Numeric comparisons whose bars say why they are what they are.

Three kinds of comparison appear in the tests, and each has one function here:

- :func:`assert_identical`: the two sides come from the same arithmetic in the same order
  (the same function twice, the same seed on the same machine, a value copied through a
  file). Any difference at all is a bug, so the bar is 0 (``torch.equal``).
- :func:`assert_float32_close`: the two sides compute the same mathematical value in float32
  along different paths (a row alone vs inside a batch, sequence-parallel ranks vs one
  process, vLLM's kernels vs Hugging Face's, another thread split of a reduction). They differ
  by rounding, and rounding scales with the *magnitude* of the values, not with a fixed
  absolute number: the bar is ``ulps * eps32 * scale``, where ``eps32 = 2**-23`` (1.19e-7) is
  float32's unit roundoff and ``scale`` is the largest ``|expected|`` (or a scale the caller
  states, e.g. the size of the logits when log-probs near 0 are compared).
- :func:`assert_float64_close`: the same with ``eps64 = 2**-52``, for tests that recompute
  something in float64 so that a tight check is possible; :func:`assert_close_in_ulps` takes
  any unit roundoff (``EPS_BF16`` for bfloat16 kernels).

Choosing ``ulps``. A reduction of n float32 terms reordered has an error of about
sqrt(n) ulps of its terms' magnitude (random rounding; n ulps in the worst case), and a
network of L layers adds up one such error per layer. Short formulas (the RL math) get a
handful of ulps, derived next to each call; model forward and backward passes get
:data:`FORWARD_ULPS` / :data:`GRADIENT_ULPS`. Each bar was checked to sit >= 10x above the
largest difference observed with 1, 2 (the default) and 4 threads on this project's 2-core
machine, and above the differences reported from a machine with another CPU model (up to
1.5e-5 on values near 10, i.e. 13 ulps), while the bugs each comparison guards against move
values by thousands of bars (measured on the tiny model's log-probs: the temporal position of
the video tokens off by one, 2,100 bars; a temporal patch replaced by its neighbour, 4,000
bars). A test that needs a tighter bar than that should compare in float64.

Every failure message gives the observed error in units of the bar. Setting
``LVRL_TOLERANCE_LOG=path`` appends one line per comparison (test, error / bar, error, bar,
reason) to ``path``: that is how the headroom of each bar was measured.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "EPS32",
    "EPS64",
    "EPS_BF16",
    "FORWARD_ULPS",
    "GRADIENT_ULPS",
    "assert_close_in_ulps",
    "assert_float32_close",
    "assert_float64_close",
    "assert_identical",
]

EPS32 = float(torch.finfo(torch.float32).eps)  # 2**-23, float32's spacing at 1
EPS64 = float(torch.finfo(torch.float64).eps)  # 2**-52
EPS_BF16 = float(torch.finfo(torch.bfloat16).eps)  # 2**-7

FORWARD_ULPS = 256
"""Two float32 forward passes of the tiny test model that differ only in the order of their
reductions (batched vs alone, padded differently, sequence-sharded, another attention or matmul
kernel): log-probs, entropies and video embeddings agree within 256 ulps (3e-5 relative) of the
largest |value|. Each of the ~10 reductions along the path (2 vision + 2 language blocks:
attention over <= 300 positions, MLPs of width <= 384, a log-softmax over 1024 logits) rounds
by a few ulps when reordered; the largest differences seen are ~14 ulps (1.7e-5 on embeddings
near 10, a row alone vs in a batch; 1.5e-5 for sequence-parallel encoding on another CPU), i.e.
<= 1/15 of the bar, while a wrong position id, a dropped frame or a mis-dealt shard changes
values by > 10^3 bars."""

GRADIENT_ULPS = 1024
"""Parameter gradients of the same loss along two such paths, per tensor relative to its largest
entry: backward adds one more reordered reduction per layer (over the tokens of the batch) and
sums the rows' contributions in another order, so 4x the forward bar (1.2e-4 relative). Largest
seen: 1/15 of it (micro-batches, shared prompt passes, sequence-parallel ranks)."""

Numbers = torch.Tensor | np.ndarray | Sequence | float | int


def _as_float64(values: Numbers) -> torch.Tensor:
    """Any tensor, array, nested list or number as a float64 tensor (exact for float32 input)."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().to(torch.float64)
    return torch.as_tensor(np.asarray(values, dtype=np.float64))


def _record(error: float, bar: float, reason: str) -> None:
    path = os.environ.get("LVRL_TOLERANCE_LOG")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        ratio = error / bar if bar > 0 else (0.0 if error == 0 else float("inf"))
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{test}\t{ratio:.4g}\t{error:.3g}\t{bar:.3g}\t{reason}\n")


def assert_close_in_ulps(
    actual: Numbers, expected: Numbers, *, eps: float, ulps: float, reason: str, scale: float | None = None
) -> float:
    """``max |actual - expected| <= ulps * eps * scale``: the general form of the two below."""
    got, want = _as_float64(actual), _as_float64(expected)
    if got.shape != want.shape:
        raise AssertionError(f"{reason}: shape {tuple(got.shape)} != expected {tuple(want.shape)}")
    if not (torch.isfinite(got).all() and torch.isfinite(want).all()):
        raise AssertionError(f"{reason}: non-finite values (actual {got}, expected {want})")
    if scale is None:
        scale = float(want.abs().max()) if want.numel() else 0.0
    bar = ulps * eps * scale
    error = float((got - want).abs().max()) if want.numel() else 0.0
    _record(error, bar, reason)
    if not error <= bar:
        units = error / bar if bar > 0 else float("inf")
        raise AssertionError(
            f"{reason}: max |actual - expected| = {error:.3g} is {units:.3g} bars "
            f"(bar = {ulps:g} ulps x eps {eps:.3g} x scale {scale:.3g} = {bar:.3g})"
        )
    return error


def assert_float32_close(
    actual: Numbers, expected: Numbers, *, ulps: float, reason: str, scale: float | None = None
) -> float:
    """``max |actual - expected| <= ulps * 2**-23 * scale``, ``scale`` = max ``|expected|`` unless given.

    For two float32 computations of the same value along different paths (see the module
    docstring for how ``ulps`` is chosen). ``reason`` names the two paths; it heads the failure
    message. Returns the observed error.
    """
    return assert_close_in_ulps(actual, expected, eps=EPS32, ulps=ulps, reason=reason, scale=scale)


def assert_float64_close(
    actual: Numbers, expected: Numbers, *, ulps: float, reason: str, scale: float | None = None
) -> float:
    """As :func:`assert_float32_close` with float64's unit roundoff ``2**-52``."""
    return assert_close_in_ulps(actual, expected, eps=EPS64, ulps=ulps, reason=reason, scale=scale)


def assert_identical(actual: Numbers, expected: Numbers, *, reason: str) -> None:
    """Bit-for-bit equality (same dtype, shape and values), for computations identical by construction.

    ``reason`` says why they are identical (same inputs, same code, same order).
    """
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        same = actual.dtype == expected.dtype and torch.equal(actual, expected)
    else:
        same = np.array_equal(np.asarray(actual), np.asarray(expected))
    _record(0.0 if same else float("inf"), 0.0, reason)
    if not same:
        got, want = _as_float64(actual), _as_float64(expected)
        detail = (
            f"max |difference| {float((got - want).abs().max()):.3g}"
            if got.shape == want.shape
            else f"shapes {tuple(got.shape)} vs {tuple(want.shape)}"
        )
        raise AssertionError(f"{reason}: expected identical values, {detail}")
