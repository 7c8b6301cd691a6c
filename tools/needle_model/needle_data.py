"""RULER-style synthetic retrieval tasks, built at the token level (pure standard-library Python).

Tasks (prompts follow RULER's `base` templates; see README.md for the exact text):
  niah_single      one needle "One of the special magic numbers for {key} is: {value}."
  niah_multikey    the needle plus distractor needles with other keys
  niah_multivalue  several needles with the same key; the answer lists all values
  niah_multiquery  several keys asked at once; the answer lists one value per key, in order
  vt               variable tracking: "VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE", ...;
                   the answer lists every variable of the chain that holds the asked value

Values are 7-digit numbers, `adjective-noun` words or UUIDs (`value_kind`; the templates then
say "number", "word" or "uuid" as RULER's do); keys are `adjective-noun` words or UUIDs
(`key_kind`). RULER's task variants are named presets of these settings (`VARIANTS`):
niah_single_1/2/3 and niah_multikey_1/2/3 as RULER's synthetic.yaml defines them, and
niah_single_word (word values).

A sample is a prompt (instructions, haystack with needles, question, answer prefix) and an
answer. Haystacks: Paul Graham essay sentences ("essay": consecutive sentences from a random
start, whitespace collapsed), RULER's repeated noise line ("noise"), lines that are all needles
with other keys ("needle", RULER's niah_multikey_2/3) or prose generated from a grammar and word
lists of its own ("heldout": text no training sample contains, for evaluation only). Every piece
of text (sentence, needle, template part) is tokenized once and pieces are joined only where
the GPT-2 pre-tokenizer splits anyway, so ids(sample) == encode(text(sample)) (checked by
`needle_self_test.py`) while a 64K-token sample costs list concatenation, not tokenization.

Everything is a function of (seed, index): `make_sample(rng=random.Random(...))`.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import re
import uuid
from collections import Counter
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

VALUE_KINDS = ("number", "word", "uuid")
KEY_KINDS = ("word", "uuid")
# Word keys (and word values) from the built-in lists above ("basic", RULER-like adjective-noun
# pairs) or from words of the essays ("wide": thousands of words, so a model trained on both
# meets key words it has not seen as keys, as RULER's own samples have).
KEY_WORDS = ("basic", "wide")
HAYSTACKS = ("essay", "noise", "needle", "heldout")

# What make_sample does when neither the caller nor the task's variant says otherwise.
SAMPLE_DEFAULTS = dict(haystack="essay", num_distractors=3, num_values=4, num_queries=4,
                       num_chains=1, num_hops=4, value_kind="number", key_kind="word",
                       key_words="basic")

# RULER's niah variants (RULER's scripts/synthetic.yaml: haystack, key and value types, needle
# counts) and a word-value one: name -> (task, settings). A sample made for a variant carries
# the variant's name as its task.
VARIANTS = {
    "niah_single_1": ("niah_single", dict(haystack="noise")),
    "niah_single_2": ("niah_single", dict(haystack="essay")),
    "niah_single_3": ("niah_single", dict(haystack="essay", value_kind="uuid")),
    "niah_single_word": ("niah_single", dict(haystack="essay", value_kind="word")),
    "niah_multikey_1": ("niah_multikey", dict(haystack="essay", num_distractors=3)),
    # "many keys everywhere": every haystack line is a needle with another key.
    "niah_multikey_2": ("niah_multikey", dict(haystack="needle", num_distractors=0)),
    "niah_multikey_3": ("niah_multikey", dict(haystack="needle", num_distractors=0,
                                              key_kind="uuid", value_kind="uuid")),
}

# RULER's standard settings, used for evaluation (the variants: their own settings).
EVAL_SETTINGS = {
    "niah_single": dict(haystack="essay"),
    "niah_multikey": dict(haystack="essay", num_distractors=3),
    "niah_multivalue": dict(haystack="essay", num_values=4),
    "niah_multiquery": dict(haystack="essay", num_queries=4),
    "vt": dict(haystack="noise", num_chains=1, num_hops=4),
    **{name: dict(settings) for name, (_, settings) in VARIANTS.items()},
}


def resolve_task(name: str) -> tuple:
    """'task' or 'task@haystack' -> (task name, evaluation settings): the task's RULER
    settings, with the haystack replaced when one is named (e.g. 'niah_multikey_1@heldout')."""
    task, _, haystack = name.partition("@")
    if task not in EVAL_SETTINGS:
        raise ValueError(f"unknown task {task!r}; tasks: {list(EVAL_SETTINGS)}")
    settings = dict(EVAL_SETTINGS[task])
    if haystack:
        if haystack not in HAYSTACKS:
            raise ValueError(f"unknown haystack {haystack!r}; haystacks: {HAYSTACKS}")
        settings["haystack"] = haystack
    return task, settings


def kind_templates(family: str, kind: str) -> tuple:
    """RULER's templates for a value kind: 'number' -> 'word' / 'uuid' ('numbers' -> 'uuids')."""
    return tuple(t.replace("number", kind) for t in TEMPLATES[family])


