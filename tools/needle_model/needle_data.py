"""RULER-style synthetic retrieval tasks, built at the token level (pure standard-library Python).

Tasks (prompts follow RULER's `base` templates; see README.md for the exact text):
  niah_single      one needle "One of the special magic numbers for {key} is: {7 digits}."
  niah_multikey    the needle plus distractor needles with other keys
  niah_multivalue  several needles with the same key; the answer lists all values
  niah_multiquery  several keys asked at once; the answer lists one value per key, in order
  vt               variable tracking: "VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE", ...;
                   the answer lists every variable of the chain that holds the asked value

A sample is a prompt (instructions, haystack with needles, question, answer prefix) and an
answer. The haystack is either Paul Graham essay sentences ("essay": consecutive sentences from
a random start, whitespace collapsed) or RULER's repeated noise line ("noise"). Every piece of
text (sentence, needle, template part) is tokenized once and pieces are joined only where the
GPT-2 pre-tokenizer splits anyway, so ids(sample) == encode(text(sample)) (checked by
`self_test`) while a 64K-token sample costs list concatenation, not tokenization.

Everything is a function of (seed, index): `make_sample(rng=random.Random(...))`.
"""

from __future__ import annotations

import bisect
import json
import random
import re
from dataclasses import dataclass, field

from bpe import ByteLevelBPE, sanitize

NOISE_LINE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
              "There and back again.")

ADJECTIVES = (
    "able acid angry anxious ashamed awake bitter blue bold brave bright broad busy calm careful "
    "cheap clean clever cold cool crazy cruel curly damp dark dear deep dirty dizzy dry eager early "
    "easy empty equal exact faint fair false fancy fast fierce flat fluffy fond free fresh full "
    "funny gentle giant glad golden good grand green grumpy happy hard heavy helpful hollow honest "
    "huge humble hungry icy jolly juicy keen kind large late lazy light little lively lonely loud "
    "lucky mad magic mighty mild modern narrow neat nervous new nice noisy odd old orange plain "
    "polite poor proud purple quick quiet rapid rare red rich rough round royal rude sad safe salty "
    "scary sharp shiny short shy silent silly simple slow small smooth soft sour spicy steady "
    "sticky strange strict strong sweet swift tall tame tasty tender thick thin tidy tiny tired "
    "tough ugly vast warm weak wet wide wild wise witty wooden young zany").split()

NOUNS = (
    "apple anchor army baker banana basket beach bell bicycle bird blanket boat bottle bridge "
    "brother bucket butter button cabin camera candle canyon carpet castle cat chair cherry "
    "circle cloud coast coffee comet copper corner cotton cousin crayon crown cup curtain desk "
    "diamond doctor dolphin door dragon drum eagle engine feather fence field finger flag flower "
    "forest fork fountain garden ghost giraffe glove goat guitar hammer harbor hat helmet hill "
    "honey horse island jacket jelly kettle kitchen kite ladder lake lamp lemon letter lion "
    "magnet map market meadow mirror monkey moon mountain needle nest ocean office onion orchard "
    "owl painter panda paper parrot pencil pepper piano pillow pirate planet pocket pond potato "
    "puzzle rabbit radio river robot rocket saddle sailor salad school shadow shell ship shoe "
    "silver singer sister spider spoon squirrel star station stone storm sugar sunset table "
    "teacher temple thunder tiger tomato tower tractor train tree tunnel turtle valley violin "
    "wagon wallet whale window winter wizard wolf yacht zebra").split()

TEMPLATES = {
    "niah_single": (
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.",
        "\nWhat is the special magic number for {query} mentioned in the provided text?",
        " The special magic number for {query} mentioned in the provided text is"),
    "niah_multi": (
        "Some special magic numbers are hidden within the following text. Make sure to memorize "
        "it. I will quiz you about the numbers afterwards.",
        "\nWhat are all the special magic numbers for {query} mentioned in the provided text?",
        " The special magic numbers for {query} mentioned in the provided text are"),
    "vt": (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.",
        "\nQuestion: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {n} "
        "variables are assigned the value {query}, they are:"),
}

TASKS = ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt"]

