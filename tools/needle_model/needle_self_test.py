"""The self test of needle_data.py (`needle_data.py --self-test`): every sample's token ids equal
a fresh encode of its text, lengths fit, noise- and needle-haystack needles are lines of their
own, values and keys have their kind's form, samples are pure functions of their rng, the
committed test data regenerates, and the prompts' phrasing agrees with RULER's own samples.
Standard library only."""

from __future__ import annotations

import json
import os
import random
import re

from needle_data import (ADJECTIVES, EVAL_SETTINGS, HAYSTACKS, KEY_KINDS, KEY_WORDS, NOISE_LINE,
                         NOUNS, PROSE_ADJECTIVES, PROSE_ADVERBS, PROSE_NAMES, PROSE_NOUNS,
                         PROSE_PLACES, PROSE_TIMES, PROSE_VERBS, TASKS, VALUE_KINDS, VARIANTS,
                         Generator, Sample, eval_rng, sample_to_json)

UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
VALUE_RE = {"number": r"[0-9]{7}", "word": r"[a-z]+-[a-z]+", "uuid": UUID_RE}
NEEDLE_LINE_RE = re.compile(r"One of the special magic (number|word|uuid)s for (\S+) is: (\S+)\.")
VT_LINE_RE = re.compile(r"VAR [A-Z]{5} = (VAR [A-Z]{5}|[0-9]{5})")


def check_sample(gen: Generator, s: Sample, where) -> None:
    """The invariants of one sample built with text=True."""
    assert gen.tok.encode(s.text) == s.ids, where
    assert gen.tok.encode(s.text + s.answer) == s.ids + s.answer_ids, where
    total = 1 + len(s.ids) + len(s.answer_ids) + 1
    assert total <= s.length, (where, total)
    assert total >= s.length * 0.9 or s.length < 1024, (where, total)
    assert s.input + s.answer_prefix == s.text and len(gen.tok.encode(s.answer_prefix)) == \
        s.n_prefix, where
    for o in s.outputs:
        assert o in s.answer and o in s.input, (where, o)
    hs = s.meta["haystack"]
    lines = s.input.split("\n")
    context = [ln for ln in lines[1:-1] if ln]  # between the instructions and the question
    if hs in ("noise", "needle"):  # every needle is a line of its own
        for ln in context:
            assert ln == NOISE_LINE or NEEDLE_LINE_RE.fullmatch(ln) or VT_LINE_RE.fullmatch(ln), \
                (where, ln)
    if hs == "needle":
        assert all(NEEDLE_LINE_RE.fullmatch(ln) for ln in context), where
        # The asked key's needles only (one, or one per value), however many lines there are.
        key, n_needles = s.meta["keys"][0], len(s.outputs) if len(s.meta["keys"]) == 1 else 1
        assert sum(f" for {key} is: " in ln for ln in context) == n_needles, where
    if "value_kind" in s.meta:
        kind = s.meta["value_kind"]
        for o in s.outputs:
            assert re.fullmatch(VALUE_RE[kind], o), (where, o)
        key_re = UUID_RE if s.meta["key_kind"] == "uuid" else r"[a-z]+-[a-z]+"
        for key in s.meta["keys"]:
            assert re.fullmatch(key_re, key), (where, key)
        for m in NEEDLE_LINE_RE.finditer(s.input):
            assert m.group(1) == kind and re.fullmatch(key_re, m.group(2)), (where, m.group(0))
        assert s.answer_prefix.startswith(" The special magic " + kind), where
    if hs == "heldout":  # no essay sentence; the prose grammar's words only
        assert "The grass is green" not in s.input, where


def ruler_skeleton(rec: dict) -> dict:
    """A RULER-style record's text with its keys and values replaced by placeholders: what
    must agree between RULER's samples and ours."""
    def blank(t: str) -> str:
        t = re.sub(UUID_RE, "<v>", t)
        t = re.sub(r"[0-9]+", "<v>", t)
        t = re.sub(r"(?<= for )[^ ]+(, [^ ]+)*(,? and [^ ]+)?(?= (is:|mentioned))", "<k>", t)
        t = re.sub(r"(?<=VAR )[A-Z]+", "<x>", t)
        return t
    lines = rec["input"].split("\n")
    needles = sorted({blank(m.group(0)) for m in NEEDLE_LINE_RE.finditer(rec["input"])} |
                     {blank(m.group(0)) for m in VT_LINE_RE.finditer(rec["input"])})
    return {"head": lines[0], "question": blank(lines[-1]),
            "answer_prefix": blank(rec["answer_prefix"]).rstrip(" "), "needles": needles}