def needle_sentence(key: str, value: str, kind: str) -> str:
    return f"One of the special magic {kind}s for {key} is: {value}."


# The held-out haystack: sentences from this grammar, whose words are in neither built-in key
# list (self_test checks it) and about half of which the essays never use. Training never draws
# it, so its scores show whether the model retrieves needles from text it has never seen rather
# than from the essays it was trained on.
PROSE_NAMES = (
    "Ada Bruno Clara Dmitri Elena Farid Greta Hugo Ines Jonas Kenji Lena Marco Nadia Oskar Priya "
    "Rosa Stefan Tomas Uma Viktor Wanda Yusuf Zora Alma Boris Celia Dario Edith Felix").split()
PROSE_NOUNS = (
    "ferry lantern harvest ledger cart barrel chimney quilt parcel workshop mill tavern balcony "
    "attic cellar porch notebook saucepan teapot wheelbarrow fiddle gallery library museum stable "
    "carpenter shepherd fisherman weaver tailor mason miller merchant clerk courier nurse farmer "
    "gardener neighbor stranger cook captain mayor widow orphan student letterbox stairway "
    "clock kettledrum sack rope ladle barn fountainhead orchestra envelope postcard suitcase "
    "umbrella cabinet cupboard wardrobe bench gate roof wall garment sweater scarf boot").split()
PROSE_PLACES = (
    "square courtyard granary vineyard quarry marketplace riverbank hillside crossroads "
    "lighthouse chapel schoolyard railway depot inn bakery dock pier cemetery farmhouse").split()
PROSE_ADJECTIVES = (
    "crowded distant dusty faded patient rusty sleepy sunny windy muddy ancient careless cheerful "
    "chilly cozy dim elderly foggy frozen gloomy hasty idle lofty misty modest noble pale quaint "
    "restless rural shabby sturdy tangled velvet weary woolen wrinkled crooked bumpy").split()
PROSE_VERBS = (
    "carried visited repaired collected followed noticed polished borrowed ordered watched "
    "cleaned opened counted measured delivered packed washed moved planted painted guarded "
    "mended locked fetched sorted traded").split()
PROSE_ADVERBS = (
    "slowly quietly carefully eagerly patiently briskly gladly rarely often suddenly again "
    "twice proudly nervously").split()
PROSE_TIMES = (
    "at dawn|before noon|after supper|on Sunday|every autumn|that evening|the next morning|"
    "in the spring|after the rain|at midnight|before the festival|during the harvest").split("|")
# {R} a name, {N} a noun, {P} a place, {A} an adjective, {V} a verb, {D} an adverb, {T} a time
# ({Tc} capitalized); "{a}" is the article of the word after it.
PROSE_SENTENCES = (
    "{R} {V} the {A} {N} {T}.",
    "The {N} {V} {a} {A} {N} near the {P}.",
    "{Tc}, {R} {V} the {N} and {V} it {D}.",
    "Nobody in the {P} remembered who had {V} the {N}.",
    "The {A} {N} stood beside the {P} for many years.",
    "{R} and {R} {V} the {N} {D}.",
    "Later, the {N} was {V} by {R}.",
    "It was {A} at the {P} {T}, and the {N} looked {A}.",
    "{R} once said that the {N} of the {P} was {A}.",
    "Everyone {V} the {A} {N} {D}.",
    "{A_cap} and {A}, the {N} {V} the {N} while {R} waited.",
    "At the {P}, {a} {A} {N} was {V} {T}.",
)


