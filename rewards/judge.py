"""An LLM judge for open-ended answers: does the response mean the same as the reference answer?

The judge is any OpenAI-compatible chat-completions endpoint: a local ``vllm serve MODEL``
(``http://localhost:8000/v1``) or a hosted API. Questions are sent concurrently (a batch of
completions is judged in parallel), each request has a time-out and is retried on transport
errors, time-outs and server errors. A judgement that still fails (or a reply that is
neither yes nor no) never raises: it is logged with the sample key and scored
``failure_score``, and counted on the client.

``judged_accuracy`` routes by ``problem_type``: multiple-choice and numerical rows use the
rule-based rewards of :mod:`rewards.functions`, every other row the judge. Configure it as::

    rewards:
      - name: judged_accuracy
        weight: 0.9
        kwargs: {judge: {base_url: "http://localhost:8000/v1", model: Qwen2.5-7B-Instruct}}
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rewards.functions import accuracy_reward
from rewards.parsing import extract_answer
from rewards.registry import register

log = logging.getLogger(__name__)

JUDGE_PROMPT = (
    "You grade answers to questions about a video. Reply with one word: yes if the answer means "
    "the same as the reference answer, no otherwise.\n\nQuestion: {question}\nReference answer: "
    "{reference}\nAnswer: {answer}\n\nDoes the answer mean the same as the reference? Reply yes or no."
)
RULE_BASED_TYPES = ("multiple choice", "numerical", "numeric")


class MalformedReply(ValueError):
    """The endpoint answered, but not with a usable yes/no verdict."""


@dataclass(frozen=True)
class JudgeSettings:
    """Where the judge is and how hard to try.

    Args:
        base_url: the OpenAI-compatible API root (``.../v1``); ``/chat/completions`` is appended.
        model: model name the endpoint serves.
        api_key_env: environment variable holding the API key (none needed for a local server).
        timeout_s: seconds one request may take.
        max_retries: further attempts after a transport error, a time-out or an HTTP 5xx/429.
        concurrency: requests in flight at once.
        failure_score: the score of a judgement that failed (logged and counted).
        prompt: the user message; ``{question}``, ``{reference}`` and ``{answer}`` are filled in.
    """

    base_url: str
    model: str
    api_key_env: str = "LVRL_JUDGE_API_KEY"
    timeout_s: float = 30.0
    max_retries: int = 2
    concurrency: int = 8
    failure_score: float = 0.0
    prompt: str = JUDGE_PROMPT

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"judge base_url must be an http(s) URL, got {self.base_url!r}")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.concurrency < 1:
            raise ValueError("judge timeout_s must be > 0, max_retries >= 0 and concurrency >= 1")


@dataclass(frozen=True)
class Judgement:
    score: float
    ok: bool
    """False when the judge could not be asked or gave no verdict (``score`` is the failure score)."""
    detail: str
    """The judge's reply, or what went wrong."""


def parse_verdict(content: str) -> bool:
    """``yes``/``no`` (any case, punctuation around it) as the reply's first word.

    >>> parse_verdict("Yes."), parse_verdict(" no, the colour differs")
    (True, False)
    """
    words = content.strip().split()
    first = words[0].strip(".,:;!*\"'").casefold() if words else ""
    if first in ("yes", "true", "correct"):
        return True
    if first in ("no", "false", "incorrect"):
        return False
    raise MalformedReply(f"not a yes/no verdict: {content[:80]!r}")


