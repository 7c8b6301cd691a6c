"""The offline API, in vLLM's and nano-vllm's shape, over the C++ engine (include/longctx/llm.h)."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from longctx import _longctx
from longctx.outputs import RequestOutput, StreamState, from_engine

PromptType = Union[str, Sequence[int]]
ParamsType = Union["_longctx.SamplingParams", Sequence["_longctx.SamplingParams"], None]


def engine_arg_names() -> List[str]:
    """The keyword arguments LLM() and AsyncLLM() take (the CLI's engine flags, underscored)."""
    return list(_longctx.engine_arg_names())


def _prompt_list(prompts) -> list:
    """One prompt (a str or a list of token ids) or a list of them -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) for p in prompts):
        return [prompts]  # one prompt of token ids
    return [p if isinstance(p, str) else list(p) for p in prompts]


def _params_list(params: ParamsType, n: int) -> list:
    if params is None:
        params = _longctx.SamplingParams()
    if isinstance(params, _longctx.SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"{n} prompts but {len(params)} SamplingParams")
    return params


class Tokenizer:
    """The model's tokenizer (tokenizer.json, byte-level BPE), as the engine uses it."""

    def __init__(self, engine: "_longctx.Engine"):
        self._engine = engine

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of `text`; with add_special_tokens, the tokenizer's BOS etc. as well."""
        return list(self._engine.encode(text, add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._engine.decode(list(token_ids), skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size()

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._engine.eos_token_id()

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._engine.bos_token_id()


class LLM:
    """An engine over one model: LLM(model, **engine_args).

    `model` is a Hugging Face checkpoint folder (None with load_format="dummy", preset=NAME).
    Engine arguments are the CLI's engine flags with underscores (device="cpu", dtype="float16",
    max_num_seqs=64, kv_offload=True, sparse_policy="quest", ...; engine_arg_names() lists
    them); an unknown one is a TypeError naming it. Byte sizes (gpu_memory_limit,
    kv_cache_memory, host_kv_budget, gpu_kv_budget) are ints. Engine errors raise
    longctx.EngineError subclasses with the engine's message. The engine runs without the GIL.
    """

    def __init__(self, model: Optional[str] = None, **engine_args: Any):
        self._engine = _longctx.Engine(model, engine_args)
        self._next_id = 0

    # ---- batch ----
    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: ParamsType = None, use_tqdm: bool = False,
                 add_special_tokens: bool = True) -> List[RequestOutput]:
        """Runs every prompt (text, or a list of token ids) to completion with continuous
        batching; outputs in prompt order. `sampling_params`: one for all or one per prompt.
        use_tqdm draws the engine's progress on stderr."""
        plist = _prompt_list(prompts)
        params = _params_list(sampling_params, len(plist))
        raw = self._engine.generate(plist, [add_special_tokens] * len(plist), params, use_tqdm)
        return [
            from_engine(r, str(self._take_id()), p if isinstance(p, str) else None,
                        params[i].logprobs is not None)
            for i, (r, p) in enumerate(zip(raw, plist))
        ]

    def chat(self, messages: Union[List[dict], List[List[dict]]],
             sampling_params: ParamsType = None, add_generation_prompt: bool = True,
             chat_template_kwargs: Optional[dict] = None,
             use_tqdm: bool = False) -> List[RequestOutput]:
        """The chat template applied to `messages` ([{"role": ..., "content": ...}], or a list
        of such conversations), then generate(). chat_template_kwargs, e.g.
        {"enable_thinking": False}, are the template's extra variables."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.apply_chat_template(c, add_generation_prompt, chat_template_kwargs)
                   for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm, add_special_tokens=False)

    def apply_chat_template(self, messages: List[dict], add_generation_prompt: bool = True,
                            chat_template_kwargs: Optional[dict] = None) -> str:
        """The rendered prompt (transformers' apply_chat_template(tokenize=False)); encode it
        without special tokens."""
        return self._engine.render_chat(json.dumps(messages), add_generation_prompt,
                                        json.dumps(chat_template_kwargs or {}))

    # ---- streaming ----
    def stream(self, prompts: Union[PromptType, Sequence[PromptType]],
               sampling_params: ParamsType = None,
               add_special_tokens: bool = True) -> Iterator[RequestOutput]:
        """Yields a cumulative RequestOutput (request_id = the prompt's index) every time a
        request has new tokens, the last one of each with finished=True. Leaving the loop
        early aborts what is still running."""
        plist = _prompt_list(prompts)
        params = _params_list(sampling_params, len(plist))
        states: Dict[int, StreamState] = {}
        try:
            for i, (p, sp) in enumerate(zip(plist, params)):
                rid, ids = self._engine.submit(p, add_special_tokens, sp)
                states[rid] = StreamState(str(i), p if isinstance(p, str) else None, list(ids),
                                          sp.logprobs is not None)
            live = set(states)
            while live:
                # Short waits (without the GIL) so Ctrl-C reaches Python between them.
                for rid, *event in self._engine.drain(0.1):
                    state = states.get(rid)
                    if state is None:
                        continue
                    out = state.update(*event)
                    if state.error is not None:
                        live.discard(rid)
                        raise state.error
                    if state.finished:
                        live.discard(rid)
                    yield out
        finally:
            for rid, state in states.items():
                if not state.finished:
                    self._engine.abort(rid)
            if any(not s.finished for s in states.values()):
                self._engine.shutdown()  # aborts and joins; drops their remaining events
                self._engine.drain(0.0)

    # ---- the rest ----
    def get_tokenizer(self) -> Tokenizer:
        return Tokenizer(self._engine)

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return self.get_tokenizer().encode(text, add_special_tokens)

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len()

    @property
    def device(self) -> str:
        """The device the model runs on ("cpu", "cuda:0")."""
        return self._engine.device()

    def stats(self) -> Dict[str, int]:
        """The engine's counters: running/waiting sequences, KV blocks used and total, prefix
        cache hits, tokens computed."""
        return dict(self._engine.stats())

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1
