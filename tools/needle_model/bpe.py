"""A small byte-level BPE tokenizer in pure standard-library Python.

It trains a GPT-2-style merge table, encodes/decodes text exactly as Hugging Face `tokenizers`
does for the `tokenizer.json` it writes (BPE model, ByteLevel pre-tokenizer with the GPT-2
regex, ByteLevel decoder), and writes that `tokenizer.json` + `tokenizer_config.json`.

Scope: the text this project feeds it is ASCII (see `sanitize`); on ASCII the regex below is
exactly the GPT-2 regex HF uses (`\\p{L}` = [A-Za-z], `\\p{N}` = [0-9]). Digits are never
merged (no merge contains a digit), so every digit is its own token: a 7-digit number is seven
tokens after the space token, which keeps "copy the number" a plain per-digit induction task.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

# GPT-2's pre-tokenizer regex on ASCII text.
PRETOKEN_RE = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>"]

_ASCII_MAP = {
    "\u2014": "--", "\x97": "--", "\u2013": "-", "\x96": "-", "\u2018": "'", "\u2019": "'",
    "\x92": "'", "\u201c": '"', "\u201d": '"', "\xa0": " ", "\u00e9": "e", "\u00e0": "a",
    "\u00f6": "o", "\u2248": "~", "\u00b2": "2", "\u27e8": "<", "\u27e9": ">",
}


def sanitize(text: str) -> str:
    """Maps text to printable ASCII plus newline (other characters dropped)."""
    out = []
    for ch in text:
        ch = _ASCII_MAP.get(ch, ch)
        if len(ch) == 1 and not (ch == "\n" or 32 <= ord(ch) < 127):
            continue
        out.append(ch)
    return "".join(out)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(
        range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def _to_symbols(pretoken: str) -> str:
    return "".join(BYTE_TO_CHAR[b] for b in pretoken.encode("utf-8"))


def train_bpe(texts, num_merges: int) -> list[tuple[str, str]]:
    """Learns up to num_merges merges from `texts` (deterministic: ties broken by the pair).

    Pairs with a digit on either side are never merged."""
    word_counts: Counter[str] = Counter()
    for text in texts:
        word_counts.update(PRETOKEN_RE.findall(text))
    words = [list(_to_symbols(w)) for w in sorted(word_counts)]
    freqs = [word_counts[w] for w in sorted(word_counts)]

    def mergeable(a: str, b: str) -> bool:
        return not any(ch.isdigit() for ch in a + b)

    pair_count: Counter[tuple[str, str]] = Counter()
    pair_words: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, sym in enumerate(words):
        for a, b in zip(sym, sym[1:]):
            if mergeable(a, b):
                pair_count[(a, b)] += freqs[i]
                pair_words[(a, b)].add(i)

    merges = []
    for _ in range(num_merges):
        if not pair_count:
            break
        best = max(pair_count.items(), key=lambda kv: (kv[1], kv[0]))
        if best[1] < 2:
            break
        pair = best[0]
        a, b = pair
        merged = a + b
        merges.append(pair)
        for i in list(pair_words[pair]):
            sym = words[i]
            f = freqs[i]
            # Remove this word's old pair counts, merge, add the new ones.
            for p in zip(sym, sym[1:]):
                if p in pair_count and mergeable(*p):
                    pair_count[p] -= f
                    if pair_count[p] <= 0:
                        del pair_count[p]
            j = 0
            out = []
            while j < len(sym):
                if j + 1 < len(sym) and sym[j] == a and sym[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(sym[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                if mergeable(*p):
                    pair_count[p] += f
                    pair_words[p].add(i)
        pair_count.pop(pair, None)
        pair_words.pop(pair, None)
    return merges


class ByteLevelBPE:
    """Encoder/decoder for a vocab + merges table (GPT-2 algorithm, as HF `tokenizers`)."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]],
                 special_tokens: dict[str, int]):
        self.vocab = vocab
        self.merges = merges
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.special_tokens = special_tokens
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.id_to_token.update({i: t for t, i in special_tokens.items()})
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_merges(cls, merges: list[tuple[str, str]], special: list[str] = SPECIAL_TOKENS):
        vocab = {}
        for b in range(256):
            vocab[BYTE_TO_CHAR[b]] = len(vocab)
        for a, b in merges:
            vocab[a + b] = len(vocab)
        specials = {s: len(vocab) + k for k, s in enumerate(special)}
        return cls(vocab, merges, specials)

    @classmethod
    def from_file(cls, path: str):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                  for m in j["model"]["merges"]]
        specials = {t["content"]: t["id"] for t in j["added_tokens"]}
        return cls(j["model"]["vocab"], merges, specials)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + len(self.special_tokens)

    def _bpe(self, symbols: str) -> list[int]:
        word = list(symbols)
        while len(word) > 1:
            best_rank, best_pair = None, None
            for p in zip(word, word[1:]):
                r = self.ranks.get(p)
                if r is not None and (best_rank is None or r < best_rank):
                    best_rank, best_pair = r, p
            if best_pair is None:
                break
            a, b = best_pair
            out = []
            j = 0
            while j < len(word):
                if j + 1 < len(word) and word[j] == a and word[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(word[j])
                    j += 1
            word = out
        return [self.vocab[s] for s in word]

    def encode(self, text: str, store: bool = True) -> list[int]:
        """Token ids of `text` (no special tokens added; special-token strings not parsed).

        Pre-tokens are cached; `store=False` reads the cache but adds nothing to it (for text
        made of one-off pieces such as random numbers and UUIDs, which would only grow it)."""
        ids: list[int] = []
        cache = self._cache
        for pre in PRETOKEN_RE.findall(text):
            got = cache.get(pre)
            if got is None:
                got = self._bpe(_to_symbols(pre))
                if store:
                    cache[pre] = got
            ids.extend(got)
        return ids

    def decode(self, ids) -> str:
        out = bytearray()
        parts = []
        for i in ids:
            tok = self.id_to_token[int(i)]
            if tok in self.special_tokens:
                parts.append(out.decode("utf-8", errors="replace"))
                parts.append(tok)
                out = bytearray()
            else:
                out.extend(CHAR_TO_BYTE[c] for c in tok)
        parts.append(out.decode("utf-8", errors="replace"))
        return "".join(parts)

    def save(self, out_dir: str, model_max_length: int) -> None:
        """Writes tokenizer.json and tokenizer_config.json into out_dir."""
        bos, eos, pad = SPECIAL_TOKENS
        added = [{"id": i, "content": t, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": True}
                 for t, i in sorted(self.special_tokens.items(), key=lambda kv: kv[1])]
        tok = {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [self.special_tokens[bos]],
                                         "tokens": [bos]}},
            },
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": self.vocab, "merges": [[a, b] for a, b in self.merges]},
        }
        with open(f"{out_dir}/tokenizer.json", "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, indent=1)
            f.write("\n")
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "pad_token": pad,
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length,
            "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"}
                                     for t in added},
            # A completion model: the prompt is the user's text verbatim after BOS (the task
            # prompt ends with its answer prefix, e.g. "... mentioned in the provided text is").
            "chat_template": ("{{ bos_token }}{% for message in messages %}"
                              "{% if message['role'] == 'user' %}{{ message['content'] }}"
                              "{% endif %}{% endfor %}"),
        }
        with open(f"{out_dir}/tokenizer_config.json", "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
