// Byte-level BPE model: vocabulary and merges over raw bytes (the byte-level spelling of the
// tokenizer.json vocabulary is decoded once at load), a rank-ordered merge loop and a
// word -> ids cache shared by all threads.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace longctx::tokenizer {

// Deliberately not noexcept: libstdc++ then caches each node's hash, so bucket scans compare
// cached hashes instead of rehashing every key in the chain.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const;
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing map (a, b) -> (rank, merged id): the merge loop's hot lookup.
class MergeTable {
 public:
  void build(const std::vector<std::pair<uint64_t, std::pair<int32_t, int32_t>>>& entries);
  // Returns false when (a, b) is not a merge.
  bool find(int32_t a, int32_t b, int32_t* rank, int32_t* merged) const {
    if (slots_.empty()) return false;
    uint64_t key = pack(a, b);
    size_t i = slot_of(key);
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *rank = s.rank;
        *merged = s.merged;
        return true;
      }
      if (s.key == kEmpty) return false;
      i = (i + 1) & mask_;
    }
  }
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, merged = 0;
  };
  size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

// Thread-safe bounded cache word bytes -> ids. A lookup that finds the lock taken simply misses
// (the caller computes the merge), so threads never wait on each other here.
class WordCache {
 public:
  explicit WordCache(size_t max_entries);
  bool lookup(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const;
  void insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t n);
  static constexpr size_t kMaxWordBytes = 128;

 private:
  struct Entry {
    uint64_t hash = 0;
    uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
  };
  mutable std::mutex mu_;
  std::vector<Entry> slots_;  // ids_len == 0: empty (every word has at least one id)
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t max_entries_, size_ = 0;
};

struct BpeOptions {
  bool ignore_merges = false;
  std::optional<int32_t> unk_id;  // emitted for a byte without a vocabulary entry
  size_t cache_entries = 1 << 16;
};

class BpeModel {
 public:
  // vocab: raw bytes -> id; merges: (left, right) raw bytes, in rank order.
  BpeModel(StringIdMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options);

  // Appends the ids of one pre-token (raw bytes).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // The merge loop without cache or ignore_merges (exposed for tests).
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // Same result as merge_word through the priority-queue path used for long words.
  void merge_word_heap(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> find(std::string_view bytes) const;
  const StringIdMap& vocab() const { return vocab_; }

 private:
  void merge_word_scan(std::string_view word, std::vector<int32_t>& out) const;
  StringIdMap vocab_;
  std::array<int32_t, 256> byte_ids_{};
  MergeTable merges_;
  BpeOptions options_;
  mutable WordCache cache_;
};

}  // namespace longctx::tokenizer
