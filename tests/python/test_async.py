"""AsyncLLM: many concurrent requests on one event loop, aborts, and nothing left behind."""

import asyncio

import pytest

import longctx


@pytest.fixture(scope="module")
def engine(needle_dir):
    e = longctx.AsyncLLM(needle_dir, device="cpu", max_num_seqs=64)
    yield e
    e.close()


def test_32_concurrent_requests_with_aborts(engine, llm):
    prompts = [f"The special magic number for request {i} is" for i in range(32)]
    greedy = longctx.SamplingParams(temperature=0, max_tokens=8)
    long = longctx.SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)

    async def consume(i):
        # Every 4th request is aborted through abort(), every 4th+1 by leaving the loop early;
        # the rest run to completion.
        sp = long if i % 4 in (0, 1) else greedy
        rid = f"r{i}"
        outs = []
        async for out in engine.generate(prompts[i], sp, request_id=rid):
            assert out.request_id == rid
            outs.append(out)
            if i % 4 == 0 and len(outs) == 3:
                await engine.abort(rid)
            if i % 4 == 1 and len(outs) == 2:
                break
        return outs

    async def main():
        results = await asyncio.gather(*(consume(i) for i in range(32)))
        # Everything the engine held is released once the streams ended.
        for _ in range(100):
            stats = engine.stats()
            if stats["num_in_flight"] == 0:
                break
            await asyncio.sleep(0.01)
        return results, engine.stats()

    results, stats = asyncio.run(main())
    assert stats["kv_blocks_used"] == 0
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["num_in_flight"] == 0

    want = llm.generate([prompts[i] for i in range(32) if i % 4 in (2, 3)], greedy)
    finished = [results[i][-1] for i in range(32) if i % 4 in (2, 3)]
    for got, w in zip(finished, want):
        assert got.finished and got.outputs[0].finish_reason in ("stop", "length")
        assert got.token_ids == w.token_ids and got.outputs[0].text == w.outputs[0].text
        assert got.prompt_token_ids == w.prompt_token_ids
    for i in range(0, 32, 4):
        last = results[i][-1]
        assert last.finished and last.outputs[0].finish_reason == "abort"
        assert 3 <= len(last.token_ids) < 400
    for i in range(1, 32, 4):
        assert len(results[i]) == 2 and not results[i][-1].finished


def test_rejected_request_raises(engine):
    async def main():
        with pytest.raises(longctx.EngineError, match="max_model_len|longer"):
            async for _ in engine.generate([7] * (1 << 20), longctx.SamplingParams()):
                pass
        with pytest.raises(longctx.InvalidArgumentError, match="empty"):
            async for _ in engine.generate([], longctx.SamplingParams()):
                pass
        # The engine goes on serving.
        outs = [o async for o in engine.generate("hello", longctx.SamplingParams(max_tokens=2))]
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished


def test_cancelled_task_aborts(engine):
    async def main():
        async def run():
            async for _ in engine.generate("x", longctx.SamplingParams(max_tokens=1000,
                                                                       ignore_eos=True)):
                pass

        task = asyncio.create_task(run())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if engine.stats()["num_in_flight"] == 0:
                break
            await asyncio.sleep(0.01)
        return engine.stats()

    stats = asyncio.run(main())
    assert stats["num_in_flight"] == 0 and stats["kv_blocks_used"] == 0


def test_close_ends_running_streams(needle_dir):
    async def main():
        e = longctx.AsyncLLM(needle_dir, device="cpu")
        outs = []

        async def run():
            async for out in e.generate("x", longctx.SamplingParams(max_tokens=5000,
                                                                    ignore_eos=True)):
                outs.append(out)

        task = asyncio.create_task(run())
        while not outs:
            await asyncio.sleep(0.01)
        e.close()
        await asyncio.wait_for(task, timeout=10)
        return outs[-1]

    last = asyncio.run(main())
    assert last.finished and last.outputs[0].finish_reason == "abort"
