"""LLM on the GPU from Python (label gpu: CUDA builds, run on a GPU machine): models/needle
answers resident and with the KV cache offloaded to pinned host memory, with equal tokens."""

import longctx
from needle_prompts import needle_samples


def test_needle_on_the_gpu_resident_and_offloaded(needle_dir):
    samples = needle_samples(4096, 4, seed=11)
    prompts = [p for p, _ in samples]
    sp = longctx.SamplingParams(temperature=0, max_tokens=12)
    resident = longctx.LLM(needle_dir, device="cuda", gpu_memory_utilization=0.4)
    assert resident.device.startswith("cuda")
    want = resident.generate(prompts, sp)
    del resident
    # A GPU cache of 96 blocks: room for the blocks one step writes (4096 tokens, 4 sequences),
    # fewer than the 4 prompts' 4 x 33 blocks, so the KV lives in the host pool.
    offloaded = longctx.LLM(needle_dir, device="cuda", gpu_memory_utilization=0.4,
                            kv_offload=True, host_kv_budget=1 << 30, gpu_kv_budget=48 << 20,
                            max_num_batched_tokens=4096, max_num_seqs=4,
                            offload_slots=4, offload_slot_tokens=1024)
    got = offloaded.generate(prompts, sp)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    right = sum(o.outputs[0].text == answer for o, (_, answer) in zip(got, samples))
    assert right >= 3, [o.outputs[0].text for o in got]
    assert offloaded.stats()["kv_blocks_used"] == 0