# RULER's standard settings, used for evaluation.
EVAL_SETTINGS = {
    "niah_single": dict(haystack="essay"),
    "niah_multikey": dict(haystack="essay", num_distractors=3),
    "niah_multivalue": dict(haystack="essay", num_values=4),
    "niah_multiquery": dict(haystack="essay", num_queries=4),
    "vt": dict(haystack="noise", num_chains=1, num_hops=4),
}


@dataclass
class Piece:
    text: str
    ids: list
    aux: bool = False  # a repeated haystack span (training-only auxiliary copy target)


@dataclass
class Sample:
    task: str
    ids: list                # prompt token ids (no BOS)
    answer_ids: list         # answer token ids (no EOS)
    outputs: list            # expected strings (RULER `outputs`)
    answer: str              # the answer text the model is trained to produce
    length: int              # target total length (BOS + prompt + answer + EOS <= length)
    depths: list             # needle depths (fraction of haystack tokens before each needle)
    text: str = ""           # the prompt text (when built with text=True), RULER `input` +
    answer_prefix: str = ""  # `answer_prefix` (text == input + answer_prefix)
    input: str = ""
    n_prefix: int = 0        # tokens of the answer prefix (the last n_prefix of ids)
    aux_pos: list = field(default_factory=list)  # ids indices inside repeated spans
    meta: dict = field(default_factory=dict)


