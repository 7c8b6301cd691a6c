// The safetensors header (and the file layout it describes): the input is the whole file,
// served from a memfd so that the real open + mmap path runs. Every tensor the file names is
// then read at its first and last byte, so a view past the mapping shows as an ASan report.
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "fuzz_common.h"
#include "loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace longctx;
  static const int fd = memfd_create("fuzz.safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0) return 0;
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  fuzz::expect_clean([&] {
    auto file = SafetensorsFile::open(path);
    volatile uint8_t sink = 0;
    for (const std::string& name : file->names()) {
      Tensor t = file->get(name);
      if (t.nbytes() == 0) continue;
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      sink = sink + p[0] + p[t.nbytes() - 1];
    }
  });
  return 0;
}
