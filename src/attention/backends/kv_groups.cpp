#include "longctx/attention/kv_groups.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "longctx/core/error.h"

namespace longctx {

namespace {

// A linear-attention layer's state (Qwen3-Next's Gated DeltaNet, as vLLM sizes it): the
// recurrent state [value_heads, key_head_dim, value_head_dim] and the causal conv's last
// (kernel - 1) inputs over the q, k and v channels.
int64_t linear_state_bytes(const LinearAttentionConfig& l, DType dtype) {
  const int64_t recurrent = l.num_value_heads * l.key_head_dim * l.value_head_dim;
  const int64_t conv_dim =
      2 * l.num_key_heads * l.key_head_dim + l.num_value_heads * l.value_head_dim;
  const int64_t conv = (l.conv_kernel_dim - 1) * conv_dim;
  return (recurrent + conv) * static_cast<int64_t>(dtype_size(dtype));
}

// The order groups are listed in: full first (so a one-table consumer reads the full group), then
// sliding windows by size, then state.
std::tuple<int, int64_t, int64_t> order_key(const KvGroup& g) {
  return {static_cast<int>(g.kind), g.window, g.layers.front()};
}

}  // namespace

KvGroups KvGroups::from_config(const ModelConfig& c, DType kv_dtype) {
  LONGCTX_CHECK(c.num_hidden_layers > 0 &&
                    (c.layer_types.empty() ||
                     static_cast<int64_t>(c.layer_types.size()) == c.num_hidden_layers),
                ErrorCode::kInvalidArgument, "KV groups: {} layers with {} layer types",
                c.num_hidden_layers, c.layer_types.size());
  KvGroups r;
  r.kv_bytes_per_layer_token_ =
      2 * c.num_key_value_heads * c.head_dim * static_cast<int64_t>(dtype_size(kv_dtype));
  if (kv_dtype == DType::kFP8E4M3)
    r.scale_bytes_per_layer_block_ = 2 * c.num_key_value_heads * int64_t(sizeof(float));
  // The delta rule accumulates into its state over the whole sequence, so the kernels keep it in
  // fp32 whatever the KV cache's dtype (as vLLM's and flash-linear-attention's defaults).
  constexpr DType state_dtype = DType::kF32;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    KvGroup want;
    want.dtype = kv_dtype;
    switch (c.layer_type(l)) {
      case LayerAttention::kFull:
        want.kind = KvGroupKind::kFull;
        break;
      case LayerAttention::kSliding:
        want.kind = KvGroupKind::kSlidingWindow;
        want.window = c.sliding_window;
        LONGCTX_CHECK(c.sliding_window > 0, ErrorCode::kInvalidArgument,
                      "KV groups: layer {} slides but sliding_window is {}", l, c.sliding_window);
        break;
      case LayerAttention::kLinear:
        want.kind = KvGroupKind::kState;
        want.dtype = state_dtype;
        LONGCTX_CHECK(c.linear.num_key_heads > 0 && c.linear.num_value_heads > 0 &&
                          c.linear.key_head_dim > 0 && c.linear.value_head_dim > 0 &&
                          c.linear.conv_kernel_dim > 0,
                      ErrorCode::kInvalidArgument,
                      "KV groups: layer {} is linear attention but the linear_* state sizes are "
                      "not all positive",
                      l);
        break;
    }
    auto it = std::find_if(r.groups_.begin(), r.groups_.end(), [&](const KvGroup& g) {
      return g.kind == want.kind && g.window == want.window;
    });
    if (it == r.groups_.end()) it = r.groups_.insert(r.groups_.end(), want);
    it->layers.push_back(l);
  }
  // Paged layers of several kinds (Gemma 3: 8 full, 40 sliding): every block of the shared pool
  // holds pool_layers() layers, so each kind is cut into groups of the smallest kind's layer count
  // (the last one may be shorter), as vLLM's hybrid allocator does. One group of 40 would make a
  // full-attention block, held for every token, cost 40 layers where it fills 8.
  int64_t unit = 0;
  int paged_kinds = 0;
  for (const KvGroup& g : r.groups_)
    if (g.kind != KvGroupKind::kState) {
      const auto n = static_cast<int64_t>(g.layers.size());
      unit = paged_kinds++ == 0 ? n : std::min(unit, n);
    }
  if (paged_kinds > 1) {
    std::vector<KvGroup> cut;
    for (const KvGroup& g : r.groups_) {
      if (g.kind == KvGroupKind::kState) {
        cut.push_back(g);
        continue;
      }
      for (size_t i = 0; i < g.layers.size(); i += unit) {
        KvGroup part = g;
        part.layers.assign(g.layers.begin() + i,
                           g.layers.begin() + std::min(g.layers.size(), i + size_t(unit)));
        cut.push_back(part);
      }
    }
    r.groups_ = std::move(cut);
  }
  std::sort(r.groups_.begin(), r.groups_.end(),
            [](const KvGroup& a, const KvGroup& b) { return order_key(a) < order_key(b); });
  r.group_of_.assign(c.num_hidden_layers, 0);
  r.pool_layer_.assign(c.num_hidden_layers, 0);
  for (int64_t g = 0; g < r.size(); ++g) {
    KvGroup& grp = r.groups_[g];
    const auto n = static_cast<int64_t>(grp.layers.size());
    for (int64_t j = 0; j < n; ++j) {
      r.group_of_[grp.layers[j]] = g;
      r.pool_layer_[grp.layers[j]] = j;
    }
    if (grp.kind == KvGroupKind::kState) {
      grp.bytes_per_seq = n * linear_state_bytes(c.linear, state_dtype);
    } else {
      grp.bytes_per_token = n * r.kv_bytes_per_layer_token_;
      grp.scale_bytes_per_block = n * r.scale_bytes_per_layer_block_;
      r.pool_layers_ = std::max(r.pool_layers_, n);
    }
  }
  return r;
}

