#include "io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/error.h"

namespace loom::io {
namespace {

std::string errno_text() { return std::strerror(errno); }

// Closes a descriptor on scope exit unless released.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  FdGuard guard;
  guard.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (guard.fd < 0) throw IoError(str("cannot open '", path, "': ", errno_text()));
  struct stat st {};
  if (::fstat(guard.fd, &st) != 0) throw IoError(str("cannot stat '", path, "': ", errno_text()));
  if (!S_ISREG(st.st_mode)) throw IoError(str("'", path, "' is not a regular file"));
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {  // mmap refuses length 0
    void* p = ::mmap(nullptr, file->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, guard.fd, 0);
    if (p == MAP_FAILED) throw IoError(str("cannot map '", path, "' (", file->size_, " bytes): ", errno_text()));
    file->data_ = static_cast<uint8_t*>(p);
  }
  return file;  // the mapping outlives the descriptor
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

FileBytes FileBytes::mapped(const std::string& path) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  FileBytes bytes{nullptr, file->data(), file->size()};
  bytes.owner = std::move(file);
  return bytes;
}

FileBytes FileBytes::copied(const uint8_t* data, size_t size) {
  auto copy = std::make_shared<std::vector<uint8_t>>(data, data + size);
  return {copy, copy->data(), copy->size()};
}

void FileWriter::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(str("cannot write to '", path_, "': ", errno_text()));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

void fsync_path(const std::string& path) {
  FdGuard guard;
  guard.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (guard.fd < 0) throw IoError(str("cannot open '", path, "' to fsync it: ", errno_text()));
  if (::fsync(guard.fd) != 0) throw IoError(str("fsync of '", path, "' failed: ", errno_text()));
}

void write_file_atomically(const std::string& path, const std::function<void(FileWriter&)>& write) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // A hidden name in the same directory (rename is atomic only within one filesystem); random so that
  // concurrent writers of the same path never share a temporary file.
  std::random_device entropy;
  std::string tmp;
  FdGuard guard;
  for (int attempt = 0; guard.fd < 0; ++attempt) {
    const uint64_t tag = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
    std::string name = ".";  // built with += : GCC 12 warns falsely (-Wrestrict) on "." + string
    name += target.filename().string();
    name += ".tmp.";
    name += std::to_string(tag);
    tmp = (dir / name).string();
    guard.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (guard.fd < 0 && (errno != EEXIST || attempt >= 16)) {
      throw IoError(str("cannot create a temporary file in '", dir.string(), "' to write '", path,
                        "': ", errno_text()));
    }
  }
  try {
    FileWriter writer(guard.fd, path);
    write(writer);
    if (::fsync(guard.fd) != 0) throw IoError(str("fsync of '", tmp, "' failed: ", errno_text()));
    const int fd = guard.fd;
    guard.fd = -1;
    if (::close(fd) != 0) throw IoError(str("cannot close '", tmp, "': ", errno_text()));
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw IoError(str("cannot rename '", tmp, "' to '", path, "': ", errno_text()));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_path(dir.string());
}

}  // namespace loom::io
