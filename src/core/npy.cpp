#include "longctx/core/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

namespace longctx {

namespace {

DType dtype_from_descr(const std::string& d, const std::string& path) {
  if (d == "<f4") return DType::kF32;
  if (d == "<f2") return DType::kF16;
  if (d == "<i4") return DType::kI32;
  if (d == "<i8") return DType::kI64;
  if (d == "|u1" || d == "<u1") return DType::kU8;
  LONGCTX_THROW(ErrorCode::kUnsupported, "{}: unsupported .npy dtype '{}'", path, d);
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::kF32:
      return "<f4";
    case DType::kF16:
      return "<f2";
    case DType::kI32:
      return "<i4";
    case DType::kI64:
      return "<i8";
    case DType::kU8:
      return "|u1";
    case DType::kBF16:
    case DType::kFP8E4M3:
      break;
  }
  LONGCTX_THROW(ErrorCode::kUnsupported, ".npy has no {}; convert to f32 first", dtype_name(t));
}

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LONGCTX_CHECK(f, ErrorCode::kNotFound, "{}: cannot open .npy file", path);
  char magic[8];
  f.read(magic, 8);
  LONGCTX_CHECK(f && std::memcmp(magic, "\x93NUMPY", 6) == 0, ErrorCode::kInvalidArgument,
                "{}: not a .npy file (bad magic)", path);
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  f.read(header.data(), hlen);
  LONGCTX_CHECK(f, ErrorCode::kInvalidArgument, "{}: truncated .npy header", path);
  std::smatch m;
  LONGCTX_CHECK(std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'")),
                ErrorCode::kInvalidArgument, "{}: .npy header lacks descr", path);
  DType dtype = dtype_from_descr(m[1], path);
  LONGCTX_CHECK(std::regex_search(header, std::regex("'fortran_order':\\s*False")),
                ErrorCode::kUnsupported, "{}: Fortran-order .npy is not supported", path);
  LONGCTX_CHECK(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")),
                ErrorCode::kInvalidArgument, "{}: .npy header lacks shape", path);
  Shape shape;
  std::string dims = m[1];
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator();
       ++it)
    shape.push_back(std::stoll(it->str()));
  Tensor t = Tensor::empty(shape, dtype);
  f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  LONGCTX_CHECK(f, ErrorCode::kInvalidArgument, "{}: .npy data shorter than shape {}", path,
                shape_to_string(shape));
  return t;
}

void write_npy(const std::string& path, const Tensor& t) {
  LONGCTX_CHECK(t.device().is_cpu(), ErrorCode::kInvalidArgument, "write_npy of a {} tensor",
                t.device().str());
  Tensor c = t.contiguous();
  std::string shape;
  for (int64_t d : c.shape()) shape += std::to_string(d) + ",";
  if (c.rank() > 1) shape.pop_back();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   descr_of(c.dtype()), shape);
  // Pad so the data starts on a 64-byte boundary, newline-terminated, as numpy writes it.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  LONGCTX_CHECK(f, ErrorCode::kIo, "{}: cannot open for writing", path);
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t hlen = static_cast<uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&hlen), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  LONGCTX_CHECK(f, ErrorCode::kIo, "{}: write failed", path);
}

}  // namespace longctx