def rand_uuid(rng: random.Random) -> str:
    """A version-4 UUID from the sample's rng, as RULER makes them."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


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
    """Pre-tokenized haystack sentences with prefix sums for O(log n) slicing, the essays' word
    list for "wide" keys, and the held-out prose grammar."""

    def __init__(self, tok: ByteLevelBPE, essays_path: str, essays_text: str | None = None):
        self.tok = tok
        self.essays_path = essays_path
        self.essays_text = essays_text  # the corpus itself (synthetic_essays), else read the path
        # Every noise line starts with its newline (the context's first loses it in _join_head).
        self.noise_line = Piece("\n" + NOISE_LINE, tok.encode("\n" + NOISE_LINE))
        slots = {"R": PROSE_NAMES, "N": PROSE_NOUNS, "P": PROSE_PLACES, "A": PROSE_ADJECTIVES,
                 "A_cap": [w.capitalize() for w in PROSE_ADJECTIVES], "V": PROSE_VERBS,
                 "D": PROSE_ADVERBS, "T": PROSE_TIMES,
                 "Tc": [t[0].upper() + t[1:] for t in PROSE_TIMES]}
        # Each sentence template as [literal, slot, literal, slot, ..., literal].
        self.prose_slots = slots
        self.prose_templates = [re.split(r"\{(\w+)\}", t) for t in PROSE_SENTENCES]
        self._essays = None

    def _essay_state(self):
        """The essay sentences, their prefix sums and the "wide" key words, read on first use:
        the noise and held-out haystacks need no essay file (a fresh clone has none)."""
        if self._essays is not None:
            return self._essays
        if self.essays_text is not None:
            text = sanitize(self.essays_text)
        elif not os.path.exists(self.essays_path):
            raise FileNotFoundError(
                f"the essay haystack needs Paul Graham's essays as JSON ({{'text': ...}}) at "
                f"'{self.essays_path}' (--essays PATH); --haystack noise or heldout needs no file")
        else:
            with open(self.essays_path, encoding="utf-8") as f:
                text = sanitize(json.load(f)["text"])
        text = re.sub(r"\s+", " ", text).strip()
        # Split after sentence punctuation; every sentence but the first starts with one space.
        sentences = re.split(r"(?<=[.!?])(?= [A-Z\"'(])", text)
        # Every piece starts with a space, the corpus' first sentence too, so a needle or a
        # question can precede any of them.
        sentences = [s if s.startswith(" ") else " " + s for s in sentences if s.strip()]
        essay = [Piece(s, self.tok.encode(s)) for s in sentences]
        essay_cum = [0]
        for p in essay:
            essay_cum.append(essay_cum[-1] + len(p.ids))
        # Lower-case words of 4-10 letters that occur at least 3 times (sorted: a fixed list).
        counts = Counter(re.findall(r"(?<![A-Za-z'-])[a-z]{4,10}(?![A-Za-z'-])", text))
        template_words = {"special", "magic", "number", "numbers", "word", "words", "uuid"}
        wide_words = sorted(w for w, c in counts.items() if c >= 3 and w not in template_words)
        self._essays = (essay, essay_cum, wide_words)
        return self._essays

    @property
    def essay(self) -> list:
        return self._essay_state()[0]

    @property
    def essay_cum(self) -> list:
        return self._essay_state()[1]

    @property
    def wide_words(self) -> list:
        return self._essay_state()[2]

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

    def prose_sentence(self, rng: random.Random) -> Piece:
        """One held-out sentence (with its leading space)."""
        text = self.prose_text(rng)
        return Piece(text, self.tok.encode(text))

    def prose_text(self, rng: random.Random) -> str:
        """One held-out sentence's text (with its leading space)."""
        parts = rng.choice(self.prose_templates)
        out, article_at = [], None
        for i, part in enumerate(parts):
            if i % 2 == 0:
                out.append(part)
            elif part == "a":  # decided by the next word
                article_at = len(out)
                out.append("")
            else:
                word = rng.choice(self.prose_slots[part])
                if article_at is not None:
                    out[article_at] = "an" if word[0] in "aeiou" else "a"
                    article_at = None
                out.append(word)
        return " " + "".join(out)

    def prose_pieces(self, rng: random.Random, budget: int) -> list:
        """Held-out sentences, at most `budget` tokens."""
        out, total = [], 0
        while True:
            p = self.prose_sentence(rng)
            if total + len(p.ids) > budget:
                return out
            out.append(p)
            total += len(p.ids)