bool KvGroups::has_kind(KvGroupKind kind) const {
  return std::any_of(groups_.begin(), groups_.end(),
                     [&](const KvGroup& g) { return g.kind == kind; });
}

int64_t KvGroups::block_bytes(int64_t block_size) const {
  return pool_layers_ * (kv_bytes_per_layer_token_ * block_size + scale_bytes_per_layer_block_);
}

int64_t KvGroups::paged_bytes_per_token() const {
  int64_t n = 0;
  for (const KvGroup& g : groups_) n += g.bytes_per_token;
  return n;
}

int64_t KvGroups::state_bytes_per_seq() const {
  int64_t n = 0;
  for (const KvGroup& g : groups_) n += g.bytes_per_seq;
  return n;
}

int64_t KvGroups::bytes_per_seq(int64_t tokens, int64_t block_size) const {
  LONGCTX_CHECK(block_size > 0, ErrorCode::kInvalidArgument, "KV groups: block size {}",
                block_size);
  int64_t n = 0;
  for (const KvGroup& g : groups_) {
    const int64_t kept =
        g.kind == KvGroupKind::kSlidingWindow ? std::min(tokens, g.window) : tokens;
    n += g.bytes_per_token * kept + g.bytes_per_seq +
         g.scale_bytes_per_block * ((kept + block_size - 1) / block_size);
  }
  return n;
}

KvGroups KvGroups::without_first() const {
  LONGCTX_CHECK(size() > 1, ErrorCode::kInvalidArgument,
                "KV groups: no group left without group 0 ({})", summary());
  KvGroups r = *this;
  r.groups_.erase(r.groups_.begin());
  r.pool_layers_ = 0;
  for (int64_t g = 0; g < r.size(); ++g) {
    for (int64_t l : r.groups_[g].layers) r.group_of_[l] = g;
    if (r.groups_[g].kind != KvGroupKind::kState)
      r.pool_layers_ = std::max(r.pool_layers_, static_cast<int64_t>(r.groups_[g].layers.size()));
  }
  for (int64_t l : groups_[0].layers) r.group_of_[l] = -1;
  return r;
}

bool KvGroups::offloadable() const {
  if (size() == 0 || groups_[0].kind != KvGroupKind::kFull) return false;
  // The groups after the full one stay resident: a window pool for sliding groups, a state pool
  // for state groups (not both: the offload backend's resident side is one or the other).
  const bool sliding = has_kind(KvGroupKind::kSlidingWindow), state = has_kind(KvGroupKind::kState);
  for (int64_t g = 1; g < size(); ++g)
    if (groups_[g].kind == KvGroupKind::kFull) return false;
  return !(sliding && state);
}

std::vector<KvGroupAlloc> KvGroups::allocs() const {
  std::vector<KvGroupAlloc> a;
  for (const KvGroup& g : groups_) a.push_back({g.kind, g.window});
  return a;
}

std::string KvGroups::summary() const {
  std::string s;
  for (const std::string& line : describe()) s += (s.empty() ? "" : "; ") + line;
  return s;
}

std::vector<std::string> KvGroups::describe() const {
  std::vector<std::string> lines;
  for (int64_t g = 0; g < size(); ++g) {
    const KvGroup& grp = groups_[g];
    // Layers as ranges: "0-3, 8, 10-11".
    std::string layers;
    for (size_t i = 0; i < grp.layers.size();) {
      size_t j = i;
      while (j + 1 < grp.layers.size() && grp.layers[j + 1] == grp.layers[j] + 1) ++j;
      layers += fmt::format("{}{}", layers.empty() ? "" : ",", grp.layers[i]);
      if (j > i) layers += fmt::format("-{}", grp.layers[j]);
      i = j + 1;
    }
    std::string kind = kv_group_kind_name(grp.kind);
    if (grp.kind == KvGroupKind::kSlidingWindow) kind += fmt::format(" (window {})", grp.window);
    std::string bytes = grp.kind == KvGroupKind::kState
                            ? fmt::format("{} B/sequence", grp.bytes_per_seq)
                            : fmt::format("{} B/token", grp.bytes_per_token);
    if (grp.scale_bytes_per_block > 0)
      bytes += fmt::format(" + {} B/block of scales", grp.scale_bytes_per_block);
    lines.push_back(fmt::format("group {}: {}, {} layers ({}), {}, {}", g, kind, grp.layers.size(),
                                layers, dtype_name(grp.dtype), bytes));
  }
  return lines;
}

}  // namespace longctx
