// One .safetensors file, memory-mapped read-only and validated: the header length fits the
// file, the JSON header parses, every entry has a known dtype, a shape, and data offsets inside
// the data section whose size matches the shape, aligned to the element size, not overlapping.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/tensor.h"

namespace longctx {

class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  // Throws Error naming the file and the problem.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // A CPU tensor viewing the mapping in place; it keeps the mapping alive.
  Tensor get(const std::string& name);

 private:
  SafetensorsFile() = default;
  void parse();

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  // Borrowed views (no keepalive, which would be a reference cycle); get() adds it.
  std::map<std::string, Tensor> entries_;
};

}  // namespace longctx
