"""longctx.LLM on models/needle: answers, equality with the CLI, streaming, chat, errors."""

import os
import re
import subprocess
import threading
import time

import pytest

import longctx
from needle_prompts import needle_samples

GREEDY = dict(temperature=0, max_tokens=12)


def test_version_and_build():
    assert re.fullmatch(r"\d+\.\d+\.\d+", longctx.__version__)
    assert isinstance(longctx.built_with_cuda, bool)


def test_needle_prompt_answered(llm):
    (prompt, answer), = needle_samples(1024, 1)
    out, = llm.generate(prompt, longctx.SamplingParams(**GREEDY))
    assert out.outputs[0].text == answer
    assert out.outputs[0].finish_reason == "stop"
    assert out.finished
    assert out.outputs[0].token_ids[-1] == llm.get_tokenizer().eos_token_id
    assert len(out.prompt_token_ids) == out.metrics["num_prompt_tokens"] > 900


def parse_cli_outputs(stdout: str):
    parts = re.split(r"^=== prompt (\d+) ===\n", stdout, flags=re.M)
    assert parts[0] == "", stdout[:200]
    texts = {}
    for i in range(1, len(parts), 2):
        body = parts[i + 1]
        assert body.endswith("\n")
        texts[int(parts[i])] = body[:-1]
    return [texts[i] for i in range(len(texts))]


def test_batch_generate_equals_cli(llm, longctx_bin, needle_dir, tmp_path):
    prompts = [p for p, _ in needle_samples(384, 3, seed=77)]
    prompts.append("A special magic number is")
    files = []
    for i, p in enumerate(prompts):
        f = tmp_path / f"p{i}.txt"
        f.write_text(p)
        files += ["--prompt-file", str(f)]
    cli = subprocess.run([longctx_bin, "generate", "--model", needle_dir, "--device", "cpu",
                          "--temperature", "0", "--max-tokens", "10", *files],
                         check=True, capture_output=True, text=True)
    cli_texts = parse_cli_outputs(cli.stdout)
    cli_finish = re.findall(r"^\[(\d+)\] .*finish: (\w+)", cli.stderr, flags=re.M)
    outs = llm.generate(prompts, longctx.SamplingParams(temperature=0, max_tokens=10))
    assert [o.outputs[0].text for o in outs] == cli_texts
    assert [(str(i), o.outputs[0].finish_reason) for i, o in enumerate(outs)] == cli_finish
    # Token-id prompts run the same tokens.
    ids = [llm.encode(p) for p in prompts]
    by_ids = llm.generate(ids, longctx.SamplingParams(temperature=0, max_tokens=10))
    assert [o.token_ids for o in by_ids] == [o.token_ids for o in outs]
    assert [o.prompt_token_ids for o in by_ids] == ids


def test_per_prompt_params_and_seeds(llm):
    prompt = "The special magic number for"
    a = llm.generate([prompt, prompt], [longctx.SamplingParams(temperature=1.0, seed=5,
                                                               max_tokens=8),
                                        longctx.SamplingParams(temperature=0, max_tokens=3)])
    assert len(a[0].token_ids) <= 8 and len(a[1].token_ids) <= 3
    b = llm.generate(prompt, longctx.SamplingParams(temperature=1.0, seed=5, max_tokens=8))
    assert b[0].token_ids == a[0].token_ids
    with pytest.raises(ValueError, match="2 prompts but 1 SamplingParams"):
        llm.generate([prompt, prompt], [longctx.SamplingParams()])


def test_logprobs(llm):
    out, = llm.generate("A special magic number is",
                        longctx.SamplingParams(temperature=0, max_tokens=4, logprobs=3,
                                               ignore_eos=True))
    lps = out.outputs[0].logprobs
    assert len(lps) == len(out.token_ids) == 4
    for tok, d in zip(out.token_ids, lps):
        assert d[tok].rank == 1  # greedy takes the top token
        assert len(d) == 3 and all(v.logprob <= 0 for v in d.values())
        assert sorted(v.rank for v in d.values()) == [1, 2, 3]
    assert out.outputs[0].finish_reason == "length"


def test_stream_cumulative_and_equal_to_generate(llm):
    prompts = ["A special magic number is", "The quick brown"]
    sp = longctx.SamplingParams(temperature=0, max_tokens=6)
    want = llm.generate(prompts, sp)
    seen = {"0": [], "1": []}
    for out in llm.stream(prompts, sp):
        seen[out.request_id].append(out)
    for i, w in enumerate(want):
        events = seen[str(i)]
        assert len(events) >= 2 and events[-1].finished
        assert [e.finished for e in events[:-1]] == [False] * (len(events) - 1)
        for a, b in zip(events, events[1:]):
            assert b.outputs[0].text.startswith(a.outputs[0].text)
        assert events[-1].token_ids == w.token_ids
        assert events[-1].outputs[0].text == w.outputs[0].text
    assert llm.stats()["kv_blocks_used"] == 0


