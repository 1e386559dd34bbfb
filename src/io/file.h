// Files: read-only memory maps, and atomic writes (temp file in the same directory, fsync, rename,
// fsync of the directory), so that a crash leaves either the old file or the new one, never a torn one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/error.h"

namespace loom::io {

// A whole file mapped into memory, copy-on-write (MAP_PRIVATE, PROT_READ|PROT_WRITE): tensors that
// wrap the mapping may be modified in place (optimizers do) without touching the file. Writers in
// loom replace files by rename, so a mapped file's contents never change underneath it; a file that
// another program truncates while it is mapped would fault on access (SIGBUS), as with any mmap.
class MappedFile {
 public:
  // Throws loom::IoError naming the path and the system error.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const { return data_; }  // null for an empty file
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A file's bytes for a reader that works in place (safetensors, GGUF): the file mapped, or a private
// copy of a caller's buffer (which then need not outlive the reader). `owner` keeps them alive.
struct FileBytes {
  std::shared_ptr<void> owner;
  uint8_t* data = nullptr;
  size_t size = 0;
  static FileBytes mapped(const std::string& path);  // MappedFile::open: an IoError names the path
  static FileBytes copied(const uint8_t* data, size_t size);
};

// fn(), with a format error prefixed "LABEL: " (the file's path); an IoError, which names its file
// already, passes unchanged.
template <typename Fn>
auto with_file_label(const std::string& label, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const IoError&) {
    throw;
  } catch (const Error& e) {
    throw Error(str(label, ": ", e.what()));
  }
}

// Sequential writes to an open file; every error throws loom::IoError naming the path.
class FileWriter {
 public:
  FileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void write(const void* data, size_t bytes);
  uint64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
  uint64_t written_ = 0;
};

// Writes `path` atomically: `write` fills a new temporary file in the same directory, which is then
// fsync'ed and renamed over `path`, and the directory is fsync'ed so that the rename itself is durable.
// If `write` throws, the temporary file is removed and `path` is left as it was.
void write_file_atomically(const std::string& path, const std::function<void(FileWriter&)>& write);

// fsync on a file or directory (a directory's fsync makes renames and creations inside it durable).
void fsync_path(const std::string& path);

}  // namespace loom::io
