// Host time per decode step of constrained decoding at batch N, as the engine spends it: every
// row's grammar walks the token its last step took and fills its mask over the thread pool
// (fill_grammar_masks, while the device runs the forward), the masks are packed into one upload
// buffer as the GPU sampler packs them (pack_token_masks, over the pool; a serial copy is timed
// too, for reference), and once the tokens are sampled each row's grammar takes its token
// (GrammarMatcher::take: a mask lookup, the only grammar work between the sampled tokens and
// the next step's launch; the full accept() it replaced is timed too, for reference, on a copy).
// The token is drawn uniformly among the row's allowed ones, as a random-weight model samples,
// so grammar states keep changing and the mask cache sees realistic misses. A row whose
// document is complete (or whose budget ran out) starts a fresh one. Prints per batch size the
// mean milliseconds per step of the walk + fill (and the slowest step's: a new grammar state
// walks the whole vocabulary, and a fill longer than the forward delays the step), the packing,
// the takes and the accepts, and the cache's computed / found counts, twice: with the cache cold
// (a new schema) and warm (the same schema's next requests, as in `bench latency --json-schema`
// after its warm-up).
//   bench_structured --tokenizer DIR --json-schema FILE [--rows 1,16,64] [--steps 256]
//                    [--max-tokens 256] [--seed 0] [--warm-passes 1] [--slice-tokens 16384]
// More warm passes show how often a state is still met for the first time once the cache has
// seen the schema's earlier requests (the "computed" column of each pass). --slice-tokens as
// large as the vocabulary walks each new state on one thread (the engine's way before
// prepare_masks).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "engine/sampling_pack.h"
#include "longctx/core/json_limits.h"
#include "longctx/core/parallel.h"
#include "longctx/tokenizer/tokenizer.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"

namespace {

using namespace longctx;
using bench::now_seconds;
using bench::parse_list;
using structured::CompiledGrammar;
using structured::GrammarMatcher;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "bench_structured: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Row {
  std::unique_ptr<GrammarMatcher> matcher;
  int64_t generated = 0;
  std::vector<uint32_t> mask;
};

