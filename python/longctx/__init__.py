"""longctx: the long-context inference engine from Python.

A thin binding over the C++ engine (``LLM``, ``AsyncLLM``) and the block-causal op
(``longctx.ops``); see docs/python.md.

    >>> import longctx
    >>> llm = longctx.LLM("models/needle", device="cpu")
    >>> out = llm.generate(["The capital of"], longctx.SamplingParams(temperature=0, max_tokens=8))
    >>> out[0].outputs[0].text
"""

from longctx._longctx import (
    EngineError,
    InvalidArgumentError,
    NotFoundError,
    OutOfMemoryError,
    SamplingParams,
    UnsupportedError,
    __version__,
    built_with_cuda,
)
from longctx.async_llm import AsyncLLM
from longctx.llm import LLM, Tokenizer
from longctx.outputs import CompletionOutput, Logprob, RequestOutput

__all__ = [
    "AsyncLLM",
    "CompletionOutput",
    "EngineError",
    "InvalidArgumentError",
    "LLM",
    "Logprob",
    "NotFoundError",
    "OutOfMemoryError",
    "RequestOutput",
    "SamplingParams",
    "Tokenizer",
    "UnsupportedError",
    "__version__",
    "built_with_cuda",
]