def synthetic_essays(tok: ByteLevelBPE, sentences: int = 4000, seed: str = "synthetic") -> str:
    """A stand-in for the essay corpus: held-out prose sentences, for the checks that hold for any
    corpus (ids equal a fresh encode, lengths, needle placement) where the essays are absent (a
    fresh clone; the essays are evaluation data the repository may not hold)."""
    hay, rng = Haystacks(tok, ""), random.Random(seed)
    return "".join(hay.prose_text(rng) for _ in range(sentences)).strip()


class Generator:
    def __init__(self, tok: ByteLevelBPE, essays_path: str, essays_text: str | None = None):
        self.tok = tok
        self.hay = Haystacks(tok, essays_path, essays_text)
        self._enc_cache: dict[str, list] = {}

    def enc(self, text: str) -> list:
        """Token ids of a text that recurs (a template part), cached."""
        got = self._enc_cache.get(text)
        if got is None:
            got = self.tok.encode(text)
            if len(self._enc_cache) < 200000:
                self._enc_cache[text] = got
        return got

    def enc_once(self, text: str) -> list:
        """Token ids of a text holding random keys or values (no cache grows with it)."""
        return self.tok.encode(text, store=False)

    def piece(self, text: str) -> Piece:
        return Piece(text, self.enc(text))

    def piece_once(self, text: str) -> Piece:
        return Piece(text, self.enc_once(text))

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

    def rand_word(self, rng, used, words: str) -> str:
        """An `adjective-noun` pair ("basic") or a pair of essay words ("wide"), unused."""
        if words == "basic":
            return self.rand_key(rng, used)
        pool = self.hay.wide_words
        while True:
            w = f"{rng.choice(pool)}-{rng.choice(pool)}"
            if w not in used:
                used.add(w)
                return w

    @staticmethod
    def rand_uuid(rng, used) -> str:
        while True:
            v = rand_uuid(rng)
            if v not in used:
                used.add(v)
                return v

    def rand_of_kind(self, rng, used, kind: str, words: str) -> str:
        """A key or value of `kind`: number (7 digits), word or uuid."""
        if kind == "number":
            return self.rand_number(rng, used)
        if kind == "word":
            return self.rand_word(rng, used, words)
        return self.rand_uuid(rng, used)

    # ---- assembly ----
    def _needle_text(self, haystack: str, sentence: str) -> str:
        # Needles in prose sit between sentences (leading space); elsewhere they are lines.
        return (" " if haystack in ("essay", "heldout") else "\n") + sentence

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

    def make_sample(self, rng: random.Random, task: str, length: int,
                    haystack: str | None = None, num_distractors: int | None = None,
                    num_values: int | None = None, num_queries: int | None = None,
                    num_chains: int | None = None, num_hops: int | None = None,
                    value_kind: str | None = None, key_kind: str | None = None,
                    key_words: str | None = None, text: bool = False,
                    copies: int = 0) -> Sample:
        """One sample of `task` (a base task or a VARIANTS name). Settings left None come from
        the variant, then SAMPLE_DEFAULTS. `copies` > 0 (training only) repeats up to that many
        random haystack spans later in the haystack; their tokens (after the first two) are
        listed in Sample.aux_pos as dense copy targets that teach the model induction (find the
        earlier occurrence, continue)."""
        base, preset = VARIANTS.get(task, (task, {}))
        given = dict(haystack=haystack, num_distractors=num_distractors, num_values=num_values,
                     num_queries=num_queries, num_chains=num_chains, num_hops=num_hops,
                     value_kind=value_kind, key_kind=key_kind, key_words=key_words)
        c = {**SAMPLE_DEFAULTS, **preset, **{k: v for k, v in given.items() if v is not None}}
        if base not in TASKS:
            raise ValueError(f"unknown task {task!r}; tasks: {TASKS + list(VARIANTS)}")
        for name, allowed in (("haystack", HAYSTACKS), ("value_kind", VALUE_KINDS),
                              ("key_kind", KEY_KINDS), ("key_words", KEY_WORDS)):
            if c[name] not in allowed:
                raise ValueError(f"{name} {c[name]!r} is not one of {allowed}")
        if base == "vt":
            if c["haystack"] == "needle":
                raise ValueError("vt has no needle haystack")
            s = self._make_vt(rng, length, c["haystack"], c["num_chains"], c["num_hops"], text,
                              copies)
        else:
            s = self._make_niah(rng, base, length, c, text, copies)
        s.task = task
        return s

    def _make_niah(self, rng, task: str, length: int, c: dict, text: bool, copies: int) -> Sample:
        haystack, kind = c["haystack"], c["value_kind"]
        used: set = set()

        def new_key():
            return self.rand_of_kind(rng, used, c["key_kind"], c["key_words"])

        def new_value():
            return self.rand_of_kind(rng, used, kind, c["key_words"])

        if task == "niah_single":
            keys = [new_key()]
            vals = [[new_value()]]
            family = "niah_single"
        elif task == "niah_multikey":
            keys = [new_key() for _ in range(1 + c["num_distractors"])]
            vals = [[new_value()] for _ in keys]
            family = "niah_single"
        elif task == "niah_multivalue":
            keys = [new_key()]
            vals = [[new_value() for _ in range(c["num_values"])]]
            family = "niah_multi"
        else:  # niah_multiquery
            keys = [new_key() for _ in range(c["num_queries"])]
            vals = [[new_value()] for _ in keys]
            family = "niah_multi"
        tmpl = kind_templates(family, kind)
        needles = [self.piece_once(self._needle_text(haystack, needle_sentence(k, v, kind)))
                   for k, vs in zip(keys, vals) for v in vs]
        if task == "niah_multiquery":
            query = ", ".join(keys[:-1]) + ", and " + keys[-1] if len(keys) > 2 else \
                " and ".join(keys)
            query_keys = keys
        else:
            query = keys[0]
            query_keys = keys[:1]
        head = self.piece(tmpl[0])
        question = self.piece_once(tmpl[1].format(query=query))
        prefix = self.piece_once(tmpl[2].format(query=query))
        # The answer: values in order of appearance (multivalue) or of the query (multiquery).
        if task == "niah_multivalue":
            # Provisional answer length (the order is known only after insertion).
            ans_len = len(self.enc_once(" " + ", ".join(vals[0]) + "."))
        else:
            outs = [vals[keys.index(k)][0] for k in query_keys]
            ans_len = len(self.enc_once(" " + ", ".join(outs) + "."))
        budget = (length - 6 - len(head.ids) - len(question.ids) - len(prefix.ids) - ans_len -
                  sum(len(p.ids) for p in needles))
        if budget < 0:
            raise ValueError(f"length {length} too short for task {task}")
        if haystack == "needle":
            hay = self._needle_lines(rng, budget, used, new_key, new_value, kind)
        else:
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
        meta = dict(haystack=haystack, keys=keys, value_kind=kind, key_kind=c["key_kind"])
        return self._finish(task, [head] + body + [question], prefix, answer, outputs, length,
                            depths, text, meta)

    def _needle_lines(self, rng, budget: int, used: set, new_key, new_value, kind: str) -> list:
        """RULER's "needle" haystack: lines that are needles of other keys, up to `budget`."""
        out, total = [], 0
        while True:
            p = self.piece_once("\n" + needle_sentence(new_key(), new_value(), kind))
            if total + len(p.ids) > budget:
                return out
            out.append(p)
            total += len(p.ids)

    def _haystack(self, rng, haystack: str, budget: int, copies: int) -> list:
        if haystack == "noise":
            return self.hay.noise_pieces(budget)
        if haystack == "heldout":
            return self.hay.prose_pieces(rng, budget)
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
        question = self.piece_once(TEMPLATES["vt"][1].format(query=value))
        prefix = self.piece_once(TEMPLATES["vt"][2].format(query=value, n=len(names)))
        answer = " " + " ".join(names)
        needles = []
        for _, _, lines in chains:
            needles.append([self.piece_once(self._needle_text(haystack, ln)) for ln in lines])
        budget = (length - 6 - len(head.ids) - len(question.ids) - len(prefix.ids) -
                  len(self.enc_once(answer)) - sum(len(p.ids) for ch in needles for p in ch))
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
        return [Piece(sep + first, self.enc_once(sep + first))] + body[1:]

    def _finish(self, task, pieces, prefix, answer, outputs, length, depths, text, meta):
        ids = [i for p in pieces for i in p.ids] + prefix.ids
        aux_pos, off = [], 0
        for p in pieces:
            if p.aux:
                aux_pos.extend(range(off + 2, off + len(p.ids)))
            off += len(p.ids)
        s = Sample(aux_pos=aux_pos, task=task, ids=ids, answer_ids=self.enc_once(answer),
                   outputs=outputs, answer=answer, length=length, depths=depths,
                   n_prefix=len(prefix.ids), meta=meta)
        if text:
            s.input = "".join(p.text for p in pieces)
            s.answer_prefix = prefix.text
            s.text = s.input + s.answer_prefix
        return s