def self_test(gen: Generator, n: int = 3, lengths=(512, 4096), repo: str | None = None,
              essays: bool = True) -> None:
    """ids(sample) == encode(text(sample)) and the other invariants of check_sample for every
    task, variant, value and key kind and haystack; samples are pure functions of their rng;
    RULER's phrasing. With the essays (essays=True) also what only that corpus gives: thousands
    of "wide" key words, and the default samples are those of the committed test data."""
    # The five tasks on the prose haystacks and the noise one (as RULER's settings otherwise).
    for task in TASKS:
        for length in lengths:
            for i in range(n):
                for hs in ("essay", "noise", "heldout"):
                    rng = random.Random(f"selftest/{task}/{length}/{i}/{hs}")
                    s = gen.make_sample(rng, task, length, text=True,
                                        **{**EVAL_SETTINGS[task], "haystack": hs})
                    check_sample(gen, s, (task, length, i, hs))
    # Every variant, and every value/key kind and word pool on each niah task and haystack
    # (at the longer length: UUID keys and values do not all fit in 512 tokens).
    for length in lengths:
        for name in VARIANTS:
            for i in range(n):
                s = gen.make_sample(random.Random(f"selftest/{name}/{length}/{i}"), name, length,
                                    text=True)
                assert s.task == name
                check_sample(gen, s, (name, length, i))
    for length in lengths[-1:]:
        for task in TASKS[:4]:
            for hs in HAYSTACKS:
                for kind in VALUE_KINDS:
                    for key_kind in KEY_KINDS:
                        for words in KEY_WORDS:
                            where = (task, length, hs, kind, key_kind, words)
                            s = gen.make_sample(random.Random(f"selftest/{where}"), task, length,
                                                haystack=hs, value_kind=kind, key_kind=key_kind,
                                                key_words=words, num_distractors=2, num_values=3,
                                                num_queries=3, text=True)
                            check_sample(gen, s, where)
    # A pure function of the rng (and so of (seed, task, length, index)).
    for name in ("niah_multikey_3", "niah_single_word", "niah_multiquery", "vt"):
        for hs in ("needle", "heldout") if name != "vt" else ("heldout",):
            a, b = (gen.make_sample(eval_rng(7, name, 2048, 3), name, 2048, haystack=hs,
                                    key_words="wide", text=True) for _ in range(2))
            assert a == b, name
    # The word lists of keys, values and held-out prose are disjoint; prose words are short.
    key_words = set(ADJECTIVES) | set(NOUNS)
    prose = {w.lower() for ws in (PROSE_NAMES, PROSE_NOUNS, PROSE_PLACES, PROSE_ADJECTIVES,
                                  PROSE_VERBS, PROSE_ADVERBS) for w in ws}
    prose |= {w.lower() for t in PROSE_TIMES for w in t.split()}
    assert not prose & key_words, prose & key_words
    assert all(len(gen.tok.encode(" " + w)) <= 6 for w in prose)
    assert len(gen.hay.wide_words) > (2000 if essays else 100), len(gen.hay.wide_words)
    # The defaults are unchanged: the committed test data (tests/data/needle) regenerates.
    if essays:
        assert repo and os.path.isdir(os.path.join(repo, "tests/data/needle")), repo
        d = os.path.join(repo, "tests/data/needle")
        with open(os.path.join(d, "reference.json")) as f:
            ref = json.load(f)
        s = gen.make_sample(random.Random("reference/1k"), "niah_single", 1024, text=True,
                            **EVAL_SETTINGS["niah_single"])
        assert [2045] + s.ids == ref["input_ids"] and s.answer == ref["expected_answer"]
        for task in ("niah_single", "niah_multivalue"):
            with open(os.path.join(d, f"{task}_2k.jsonl")) as f:
                for line in f:
                    rec = json.loads(line)
                    s = gen.make_sample(eval_rng(rec["seed"], task, rec["length"], rec["index"]),
                                        task, rec["length"], text=True, **EVAL_SETTINGS[task])
                    new = sample_to_json(s, rec["index"], rec["seed"])
                    assert {k: new[k] for k in rec} == rec, (task, rec["index"])
    # RULER's phrasing: instructions, question, answer prefix and needles of each variant agree
    # with RULER's own samples (tests/data/ruler, evaluation data: read here, never trained on).
    ruler = os.path.join(repo or "", "tests/data/ruler/4096")
    if repo and os.path.isdir(ruler):
        names = [t for t in os.listdir(ruler) if t in EVAL_SETTINGS]
        assert len(names) >= 9, names
        for name in names:
            with open(os.path.join(ruler, name, "validation.jsonl")) as f:
                theirs = ruler_skeleton(json.loads(f.readline()))
            s = gen.make_sample(eval_rng(1, name, 4096, 0), name, 4096, text=True,
                                **EVAL_SETTINGS[name])
            ours = ruler_skeleton({"input": s.input, "answer_prefix": s.answer_prefix})
            # (RULER's vt also has a one-shot example first and a space after "they are:".)
            assert ours == theirs, (name, ours, theirs)