// A uniformly drawn set bit of the mask, or -1 when none is set.
int32_t draw(const std::vector<uint32_t>& mask, std::mt19937_64& rng) {
  int64_t count = 0;
  for (uint32_t w : mask) count += __builtin_popcount(w);
  if (count == 0) return -1;
  int64_t k = std::uniform_int_distribution<int64_t>(0, count - 1)(rng);
  for (size_t i = 0; i < mask.size(); ++i) {
    const int c = __builtin_popcount(mask[i]);
    if (k >= c) {
      k -= c;
      continue;
    }
    uint32_t w = mask[i];
    for (; k > 0; --k) w &= w - 1;
    return static_cast<int32_t>(i * 32 + __builtin_ctz(w));
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_dir, schema_path;
  std::vector<int64_t> batch_sizes = {1, 16, 64};
  int64_t steps = 256, max_tokens = 256, warm_passes = 1;
  int64_t slice_tokens = static_cast<int64_t>(structured::kMaskSliceTokens);
  uint64_t seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer"))
      tokenizer_dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--json-schema"))
      schema_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--rows"))
      batch_sizes = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-tokens"))
      max_tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--warm-passes"))
      warm_passes = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--slice-tokens"))
      slice_tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seed"))
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "bench_structured: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (tokenizer_dir.empty() || schema_path.empty()) {
    std::fprintf(stderr,
                 "usage: bench_structured --tokenizer DIR --json-schema FILE [--rows "
                 "1,16,64] [--steps 256] [--max-tokens 256] [--seed 0] [--warm-passes 1] "
                 "[--slice-tokens 16384]\n");
    return 2;
  }
  const bool rows_ok = !batch_sizes.empty() && std::all_of(batch_sizes.begin(), batch_sizes.end(),
                                                           [](int64_t r) { return r >= 1; });
  if (!rows_ok || steps < 1 || max_tokens < 1 || warm_passes < 0 || slice_tokens < 1) {
    std::fprintf(stderr,
                 "bench_structured: --rows needs sizes >= 1, --steps, --max-tokens and "
                 "--slice-tokens >= 1, --warm-passes >= 0\n");
    return 2;
  }
  const Tokenizer tok = Tokenizer::load(tokenizer_dir);
  const auto n = static_cast<int64_t>(tok.vocab_size());
  std::vector<std::string> bytes(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const auto id = static_cast<TokenId>(t);
    if (tok.is_valid_id(id) && !tok.is_special(id)) bytes[t] = std::string(tok.token_bytes(id));
  }
  std::vector<int32_t> eos;
  if (auto e = tok.eos_token_id()) eos.push_back(static_cast<int32_t>(*e));
  auto vocab = std::make_shared<structured::TokenVocabulary>(std::move(bytes), eos, n);
  std::printf("bench_structured: %lld tokens, %d threads, schema %s, %lld steps, max_tokens %lld\n",
              static_cast<long long>(n), num_threads(), schema_path.c_str(),
              static_cast<long long>(steps), static_cast<long long>(max_tokens));
  std::printf("%6s %5s %12s %12s %12s %12s %12s %14s %10s %10s %9s\n", "rows", "cache",
              "fill ms/step", "(max ms)", "pack ms/step", "(serial ms)", "take ms/step",
              "(accept ms)", "computed", "found", "documents");
  for (int64_t rows : batch_sizes) {
    // A fresh grammar per batch size: its cache starts empty, as a server's first requests.
    const double c0 = now_seconds();
    auto grammar = std::make_shared<const CompiledGrammar>(
        structured::json_schema_grammar(parse_ordered_json(read_file(schema_path), "schema")),
        vocab);
    const double compile = now_seconds() - c0;
    std::mt19937_64 rng(seed);
    for (int64_t pass = 0; pass <= warm_passes; ++pass) {
      const char* cache = pass == 0 ? "cold" : "warm";
      std::vector<Row> batch(static_cast<size_t>(rows));
      const auto [computed0, found0] = grammar->cache_stats();
      int64_t documents = 0;
      auto restart = [&](Row& r) {
        r.matcher = std::make_unique<GrammarMatcher>(grammar);
        r.generated = 0;
        r.mask.assign(static_cast<size_t>(vocab->mask_words()), 0);
      };
      for (Row& r : batch) restart(r);
      double fill = 0, max_fill = 0, pack = 0, serial = 0, take = 0, accept = 0;
      const int64_t words = vocab->mask_words();
      std::vector<uint32_t> upload(static_cast<size_t>(rows * words));
      std::vector<const uint32_t*> masks(static_cast<size_t>(rows));
      for (int64_t s = 0; s < steps; ++s) {
        const double t0 = now_seconds();
        // As fill_grammar_masks: the walks, the new states' masks split over the pool, the fill.
        parallel_for(rows, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) batch[i].matcher->settle();
        });
        std::vector<GrammarMatcher*> matchers;
        for (Row& r : batch) matchers.push_back(r.matcher.get());
        structured::prepare_masks(matchers, static_cast<size_t>(slice_tokens));
        parallel_for(rows, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            Row& r = batch[i];
            r.matcher->fill_mask(max_tokens - r.generated, r.mask);
          }
        });
        const double f = now_seconds() - t0;
        fill += f;
        max_fill = std::max(max_fill, f);
        for (int64_t i = 0; i < rows; ++i) masks[i] = batch[i].mask.data();
        // Which copy goes first alternates, so neither always finds the other's lines cached.
        for (int k = 0; k < 2; ++k) {
          const double c0 = now_seconds();
          if ((s + k) % 2 == 0) {
            pack_token_masks(masks, words, upload.data());
            pack += now_seconds() - c0;
          } else {
            for (int64_t i = 0; i < rows; ++i) {
              std::memcpy(upload.data() + i * words, masks[i], words * sizeof(uint32_t));
            }
            serial += now_seconds() - c0;
          }
        }
        std::vector<int32_t> picks(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) picks[i] = draw(batch[i].mask, rng);  // the "sampler"
        // The full walk, for reference: on copies, which the real matchers never see.
        std::vector<GrammarMatcher> copies;
        copies.reserve(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) copies.push_back(*batch[i].matcher);
        const double t1 = now_seconds();
        for (int64_t i = 0; i < rows; ++i) {
          if (picks[i] >= 0) copies[i].accept(picks[i]);
        }
        accept += now_seconds() - t1;
        const double t2 = now_seconds();
        for (int64_t i = 0; i < rows; ++i) {
          Row& r = batch[i];
          const bool ok = picks[i] >= 0 && r.matcher->take(picks[i]);
          ++r.generated;
          if (!ok || r.matcher->terminated() || vocab->is_eos(picks[i]) ||
              r.generated >= max_tokens) {
            ++documents;
            restart(r);
          }
        }
        take += now_seconds() - t2;
      }
      const auto [computed, found] = grammar->cache_stats();
      std::printf(
          "%6lld %5s %12.3f %12.3f %12.3f %12.3f %12.3f %14.3f %10lld %10lld %9lld   (compile "
          "%.1f ms)\n",
          static_cast<long long>(rows), cache, 1e3 * fill / double(steps), 1e3 * max_fill,
          1e3 * pack / double(steps), 1e3 * serial / double(steps), 1e3 * take / double(steps),
          1e3 * accept / double(steps), static_cast<long long>(computed - computed0),
          static_cast<long long>(found - found0), static_cast<long long>(documents), 1e3 * compile);
    }
  }
  return 0;
}