def sample_to_json(s: Sample, index: int, seed: int) -> dict:
    """The JSONL record (RULER's fields + ours)."""
    rec = {"index": index, "seed": seed, "task": s.task, "input": s.input,
           "answer_prefix": s.answer_prefix, "outputs": s.outputs, "answer": s.answer,
           "length": s.length, "num_prompt_tokens": len(s.ids) + 1, "depths": s.depths,
           "haystack": s.meta.get("haystack")}
    for k in ("value_kind", "key_kind"):  # niah tasks
        if k in s.meta:
            rec[k] = s.meta[k]
    return rec


def eval_rng(seed: int, task: str, length: int, index: int) -> random.Random:
    return random.Random(f"eval/{seed}/{task}/{length}/{index}")


def main() -> None:
    import argparse
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="Writes RULER-style samples as JSONL to stdout.")
    ap.add_argument("--tokenizer", default=os.path.join(here, "../../models/needle/tokenizer.json"))
    ap.add_argument("--essays", default=os.path.join(here, "../../../shared/data/PaulGrahamEssays.json"))
    ap.add_argument("--task", choices=TASKS + list(VARIANTS), required=True,
                    help="a task, or one of RULER's niah variants (and niah_single_word)")
    ap.add_argument("--length", type=int, required=True,
                    help="target tokens: BOS + prompt + answer + EOS <= length")
    ap.add_argument("--num", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--haystack", choices=HAYSTACKS, default=None,
                    help="default: RULER's choice for the task ('heldout': prose no training "
                         "sample uses)")
    ap.add_argument("--value-kind", choices=VALUE_KINDS, default=None,
                    help="default: the task's (number, except niah_single_3/word, multikey_3)")
    ap.add_argument("--key-kind", choices=KEY_KINDS, default=None,
                    help="default: the task's (word, except niah_multikey_3)")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--synthetic-essays", action="store_true",
                    help="the essay haystack from held-out prose instead of --essays (what the "
                         "self test checks without the essays; not for evaluation)")
    ap.add_argument("--print-prompt", action="store_true",
                    help="print sample 0's prompt text (input + answer_prefix) instead of JSONL; "
                         "its expected answer goes to stderr")
    args = ap.parse_args()
    tok = ByteLevelBPE.from_file(args.tokenizer)
    gen = Generator(tok, args.essays, synthetic_essays(tok) if args.synthetic_essays else None)
    if args.self_test:
        from needle_self_test import self_test
        self_test(gen, repo=os.path.join(here, "../.."), essays=not args.synthetic_essays)
        print("self-test ok", file=sys.stderr)
    settings = dict(EVAL_SETTINGS[args.task])
    for k in ("haystack", "value_kind", "key_kind"):
        if getattr(args, k) is not None:
            settings[k] = getattr(args, k)
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
