"""Writes the JSON schema `tool_choice: "required"` compiles for N tools (the server's shape:
anyOf over {"name": const, "arguments": the tool's parameters}), N agent-style tools with 2-6
typed parameters each (strings, enums, integers with ranges, booleans, arrays, a nested object):
  python3 bench/engine/make_tools_schema.py 50 > tools50.json
  longctx bench latency ... --json-schema tools50.json --num-warmup 0 --num-iters 1
(the first request's TTFT against an unconstrained run's is the grammar's compile time)."""

import json
import random
import sys


def parameters(rng: random.Random, i: int) -> dict:
    kinds = [
        {"type": "string"},
        {"type": "string", "enum": ["asc", "desc", "none"]},
        {"type": "integer", "minimum": 0, "maximum": 1000},
        {"type": "boolean"},
        {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        {"type": "object", "properties": {"path": {"type": "string"},
                                          "line": {"type": "integer", "minimum": 1}},
         "required": ["path"]},
        {"type": "number"},
    ]
    n = rng.randint(2, 6)
    props = {f"arg_{i}_{j}": rng.choice(kinds) for j in range(n)}
    required = sorted(rng.sample(list(props), rng.randint(1, n)))
    return {"type": "object", "properties": props, "required": required}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    rng = random.Random(0)
    choices = []
    for i in range(n):
        choices.append({"type": "object",
                        "properties": {"name": {"const": f"tool_{i:02d}"},
                                       "arguments": parameters(rng, i)},
                        "required": ["name", "arguments"], "additionalProperties": False})
    json.dump({"anyOf": choices}, sys.stdout)


if __name__ == "__main__":
    main()
