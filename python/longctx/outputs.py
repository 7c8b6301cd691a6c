"""What a request produces, in vLLM's shape: RequestOutput.outputs[0].text and so on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union


@dataclass
class Logprob:
    """The log-probability of a token under the raw model distribution, and its rank (1 = top)."""

    logprob: float
    rank: Optional[int] = None


@dataclass
class CompletionOutput:
    """The generated part of a request: text (cut before a stop string), token ids (a final EOS
    or stop token included), why it ended ("stop", "length", "abort"; None while running), which
    stop (the stop string or stop token id; None for EOS), and per generated token a dict
    {token_id: Logprob} of the sampled token and the top-N (when SamplingParams.logprobs)."""

    index: int
    text: str
    token_ids: List[int]
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    logprobs: Optional[List[Dict[int, Logprob]]] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One request: its prompt, prompt token ids, the completion (outputs[0]), whether it
    finished, and the engine's timings (seconds on a steady clock) and token counts."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """outputs[0].text (nano-vllm's output["text"])."""
        return self.outputs[0].text

    @property
    def token_ids(self) -> List[int]:
        """outputs[0].token_ids."""
        return self.outputs[0].token_ids


def _logprob_dicts(raw, wanted: bool) -> Optional[List[Dict[int, Logprob]]]:
    if not wanted:
        return None
    out = []
    for token, logprob, rank, top in raw:
        d = {int(t): Logprob(float(lp)) for t, lp in top}
        for r, (t, _) in enumerate(top, start=1):
            d[int(t)].rank = r
        d[int(token)] = Logprob(float(logprob), int(rank))
        out.append(d)
    return out


def from_engine(raw: dict, request_id: str, prompt: Optional[str],
                want_logprobs: bool) -> RequestOutput:
    """A RequestOutput from the engine's finished output (a dict made by the extension)."""
    completion = CompletionOutput(
        index=0,
        text=raw["text"],
        token_ids=list(raw["token_ids"]),
        finish_reason=raw["finish_reason"],
        stop_reason=raw["stop_reason"],
        logprobs=_logprob_dicts(raw["logprobs"], want_logprobs),
    )
    return RequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=list(raw["prompt_token_ids"]),
        outputs=[completion],
        finished=raw["finish_reason"] is not None,
        metrics=dict(raw["metrics"]),
    )


class StreamState:
    """Accumulates one streamed request's events into cumulative RequestOutputs (vLLM's
    default output kind); the final one is the engine's complete output."""

    def __init__(self, request_id: str, prompt: Optional[str], prompt_token_ids: List[int],
                 want_logprobs: bool):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.want_logprobs = want_logprobs
        self.text = ""
        self.token_ids: List[int] = []
        self.logprobs: list = []
        self.finished = False
        self.error: Optional[BaseException] = None

    def update(self, text, new_ids, new_logprobs, finished, output, error) -> RequestOutput:
        if error is not None:
            self.error = error
        if output is not None:
            self.finished = True
            out = from_engine(output, self.request_id, self.prompt, self.want_logprobs)
            if not out.prompt_token_ids:
                out.prompt_token_ids = list(self.prompt_token_ids)
            return out
        self.text += text
        self.token_ids.extend(new_ids)
        self.logprobs.extend(new_logprobs)
        self.finished = bool(finished)
        completion = CompletionOutput(
            index=0,
            text=self.text,
            token_ids=list(self.token_ids),
            finish_reason="abort" if finished else None,
            logprobs=_logprob_dicts(self.logprobs, self.want_logprobs),
        )
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids),
                             [completion], self.finished)
