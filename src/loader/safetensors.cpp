#include "loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "longctx/core/json_limits.h"

namespace longctx {

namespace {

DType safetensors_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  if (s == "U8") return DType::kU8;
  if (s == "F8_E4M3") return DType::kFP8E4M3;
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "{}: unsupported safetensors dtype '{}' (supported: F32, BF16, F16, I32, I64, U8, "
                "F8_E4M3)",
                where, s);
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LONGCTX_CHECK(fd >= 0, errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    LONGCTX_THROW(ErrorCode::kIo, "{}: fstat failed: {}", path, std::strerror(e));
  }
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    ::close(fd);
    LONGCTX_CHECK(m != MAP_FAILED, ErrorCode::kIo, "{}: mmap failed: {}", path, std::strerror(e));
    f->map_ = m;
  } else {
    ::close(fd);
  }
  f->parse();
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> n;
  for (const auto& [name, t] : entries_) n.push_back(name);
  return n;
}

Tensor SafetensorsFile::get(const std::string& name) {
  auto it = entries_.find(name);
  LONGCTX_CHECK(it != entries_.end(), ErrorCode::kNotFound, "{}: no tensor '{}'", path_, name);
  const Tensor& t = it->second;
  // The view shares ownership of this file, so the mapping outlives every tensor.
  return Tensor::from_blob(t.data_ptr(), t.shape(), t.dtype(), Device::cpu(), shared_from_this());
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

void SafetensorsFile::parse() {
  const std::string& p = path_;
  LONGCTX_CHECK(size_ >= 8, ErrorCode::kInvalidArgument,
                "{}: not a safetensors file: {} bytes, shorter than the 8-byte header length", p,
                size_);
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  LONGCTX_CHECK(header_len <= size_ - 8, ErrorCode::kInvalidArgument,
                "{}: safetensors header length {} runs past the end of the file ({} bytes)", p,
                header_len, size_);
  const size_t data_begin = 8 + header_len;
  const size_t data_size = size_ - data_begin;
  const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_len);
  check_json_depth(header_text, p + ": safetensors header");
  nlohmann::json header = nlohmann::json::parse(header_text.begin(), header_text.end(), nullptr,
                                                /*allow_exceptions=*/false);
  LONGCTX_CHECK(!header.is_discarded() && header.is_object(), ErrorCode::kInvalidArgument,
                "{}: safetensors header is not a valid JSON object", p);

  struct Span {
    size_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = p + ": tensor '" + name + "'";
    LONGCTX_CHECK(e.is_object() && e.contains("dtype") && e["dtype"].is_string() &&
                      e.contains("shape") && e["shape"].is_array() && e.contains("data_offsets") &&
                      e["data_offsets"].is_array() && e["data_offsets"].size() == 2,
                  ErrorCode::kInvalidArgument,
                  "{}: header entry needs dtype, shape and data_offsets [begin, end]", where);
    DType dtype = safetensors_dtype(e["dtype"].get<std::string>(), where);
    Shape shape;
    for (const auto& d : e["shape"]) {
      LONGCTX_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= uint64_t{INT64_MAX},
                    ErrorCode::kInvalidArgument,
                    "{}: shape entries must be non-negative integers, got {}", where,
                    json_excerpt(d));
      shape.push_back(d.get<int64_t>());
    }
    LONGCTX_CHECK(
        e["data_offsets"][0].is_number_unsigned() && e["data_offsets"][1].is_number_unsigned(),
        ErrorCode::kInvalidArgument, "{}: data_offsets must be non-negative integers", where);
    size_t b = e["data_offsets"][0].get<size_t>(), en = e["data_offsets"][1].get<size_t>();
    LONGCTX_CHECK(b <= en && en <= data_size, ErrorCode::kInvalidArgument,
                  "{}: data_offsets [{}, {}) lie outside the data section of {} bytes", where, b,
                  en, data_size);
    // shape_numel checks the product; the byte count is checked here (both come from the file).
    size_t expect = 0;
    LONGCTX_CHECK(!__builtin_mul_overflow(static_cast<size_t>(shape_numel(shape)),
                                          dtype_size(dtype), &expect),
                  ErrorCode::kInvalidArgument, "{}: shape {} of {} is too large", where,
                  shape_to_string(shape), dtype_name(dtype));
    LONGCTX_CHECK(en - b == expect, ErrorCode::kInvalidArgument,
                  "{}: {} bytes of data for shape {} of {} (needs {})", where, en - b,
                  shape_to_string(shape), dtype_name(dtype), expect);
    LONGCTX_CHECK((data_begin + b) % dtype_size(dtype) == 0, ErrorCode::kInvalidArgument,
                  "{}: data at file offset {} is misaligned for {} elements", where, data_begin + b,
                  dtype_name(dtype));
    spans.push_back({b, en, name});
    void* ptr = const_cast<uint8_t*>(bytes + data_begin + b);
    entries_.emplace(name, Tensor::from_blob(ptr, shape, dtype, Device::cpu()));
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& x, const Span& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    LONGCTX_CHECK(spans[i].begin >= spans[i - 1].end || spans[i].begin == spans[i].end,
                  ErrorCode::kInvalidArgument,
                  "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", p, spans[i - 1].name,
                  spans[i - 1].begin, spans[i - 1].end, spans[i].name, spans[i].begin,
                  spans[i].end);
  }
}

}  // namespace longctx
