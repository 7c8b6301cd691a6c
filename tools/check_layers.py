#!/usr/bin/env python3
"""Checks that the code keeps the module graph docs/architecture.md declares.

1. The layer order: the fenced block after "Layer order" in docs/architecture.md lists the CMake
   modules bottom-up; every `longctx_module(NAME DIRS ... DEPS ...)` in CMakeLists.txt may depend
   only on modules listed below it (no back-edges, no cycles).
2. Includes follow the declared dependencies: each quoted #include of a module's sources (and of
   its public headers under include/longctx/) resolves to the module itself or to one of its
   transitive declared dependencies. CMake exports include/ and src/ to every module, so without
   this check an undeclared include would still build.
3. Production code reads no environment beyond the allowed variables (LONGCTX_LOG_LEVEL,
   LONGCTX_NUM_THREADS, LONGCTX_API_KEY): tuning is data passed to plan(), not getenv.
4. No sparse policy is chosen by comparing its name outside the option parser.

Prints each violation with file and line; exits 1 when there is one. Run from anywhere:
`python3 tools/check_layers.py [REPO]`; `--self-test` checks the checker on small made-up trees.
"""
import pathlib
import re
import shutil
import sys

ALLOWED_ENV = {"LONGCTX_LOG_LEVEL", "LONGCTX_NUM_THREADS", "LONGCTX_API_KEY"}
# Public headers whose folder is not named after the module that implements them.
HEADER_MODULE_OVERRIDES = {
    "longctx/llm.h": "engine",
    "longctx/attention/block_causal.h": "block_causal",
}
SOURCE_SUFFIXES = {".h", ".hpp", ".cuh", ".cpp", ".cu", ".inc"}
POLICY_NAMES = ("full", "quest", "xattention", "streaming")


def parse_modules(cmake_text):
    """{name: (dirs, deps)} from longctx_module(...) calls; deps keep only longctx_* targets."""
    modules = {}
    for m in re.finditer(r"longctx_module\(([^)]*)\)", cmake_text):
        words = m.group(1).split()
        name, section = words[0], None
        dirs, deps = [], []
        for w in words[1:]:
            if w in ("DIRS", "DEPS"):
                section = w
            elif section == "DIRS":
                dirs.append(w)
            elif section == "DEPS" and w.startswith("longctx_"):
                deps.append(w[len("longctx_"):])
        modules[name] = (dirs, deps)
    return modules


def parse_layer_order(doc_text):
    m = re.search(r"Layer order.*?```[^\n]*\n(.*?)```", doc_text, re.S)
    if not m:
        return None
    order = []
    for line in m.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            order.extend(w.strip(",") for w in line.split())
    return order


def closure(modules, name, seen=None):
    seen = set() if seen is None else seen
    for d in modules.get(name, ((), ()))[1]:
        if d not in seen:
            seen.add(d)
            closure(modules, d, seen)
    return seen