def test_stream_left_early_aborts(llm):
    sp = longctx.SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for n, out in enumerate(llm.stream(["one", "two", "three"], sp)):
        if n == 3:
            break
    stats = llm.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0
    # generate() drives the engine again afterwards.
    assert llm.generate("one", longctx.SamplingParams(temperature=0, max_tokens=2))[0].token_ids


def test_chat_uses_the_template(llm):
    (prompt, answer), = needle_samples(512, 1, seed=3)
    messages = [{"role": "user", "content": prompt}]
    rendered = llm.apply_chat_template(messages)
    assert rendered == "<|bos|>" + prompt  # models/needle's template
    out, = llm.chat(messages, longctx.SamplingParams(**GREEDY))
    direct, = llm.generate(prompt, longctx.SamplingParams(**GREEDY))
    assert out.prompt_token_ids == direct.prompt_token_ids
    assert out.outputs[0].text == direct.outputs[0].text == answer


def test_tokenizer_round_trip(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("The special magic number is 12345.")
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids) == "The special magic number is 12345."
    assert tok.encode("abc", add_special_tokens=False)[0] != tok.bos_token_id
    with pytest.raises(longctx.InvalidArgumentError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size + 5])


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3.0), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(logprobs=21), "logprobs"),
    (dict(json_schema="{}", json_object=True), "exclusive"),
    (dict(regex="a", choice=["a"]), "exclusive"),
    (dict(choice=[]), "at least one choice"),
])
def test_sampling_params_validation(kwargs, field):
    with pytest.raises(longctx.InvalidArgumentError, match=field) as e:
        longctx.SamplingParams(**kwargs)
    assert isinstance(e.value, ValueError)


def test_choice_and_regex(llm):
    choices = ["positive", "negative", "neutral"]
    outs = llm.generate([f"Sentiment {i}" for i in range(8)],
                        [longctx.SamplingParams(choice=choices, temperature=1.5, seed=i,
                                                max_tokens=16) for i in range(8)])
    assert all(o.outputs[0].text in choices for o in outs), [o.outputs[0].text for o in outs]
    outs = llm.generate(["Code:"], longctx.SamplingParams(regex=r"[A-Z]{2}-\d{3}", seed=3,
                                                          temperature=1.5, max_tokens=16))
    assert re.fullmatch(r"[A-Z]{2}-\d{3}", outs[0].outputs[0].text), outs[0].outputs[0].text
    with pytest.raises(longctx.UnsupportedError, match="lookahead"):
        llm.generate(["x"], longctx.SamplingParams(regex="a(?=b)"))


def test_sampling_params_keywords():
    sp = longctx.SamplingParams(temperature=0.5, top_k=40, stop=["\n"], max_tokens=7)
    assert (sp.temperature, sp.top_k, sp.stop, sp.max_tokens) == (0.5, 40, ["\n"], 7)
    with pytest.raises(TypeError):
        longctx.SamplingParams(temprature=0.5)
    with pytest.raises(TypeError):
        longctx.SamplingParams(0.5)  # keyword-only


def test_engine_errors_become_exceptions(llm, needle_dir, tmp_path):
    with pytest.raises(longctx.NotFoundError, match="no_such_model"):
        longctx.LLM(str(tmp_path / "no_such_model"), device="cpu")
    with pytest.raises(TypeError, match="unknown engine argument 'max_num_seq'.*max_num_seqs"):
        longctx.LLM(needle_dir, max_num_seq=4)
    with pytest.raises(TypeError, match="'max_num_seqs' must be an int, got str"):
        longctx.LLM(needle_dir, max_num_seqs="4")
    with pytest.raises(longctx.InvalidArgumentError, match="sparse-policy 'nope' is unknown"):
        longctx.LLM(needle_dir, sparse_policy="nope")
    with pytest.raises(longctx.InvalidArgumentError, match="load_format='dummy' needs preset"):
        longctx.LLM(load_format="dummy")
    with pytest.raises(longctx.EngineError, match="max_model_len"):
        llm.generate([[5] * (llm.max_model_len + 1)], longctx.SamplingParams(max_tokens=1))
    with pytest.raises(longctx.EngineError, match="empty"):
        llm.generate([[]], longctx.SamplingParams(max_tokens=1))
    assert "max_num_seqs" in longctx.llm.engine_arg_names()