class JudgeClient:
    """Asks the endpoint for verdicts, concurrently, with time-outs and retries; never raises."""

    def __init__(self, settings: JudgeSettings) -> None:
        self.settings = settings
        self.url = settings.base_url.rstrip("/") + "/chat/completions"
        self._lock = threading.Lock()
        self.requests = 0
        self.failures = 0

    def judge(
        self, items: Sequence[tuple[str, str, str]], keys: Sequence[str] | None = None
    ) -> list[Judgement]:
        """One judgement per ``(question, reference, answer)``; ``keys`` name the samples in logs."""
        names = list(keys) if keys is not None else [f"#{i}" for i in range(len(items))]
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(self.settings.concurrency, len(items))) as pool:
            judgements = list(pool.map(self._judge_one, items))
        failed = [(name, j.detail) for name, j in zip(names, judgements, strict=True) if not j.ok]
        if failed:
            shown = "; ".join(f"{name}: {detail}" for name, detail in failed[:5])
            log.warning(
                "judge: %d of %d judgements failed, scored %s (%s%s)",
                len(failed),
                len(items),
                self.settings.failure_score,
                shown,
                "; ..." if len(failed) > 5 else "",
            )
        return judgements

    def _judge_one(self, item: tuple[str, str, str]) -> Judgement:
        question, reference, answer = item
        prompt = self.settings.prompt.format(question=question, reference=reference, answer=answer)
        body = {
            "model": self.settings.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0,
            "max_tokens": 8,
        }
        error = "no attempt"
        for attempt in range(self.settings.max_retries + 1):
            with self._lock:
                self.requests += 1
            try:
                content = self._post(body)
                verdict = parse_verdict(content)
                return Judgement(1.0 if verdict else 0.0, True, content.strip())
            except MalformedReply as err:  # deterministic at temperature 0: no retry
                error = str(err)
                break
            except urllib.error.HTTPError as err:
                error = f"HTTP {err.code}"
                if err.code not in (429, 500, 502, 503, 504):
                    break
            except (urllib.error.URLError, TimeoutError, OSError) as err:
                error = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
            if attempt < self.settings.max_retries:
                time.sleep(min(2.0, 0.1 * 2**attempt))
        with self._lock:
            self.failures += 1
        return Judgement(self.settings.failure_score, False, error)

    def _post(self, body: dict[str, Any]) -> str:
        headers = {"Content-Type": "application/json"}
        api_key = os.environ.get(self.settings.api_key_env)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
            raw = response.read()
        try:
            return str(json.loads(raw)["choices"][0]["message"]["content"])
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
            raise MalformedReply(
                f"not a chat-completions reply ({type(err).__name__}): {raw[:80]!r}"
            ) from err


@register("judged_accuracy")
def judged_accuracy_reward(
    completions: Sequence[str],
    *,
    answer: Sequence[str],
    problem_type: Sequence[str],
    judge: dict[str, Any] | JudgeSettings,
    problem: Sequence[str] | None = None,
    options: Sequence[Sequence[str] | None] | None = None,
    key: Sequence[str] | None = None,
    **_: Any,
) -> list[float]:
    """Accuracy with an LLM judge for open-ended rows (rule-based for multiple choice and numbers).

    A completion without a single ``<answer>`` block scores 0 without asking the judge.
    """
    settings = judge if isinstance(judge, JudgeSettings) else JudgeSettings(**judge)
    n = len(completions)
    rule_based = accuracy_reward(completions, answer=answer, problem_type=problem_type, options=options)
    questions = list(problem) if problem is not None else [""] * n
    names = list(key) if key is not None else [f"#{i}" for i in range(n)]
    scores = list(rule_based)
    to_judge: list[int] = []
    for i, (completion, kind) in enumerate(zip(completions, problem_type, strict=True)):
        if (kind or "").strip().casefold().replace("-", " ").replace("_", " ") in RULE_BASED_TYPES:
            continue
        response = extract_answer(completion)
        if response:
            to_judge.append(i)
        else:
            scores[i] = 0.0
    judgements = JudgeClient(settings).judge(
        [(questions[i], answer[i], extract_answer(completions[i]) or "") for i in to_judge],
        [names[i] for i in to_judge],
    )
    for i, judgement in zip(to_judge, judgements, strict=True):
        scores[i] = judgement.score
    return scores


def _validate_judge_kwargs(kwargs: dict[str, Any]) -> None:
    judge = kwargs.get("judge")
    if not isinstance(judge, dict | JudgeSettings):
        raise ValueError("kwargs.judge must be {base_url, model, ...}")
    if isinstance(judge, dict):
        JudgeSettings(**judge)


judged_accuracy_reward.validate_kwargs = _validate_judge_kwargs  # type: ignore[attr-defined]