class Haystacks:
    """Pre-tokenized haystack sentences with prefix sums for O(log n) slicing."""

    def __init__(self, tok: ByteLevelBPE, essays_path: str):
        self.tok = tok
        with open(essays_path, encoding="utf-8") as f:
            text = sanitize(json.load(f)["text"])
        text = re.sub(r"\s+", " ", text).strip()
        # Split after sentence punctuation; every sentence but the first starts with one space.
        sentences = re.split(r"(?<=[.!?])(?= [A-Z\"'(])", text)
        # Every piece starts with a space, the corpus' first sentence too, so a needle or a
        # question can precede any of them.
        sentences = [s if s.startswith(" ") else " " + s for s in sentences if s.strip()]
        self.essay = [Piece(s, tok.encode(s)) for s in sentences]
        self.essay_cum = [0]
        for p in self.essay:
            self.essay_cum.append(self.essay_cum[-1] + len(p.ids))
        # Every noise line starts with its newline (the context's first loses it in _join_head).
        self.noise_line = Piece("\n" + NOISE_LINE, tok.encode("\n" + NOISE_LINE))

    def essay_pieces(self, rng: random.Random, budget: int) -> list:
        """Consecutive essay sentences from a random start, at most `budget` tokens."""
        total = self.essay_cum[-1]
        if budget >= total:
            raise ValueError(f"haystack budget {budget} exceeds the essay corpus ({total} tokens)")
        start = rng.randrange(0, bisect.bisect_right(self.essay_cum, total - budget))
        end = bisect.bisect_right(self.essay_cum, self.essay_cum[start] + budget) - 1
        return self.essay[start:end]

    def noise_pieces(self, budget: int) -> list:
        return [self.noise_line] * max(0, budget // len(self.noise_line.ids))


class Generator:
    def __init__(self, tok: ByteLevelBPE, essays_path: str):
        self.tok = tok
        self.hay = Haystacks(tok, essays_path)
        self._enc_cache: dict[str, list] = {}

    def enc(self, text: str) -> list:
        got = self._enc_cache.get(text)
        if got is None:
            got = self.tok.encode(text)
            if len(self._enc_cache) < 200000:
                self._enc_cache[text] = got
        return got

    def piece(self, text: str) -> Piece:
        return Piece(text, self.enc(text))

    # ---- random values ----
    @staticmethod
    def rand_key(rng, used):
        while True:
            k = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
            if k not in used:
                used.add(k)
                return k

    @staticmethod
    def rand_number(rng, used, digits=7):
        while True:
            v = str(rng.randrange(10 ** (digits - 1), 10 ** digits))
            if v not in used:
                used.add(v)
                return v

    @staticmethod
    def rand_var(rng, used):
        while True:
            v = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
            if v not in used:
                used.add(v)
                return v

    # ---- assembly ----
    def _needle_text(self, haystack: str, sentence: str) -> str:
        # Essay needles sit between sentences (leading space); noise needles are lines.
        return (" " if haystack == "essay" else "\n") + sentence

    def _insert(self, rng, hay: list, needles: list, ordered: bool):
        """Inserts needle pieces between haystack pieces at random depths. Returns pieces and
        each needle's depth (fraction of haystack tokens before it)."""
        n = len(hay)
        slots = [rng.randint(0, n) for _ in needles]
        if ordered:
            slots.sort()
        order = sorted(range(len(needles)), key=lambda i: (slots[i], i))
        cum = [0]
        for p in hay:
            cum.append(cum[-1] + len(p.ids))
        total = max(cum[-1], 1)
        out, depths = [], [0.0] * len(needles)
        k = 0
        for pos in range(n + 1):
            while k < len(order) and slots[order[k]] == pos:
                out.append(needles[order[k]])
                depths[order[k]] = cum[pos] / total
                k += 1
            if pos < n:
                out.append(hay[pos])
        return out, depths, order

    def make_sample(self, rng: random.Random, task: str, length: int, haystack: str = "essay",
                    num_distractors: int = 3, num_values: int = 4, num_queries: int = 4,
                    num_chains: int = 1, num_hops: int = 4, text: bool = False,
                    copies: int = 0) -> Sample:
        """`copies` > 0 (training only) repeats up to that many random haystack spans later in
        the haystack; their tokens (after the first two) are listed in Sample.aux_pos as dense
        copy targets that teach the model induction (find the earlier occurrence, continue)."""
        used: set = set()
        if task == "vt":
            return self._make_vt(rng, length, haystack, num_chains, num_hops, text, copies)
        needles, outputs = [], []
        if task == "niah_single":
            keys = [self.rand_key(rng, used)]
            vals = [[self.rand_number(rng, used)]]
            tmpl = TEMPLATES["niah_single"]
        elif task == "niah_multikey":
            keys = [self.rand_key(rng, used) for _ in range(1 + num_distractors)]
            vals = [[self.rand_number(rng, used)] for _ in keys]
            tmpl = TEMPLATES["niah_single"]
        elif task == "niah_multivalue":
            keys = [self.rand_key(rng, used)]
            vals = [[self.rand_number(rng, used) for _ in range(num_values)]]
            tmpl = TEMPLATES["niah_multi"]
        elif task == "niah_multiquery":
            keys = [self.rand_key(rng, used) for _ in range(num_queries)]
            vals = [[self.rand_number(rng, used)] for _ in keys]
            tmpl = TEMPLATES["niah_multi"]
        else:
            raise ValueError(f"unknown task {task!r}; tasks: {TASKS}")
        for k, vs in zip(keys, vals):
            for v in vs:
                needles.append(self.piece(self._needle_text(
                    haystack, f"One of the special magic numbers for {k} is: {v}.")))
        if task == "niah_multiquery":
            query = ", ".join(keys[:-1]) + ", and " + keys[-1] if len(keys) > 2 else \
                " and ".join(keys)
            query_keys = keys
        else:
            query = keys[0]
            query_keys = keys[:1]
        head = self.piece(tmpl[0])
        question = self.piece(tmpl[1].format(query=query))
        prefix = self.piece(tmpl[2].format(query=query))
        # The answer: values in order of appearance (multivalue) or of the query (multiquery).
        hay_budget_fn = lambda ans_len: (length - 6 - len(head.ids) - len(question.ids) -
                                         len(prefix.ids) - ans_len -
                                         sum(len(p.ids) for p in needles))
        if task == "niah_multivalue":
            # Provisional answer length (the order is known only after insertion).
            ans_len = len(self.enc(" " + ", ".join(vals[0]) + "."))
        else:
            outs = [vals[keys.index(k)][0] for k in query_keys]
            ans_len = len(self.enc(" " + ", ".join(outs) + "."))
        budget = hay_budget_fn(ans_len)
        if budget < 0:
            raise ValueError(f"length {length} too short for task {task}")
        hay = self._haystack(rng, haystack, budget, copies)
        body, depths, order = self._insert(rng, hay, needles, ordered=False)
        if task == "niah_multivalue":
            outputs = [vals[0][i] for i in order]
        elif task == "niah_multikey":
            outputs = [vals[0][0]]
            depths = depths[:1]
        else:
            outputs = [vals[keys.index(k)][0] for k in query_keys]
        answer = " " + ", ".join(outputs) + "."
        body = self._join_head("\n", body)
        return self._finish(task, [head] + body + [question], prefix, answer, outputs, length,
                            depths, text, dict(haystack=haystack, keys=keys))

    def _haystack(self, rng, haystack: str, budget: int, copies: int) -> list:
        if haystack != "essay":
            return self.hay.noise_pieces(budget)
        if not copies:
            return self.hay.essay_pieces(rng, budget)
        hay = self.hay.essay_pieces(rng, budget - budget // 5)
        total = sum(len(p.ids) for p in hay)
        for _ in range(copies):
            if len(hay) < 3:
                break
            i = rng.randrange(len(hay) - 1)
            src = hay[i:i + rng.randint(1, 2)]
            n = sum(len(p.ids) for p in src)
            if total + n > budget:
                continue
            j = rng.randint(i + len(src), len(hay))
            hay = hay[:j] + [Piece(p.text, p.ids, aux=True) for p in src] + hay[j:]
            total += n
        return hay

    def _make_vt(self, rng, length, haystack, num_chains, num_hops, text, copies=0) -> Sample:
        used_vars: set = set()
        used_vals: set = set()
        chains = []
        for _ in range(num_chains):
            names = [self.rand_var(rng, used_vars) for _ in range(num_hops + 1)]
            value = self.rand_number(rng, used_vals, digits=5)
            lines = [f"VAR {names[0]} = {value}"] + [
                f"VAR {names[i + 1]} = VAR {names[i]}" for i in range(num_hops)]
            chains.append((names, value, lines))
        ask = rng.randrange(num_chains)
        names, value, _ = chains[ask]
        head = self.piece(TEMPLATES["vt"][0])
        question = self.piece(TEMPLATES["vt"][1].format(query=value))
        prefix = self.piece(TEMPLATES["vt"][2].format(query=value, n=len(names)))
        answer = " " + " ".join(names)
        needles = []
        for _, _, lines in chains:
            needles.append([self.piece(self._needle_text(haystack, ln)) for ln in lines])
        budget = (length - 6 - len(head.ids) - len(question.ids) - len(prefix.ids) -
                  len(self.enc(answer)) - sum(len(p.ids) for ch in needles for p in ch))
        if budget < 0:
            raise ValueError(f"length {length} too short for task vt")
        hay = self._haystack(rng, haystack, budget, copies)
        # Each chain's lines appear in chain order; chains interleave.
        flat = [p for ch in needles for p in ch]
        slots = sorted(rng.randint(0, len(hay)) for _ in flat)
        # Assign sorted slots so each chain keeps its order: shuffle which chain takes each slot.
        owners = [c for c, ch in enumerate(needles) for _ in ch]
        rng.shuffle(owners)
        next_line = [0] * len(needles)
        placed = []
        for s, c in zip(slots, owners):
            placed.append((s, needles[c][next_line[c]], c))
            next_line[c] += 1
        body, depths = [], []
        cum = 0
        total = max(sum(len(p.ids) for p in hay), 1)
        k = 0
        for pos in range(len(hay) + 1):
            while k < len(placed) and placed[k][0] == pos:
                body.append(placed[k][1])
                if placed[k][2] == ask:
                    depths.append(cum / total)
                k += 1
            if pos < len(hay):
                body.append(hay[pos])
                cum += len(hay[pos].ids)
        body = self._join_head("\n\n", body)
        return self._finish("vt", [head] + body + [question], prefix, answer, names, length,
                            depths, text, dict(haystack=haystack, value=value))

    def _join_head(self, sep: str, body: list) -> list:
        """The context starts after `sep` (a newline or two): the separator and the first body
        piece (without its leading space) are tokenized together, so a run of whitespace is
        never split across pieces."""
        if not body:
            return [self.piece(sep)]
        first = body[0].text.lstrip(" ")
        if first.startswith("\n"):
            first = first[1:]
        return [Piece(sep + first, self.tok.encode(sep + first))] + body[1:]

    def _finish(self, task, pieces, prefix, answer, outputs, length, depths, text, meta):
        ids = [i for p in pieces for i in p.ids] + prefix.ids
        aux_pos, off = [], 0
        for p in pieces:
            if p.aux:
                aux_pos.extend(range(off + 2, off + len(p.ids)))
            off += len(p.ids)
        s = Sample(aux_pos=aux_pos, task=task, ids=ids, answer_ids=self.enc(answer), outputs=outputs,
                   answer=answer, length=length, depths=depths, n_prefix=len(prefix.ids),
                   meta=meta)
        if text:
            s.input = "".join(p.text for p in pieces)
            s.answer_prefix = prefix.text
            s.text = s.input + s.answer_prefix
        return s


def sample_to_json(s: Sample, index: int, seed: int) -> dict:
    """The JSONL record (RULER's fields + ours)."""
    return {"index": index, "seed": seed, "task": s.task, "input": s.input,
            "answer_prefix": s.answer_prefix, "outputs": s.outputs, "answer": s.answer,
            "length": s.length, "num_prompt_tokens": len(s.ids) + 1, "depths": s.depths,
            "haystack": s.meta.get("haystack")}


def eval_rng(seed: int, task: str, length: int, index: int) -> random.Random:
    return random.Random(f"eval/{seed}/{task}/{length}/{index}")


def self_test(gen: Generator, n: int = 3, lengths=(512, 4096)) -> None:
    """ids(sample) must equal encode(text(sample)), and lengths must fit."""
    for task in TASKS:
        for length in lengths:
            for i in range(n):
                for hs in ("essay", "noise"):
                    rng = random.Random(f"selftest/{task}/{length}/{i}/{hs}")
                    s = gen.make_sample(rng, task, length, text=True,
                                        **{**EVAL_SETTINGS[task], "haystack": hs})
                    assert gen.tok.encode(s.text) == s.ids, (task, length, i, hs)
                    assert gen.tok.encode(s.text + s.answer) == s.ids + s.answer_ids, (task, i)
                    total = 1 + len(s.ids) + len(s.answer_ids) + 1
                    assert total <= length, (task, length, total)
                    assert total >= length * 0.9 or length < 1024, (task, length, total)
                    for o in s.outputs:
                        assert o in s.answer and o in s.input, (task, o)
                    if hs == "noise":  # every needle is a line of its own
                        assert not re.search(r"[0-9.][A-Za-z]", s.input.split("\n", 1)[1]), \
                            (task, length, i)


def main() -> None:
    import argparse
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="Writes RULER-style samples as JSONL to stdout.")
    ap.add_argument("--tokenizer", default=os.path.join(here, "../../models/needle/tokenizer.json"))
    ap.add_argument("--essays", default=os.path.join(here, "../../../shared/data/PaulGrahamEssays.json"))
    ap.add_argument("--task", choices=TASKS, required=True)
    ap.add_argument("--length", type=int, required=True,
                    help="target tokens: BOS + prompt + answer + EOS <= length")
    ap.add_argument("--num", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--haystack", choices=["essay", "noise"], default=None,
                    help="default: RULER's choice for the task")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--print-prompt", action="store_true",
                    help="print sample 0's prompt text (input + answer_prefix) instead of JSONL; "
                         "its expected answer goes to stderr")
    args = ap.parse_args()
    gen = Generator(ByteLevelBPE.from_file(args.tokenizer), args.essays)
    if args.self_test:
        self_test(gen)
        print("self-test ok", file=sys.stderr)
    settings = dict(EVAL_SETTINGS[args.task])
    if args.haystack:
        settings["haystack"] = args.haystack
    if args.print_prompt:
        s = gen.make_sample(eval_rng(args.seed, args.task, args.length, 0), args.task,
                            args.length, text=True, **settings)
        sys.stdout.write(s.text)
        print(f"expected answer: {s.answer!r} ({len(s.ids) + 1} prompt tokens with BOS)",
              file=sys.stderr)
        return
    for i in range(args.num):
        s = gen.make_sample(eval_rng(args.seed, args.task, args.length, i), args.task,
                            args.length, text=True, **settings)
        print(json.dumps(sample_to_json(s, i, args.seed)))


if __name__ == "__main__":
    main()
