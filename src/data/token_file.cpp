#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json.h"

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and read in place; a big-endian host needs a byte swap here");

namespace loom::data {

const char* token_dtype_name(TokenDType t) { return t == TokenDType::U16 ? "uint16" : "uint32"; }

TokenDType token_dtype_from_name(const std::string& name) {
  if (name == "uint16" || name == "u16") return TokenDType::U16;
  if (name == "uint32" || name == "u32") return TokenDType::U32;
  LOOM_FAIL("token file dtype must be \"uint16\" or \"uint32\", got \"", name, "\"");
}

TokenMeta read_token_meta(const std::string& meta_path) {
  const nlohmann::json j = io::read_json_file(meta_path, "token meta");
  LOOM_CHECK(j.is_object(), "token meta: ", meta_path, " must hold a JSON object");
  LOOM_CHECK(j.contains("dtype") && j["dtype"].is_string(), "token meta: ", meta_path,
             " needs a string \"dtype\" (\"uint16\" or \"uint32\")");
  TokenMeta meta;
  meta.dtype = token_dtype_from_name(j["dtype"].get<std::string>());
  if (j.contains("vocab_size")) {
    LOOM_CHECK(j["vocab_size"].is_number_integer() && j["vocab_size"].get<int64_t>() > 0, "token meta: ",
               meta_path, ": vocab_size must be a positive integer, got ", io::brief_json(j["vocab_size"]));
    meta.vocab_size = j["vocab_size"].get<int64_t>();
  }
  if (j.contains("eot_id") && j["eot_id"].is_number_integer()) meta.eot_id = j["eot_id"].get<int64_t>();
  return meta;
}

TokenFile TokenFile::open(const std::string& path, std::optional<TokenDType> dtype) {
  namespace fs = std::filesystem;
  if (!dtype) {
    fs::path meta = fs::path(path).parent_path() / "meta.json";
    if (!fs::exists(meta)) {
      throw IoError(str("token file ", path, ": no dtype given and no meta.json beside it (", meta.string(),
                        ")"));
    }
    dtype = read_token_meta(meta.string()).dtype;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(str("token file ", path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw IoError(str("token file ", path, ": cannot stat: ", std::strerror(err)));
  }
  auto bytes = static_cast<int64_t>(st.st_size);
  size_t elem = token_dtype_size(*dtype);
  if (bytes == 0 || bytes % static_cast<int64_t>(elem) != 0) {
    ::close(fd);
    LOOM_CHECK(bytes != 0, "token file ", path, " is empty");
    LOOM_FAIL("token file ", path, " has ", bytes, " bytes, not a multiple of ", elem, " (", token_dtype_name(*dtype),
              "): wrong dtype or a truncated file");
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (p == MAP_FAILED) throw IoError(str("token file ", path, ": mmap failed: ", std::strerror(err)));
  TokenFile f;
  size_t len = static_cast<size_t>(bytes);
  f.mapping_ = std::shared_ptr<void>(p, [len](void* q) { ::munmap(q, len); });
  f.data_ = p;
  f.size_ = bytes / static_cast<int64_t>(elem);
  f.dtype_ = *dtype;
  f.path_ = path;
  return f;
}

void TokenFile::copy_to(int64_t begin, int64_t n, int32_t* out) const {
  LOOM_CHECK(begin >= 0 && n >= 0 && begin + n <= size_, "token file ", path_, ": range [", begin, ", ",
             begin + n, ") is outside its ", size_, " tokens");
  if (dtype_ == TokenDType::U16) {
    const auto* src = static_cast<const uint16_t*>(data_) + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = src[i];
  } else {
    const auto* src = static_cast<const uint32_t*>(data_) + begin;
    for (int64_t i = 0; i < n; ++i) {
      // int32 tensors hold the ids; ids >= 2^31 cannot be a real vocabulary.
      LOOM_CHECK(src[i] <= 0x7fffffffu, "token file ", path_, ": token ", begin + i, " is ", src[i],
                 ", too large for an int32 id");
      out[i] = static_cast<int32_t>(src[i]);
    }
  }
}

uint32_t TokenFile::max_token() const {
  uint32_t m = 0;
  for (int64_t i = 0; i < size_; ++i) m = std::max(m, (*this)[i]);
  return m;
}

}  // namespace loom::data