def check(repo):
    """The violations of the tree at `repo`, as printable lines, and (modules, files) counts."""
    errors = []
    modules = parse_modules((repo / "CMakeLists.txt").read_text())
    order = parse_layer_order((repo / "docs/architecture.md").read_text())
    if order is None:
        errors.append("docs/architecture.md: no fenced 'Layer order' block")
        order = []
    rank = {name: i for i, name in enumerate(order)}
    for name, (_, deps) in modules.items():
        if name not in rank:
            errors.append(f"CMakeLists.txt: module {name} is missing from the layer order")
            continue
        for d in deps:
            if d not in rank:
                errors.append(f"CMakeLists.txt: {name} depends on {d}, missing from the order")
            elif rank[d] >= rank[name]:
                errors.append(f"CMakeLists.txt: {name} depends on {d}, which is not below it")

    dir_module = {}
    for name, (dirs, _) in modules.items():
        for d in dirs:
            dir_module[d] = name

    def module_of_source(rel):  # rel: path under src/
        folder = str(pathlib.PurePosixPath(rel).parent)
        return dir_module.get(folder)

    def module_of_include(inc):
        if inc in HEADER_MODULE_OVERRIDES:
            return HEADER_MODULE_OVERRIDES[inc]
        if inc.startswith("longctx/"):
            sub = inc.split("/")[1]
            return dir_module.get(sub)
        if (repo / "src" / inc).exists():
            return module_of_source(inc)
        return None  # a system or third-party header, or a generated file

    files = []  # (path, module)
    for p in sorted((repo / "src").rglob("*")):
        if p.suffix in SOURCE_SUFFIXES and p.is_file():
            files.append((p, module_of_source(str(p.relative_to(repo / "src")))))
    for p in sorted((repo / "include/longctx").rglob("*")):
        if p.suffix in SOURCE_SUFFIXES and p.is_file():
            files.append((p, module_of_include(str(p.relative_to(repo / "include")))))

    include_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    getenv_re = re.compile(r'getenv\s*\(\s*"([A-Z0-9_]+)"\s*\)|getenv\s*\(\s*([A-Za-z_]\w*)\s*\)')
    names = "|".join(POLICY_NAMES)
    policy_re = re.compile(rf'(==|!=)\s*"({names})"|"({names})"\s*(==|!=)')
    for path, module in files:
        rel = path.relative_to(repo)
        if module is None:
            errors.append(f"{rel}: in no module's DIRS")
            continue
        allowed = {module} | closure(modules, module)
        text = path.read_text(errors="replace")
        for no, line in enumerate(text.splitlines(), 1):
            code = line.split("//", 1)[0]
            m = include_re.match(code)
            if m:
                target = module_of_include(m.group(1))
                if target is not None and target not in allowed:
                    errors.append(f"{rel}:{no}: module {module} includes {m.group(1)} of module "
                                  f"{target}, not among its dependencies")
            for g in getenv_re.finditer(code):
                var = g.group(1)
                if var is None or var not in ALLOWED_ENV:
                    errors.append(f"{rel}:{no}: getenv({var or g.group(2)}): production code "
                                  f"reads only {', '.join(sorted(ALLOWED_ENV))}")
            if policy_re.search(code) and "policy" in code:
                errors.append(f"{rel}:{no}: a sparse policy chosen by its name; parse the "
                              f"option once into its enum")

    return errors, len(modules), len(files)


def self_test():
    """Each kind of violation in a made-up two-module tree is found, and the clean tree passes."""
    import tempfile

    def tree(files):
        root = pathlib.Path(tempfile.mkdtemp())
        base = {
            "CMakeLists.txt": "longctx_module(low DIRS low DEPS Threads::Threads)\n"
                              "longctx_module(high DIRS high DEPS longctx_low)\n",
            "docs/architecture.md": "Layer order:\n\n```\nlow high\n```\n",
            "src/low/a.h": "#pragma once\n#include <vector>\n",
            "src/high/b.cpp": '#include "low/a.h"\n#include "high/b.h"\n',
            "src/high/b.h": "#pragma once\n",
        }
        base.update(files)
        for rel, text in base.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return root

    cases = {
        "clean": ({}, []),
        "back-edge include": ({"src/low/c.cpp": '#include "high/b.h"\n'}, ["module low includes"]),
        "back-edge dependency": (
            {"CMakeLists.txt": "longctx_module(low DIRS low DEPS longctx_high)\n"
                               "longctx_module(high DIRS high DEPS longctx_low)\n"},
            ["low depends on high"]),
        "unlisted module": ({"docs/architecture.md": "Layer order:\n\n```\nlow\n```\n"},
                            ["module high is missing"]),
        "getenv knob": ({"src/high/d.cpp": 'auto* e = std::getenv("LONGCTX_KNOB");\n'},
                        ["getenv(LONGCTX_KNOB)"]),
        "allowed getenv": ({"src/high/d.cpp": 'auto* e = std::getenv("LONGCTX_LOG_LEVEL");\n'},
                           []),
        "policy by name": ({"src/high/e.cpp": 'if (o.policy == "quest") f();\n'},
                           ["sparse policy chosen by its name"]),
        "file in no module": ({"src/other/f.cpp": "int f();\n"}, ["in no module"]),
    }
    failed = 0
    for name, (files, expected) in cases.items():
        root = tree(files)
        errors, _, _ = check(root)
        shutil.rmtree(root)
        ok = len(errors) == len(expected) and all(
            any(e in err for err in errors) for e in expected)
        if not ok:
            failed += 1
            print(f"self-test {name}: expected {expected}, got {errors}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[1])
    errors, num_modules, num_files = check(repo)
    for e in errors:
        print(e)
    print(f"check_layers: {num_modules} modules, {num_files} files, {len(errors)} violations")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
