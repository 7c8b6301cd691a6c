"""AsyncLLM: the engine for asyncio servers. The C++ engine thread runs the steps; each event is
queued in C++ and a byte written to a pipe that the event loop watches (loop.add_reader), so
the loop never blocks on the engine and the engine never waits for Python."""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, AsyncIterator, Dict, Optional

from longctx import _longctx
from longctx.llm import PromptType, Tokenizer
from longctx.outputs import RequestOutput, StreamState


class AsyncLLM:
    """AsyncLLM(model, **engine_args): the same engine arguments as LLM.

        async for out in engine.generate("prompt", SamplingParams(max_tokens=32), "req-1"):
            print(out.outputs[0].text)   # cumulative; out.finished on the last one

    Any number of generate() calls may run concurrently (continuous batching); abort(id), or
    leaving the `async for` early (break, cancellation), aborts a request and frees its KV
    blocks. One event loop at a time (a later asyncio.run() takes it over); close() stops the
    engine thread.
    """

    def __init__(self, model: Optional[str] = None, **engine_args: Any):
        self._engine = _longctx.Engine(model, engine_args)
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._engine.set_notify_fd(self._write_fd)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._queues: Dict[int, asyncio.Queue] = {}
        self._ids: Dict[str, int] = {}
        self._counter = itertools.count()
        self._closed = False

    @classmethod
    def from_engine_args(cls, model: Optional[str] = None, **engine_args: Any) -> "AsyncLLM":
        return cls(model, **engine_args)

    async def generate(self, prompt: PromptType, sampling_params=None,
                       request_id: Optional[str] = None,
                       add_special_tokens: bool = True) -> AsyncIterator[RequestOutput]:
        """Yields cumulative RequestOutputs of one request as its tokens come."""
        if self._closed:
            raise _longctx.EngineError("AsyncLLM is closed")
        self._attach()
        if sampling_params is None:
            sampling_params = _longctx.SamplingParams()
        if request_id is None:
            request_id = f"req-{next(self._counter)}"
        if request_id in self._ids:
            raise ValueError(f"request_id {request_id!r} is already running")
        if not isinstance(prompt, str):
            prompt = list(prompt)
        queue: asyncio.Queue = asyncio.Queue()
        # submit() tokenizes on this thread (without the GIL). Events are only drained by
        # _on_readable on this loop, so registering the queue right after cannot miss one.
        rid, ids = self._engine.submit(prompt, add_special_tokens, sampling_params)
        self._queues[rid] = queue
        self._ids[request_id] = rid
        state = StreamState(request_id, prompt if isinstance(prompt, str) else None, list(ids),
                            sampling_params.logprobs is not None)
        try:
            while True:
                event = await queue.get()
                out = state.update(*event)
                if state.error is not None:
                    raise state.error
                yield out
                if state.finished:
                    break
        finally:
            self._queues.pop(rid, None)
            self._ids.pop(request_id, None)
            if not state.finished:
                self._engine.abort(rid)

    async def abort(self, request_id: str) -> None:
        """Aborts a running request: its stream ends with finish_reason "abort"."""
        rid = self._ids.get(request_id)
        if rid is not None:
            self._engine.abort(rid)

    def get_tokenizer(self) -> Tokenizer:
        return Tokenizer(self._engine)

    def stats(self) -> Dict[str, int]:
        """Engine counters (kv_blocks_used, num_running, num_in_flight, ...)."""
        return dict(self._engine.stats())

    def close(self) -> None:
        """Aborts what runs, stops the engine thread, closes the pipe. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # Aborts and joins the engine thread: every running request's final event is queued.
        self._engine.shutdown()
        self._engine.set_notify_fd(-1)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._read_fd)
            # Hand the final events to the generators still waiting (on the loop's thread).
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                self._on_readable()
            elif loop.is_running():
                loop.call_soon_threadsafe(self._on_readable)
        os.close(self._read_fd)
        os.close(self._write_fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to report to
            pass

    async def __aenter__(self) -> "AsyncLLM":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    # ---- the event loop side ----
    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            # A finished asyncio.run() left its loop behind: move to the new one.
            if self._loop.is_running():
                raise RuntimeError("AsyncLLM is in use by another running event loop")
            if not self._loop.is_closed():
                self._loop.remove_reader(self._read_fd)
            self._loop = None
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self._read_fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            while os.read(self._read_fd, 4096):
                pass
        except (BlockingIOError, OSError):  # empty, or closed by close()
            pass
        for rid, *event in self._engine.drain(0.0):
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait(event)