def test_engine_args_reach_the_engine(needle_dir):
    small = longctx.LLM(needle_dir, device="cpu", max_model_len=256, block_size=32,
                        kv_cache_memory=64 << 20, max_num_seqs=2, enable_prefix_caching=False)
    assert small.max_model_len == 256 and small.device == "cpu"
    assert small.stats()["kv_block_size"] == 32
    outs = small.generate(["a", "b", "c"], longctx.SamplingParams(temperature=0, max_tokens=3))
    assert len(outs) == 3
    with pytest.raises(longctx.InvalidArgumentError, match="256"):
        small.generate([[5] * 300], longctx.SamplingParams(max_tokens=1))


def test_state_snapshots_give_prefix_hits_on_a_linear_attention_model(repo_root):
    # tiny-qwen3-next: a prompt sharing a cached prefix starts from a state snapshot; its greedy
    # tokens equal an engine's without prefix caching. No snapshots: no hits.
    model = os.path.join(repo_root, "tests", "data", "fixtures", "tiny-qwen3-next")
    head = [(7 * i + 3) % 500 for i in range(64)]
    prompts = [head + [11, 12, 13], head + [21, 22, 23, 24]]
    sp = longctx.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    def run(**kw):
        llm = longctx.LLM(model, device="cpu", block_size=16, kv_cache_memory=64 << 20, **kw)
        outs = [llm.generate([p], sp)[0].outputs[0].token_ids for p in prompts]
        return outs, llm.stats()

    want, _ = run(enable_prefix_caching=False)
    got, stats = run(max_state_snapshots=4)
    assert got == want
    assert stats["prefix_cache_hits"] > 0
    _, none = run(max_state_snapshots=0)
    assert none["prefix_cache_hits"] == 0
    with pytest.raises(longctx.InvalidArgumentError, match="max_state_snapshots must be >= 0"):
        longctx.LLM(model, device="cpu", max_state_snapshots=-2)


def test_fp8_kv_cache_answers_the_needle(needle_dir):
    (prompt, answer), = needle_samples(1024, 1)
    outs = {}
    for kv in ("bf16", "fp8"):
        llm = longctx.LLM(needle_dir, device="cpu", kv_cache_dtype=kv, kv_cache_memory=256 << 20)
        outs[kv] = llm.generate(prompt, longctx.SamplingParams(**GREEDY))[0]
    assert outs["bf16"].outputs[0].text == answer
    assert outs["fp8"].outputs[0].text == outs["bf16"].outputs[0].text
    with pytest.raises(longctx.InvalidArgumentError, match="'fp16' is unknown"):
        longctx.LLM(needle_dir, device="cpu", kv_cache_dtype="fp16")


def test_speculative_decoding_keeps_greedy_outputs(needle_dir):
    (prompt, answer), = needle_samples(1024, 1)
    plain = longctx.LLM(needle_dir, device="cpu", kv_cache_memory=256 << 20)
    spec = longctx.LLM(needle_dir, device="cpu", kv_cache_memory=256 << 20,
                       speculative_method="ngram", num_speculative_tokens=4, prompt_lookup_min=1,
                       prompt_lookup_max=3)
    want = plain.generate(prompt, longctx.SamplingParams(**GREEDY))[0].outputs[0]
    got = spec.generate(prompt, longctx.SamplingParams(**GREEDY))[0].outputs[0]
    assert want.text == answer
    assert got.token_ids == want.token_ids
    stats = spec.stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    assert len(stats["spec_decode_num_accepted_tokens_per_pos"]) == 4
    assert plain.stats()["spec_decode_num_drafts"] == 0
    with pytest.raises(longctx.InvalidArgumentError, match="unknown speculative method 'eagle'"):
        longctx.LLM(needle_dir, device="cpu", speculative_method="eagle")
    with pytest.raises(longctx.InvalidArgumentError, match="num-speculative-tokens >= 1"):
        longctx.LLM(needle_dir, device="cpu", speculative_method="ngram")
    with pytest.raises(longctx.InvalidArgumentError, match="greater than --prompt-lookup-max"):
        longctx.LLM(needle_dir, device="cpu", speculative_method="ngram",
                    num_speculative_tokens=2, prompt_lookup_min=4, prompt_lookup_max=2)


def test_gil_released_while_the_engine_runs(llm):
    (prompt, _), = needle_samples(1024, 1, seed=9)
    done = threading.Event()
    counter = 0

    def run():
        llm.generate(prompt, longctx.SamplingParams(temperature=0, max_tokens=4))
        done.set()

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.05)  # let the thread enter the engine
    while not done.is_set():
        counter += 1
    t.join()
    # Holding the GIL for the whole prefill would leave this loop a handful of turns.
    assert counter > 10000
