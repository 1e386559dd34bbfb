// libFuzzer target over the safetensors reader: parse_safetensors_header on arbitrary bytes.
// Built and run by tools/fuzz.sh (ASan + UBSan). A finding is any crash, sanitizer report, exception
// other than loom::Error, or a broken invariant below (reported through __builtin_trap):
//   * a refused input throws loom::Error and nothing else;
//   * an accepted input's tensors lie inside the buffer, tile the data section in order, and have the
//     byte size their dtype and shape imply (every byte is read, so ASan sees any out-of-bounds range);
//   * writing an accepted file back out (plan_safetensors_layout) and parsing that gives the same names,
//     dtypes, shapes, bytes and metadata.
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "io/safetensors_format.h"

using namespace loom::io;

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SafetensorsHeader header;
  try {
    header = parse_safetensors_header(data, size);
  } catch (const loom::Error&) {
    return 0;  // refused, as it should be for most inputs
  }

  require(header.data_start() + header.data_bytes == size);
  uint64_t covered = 0;
  volatile uint8_t sink = 0;
  for (const auto& t : header.tensors) {
    require(t.begin == covered && t.begin <= t.end && t.end <= header.data_bytes);
    require(t.numel() * static_cast<uint64_t>(safetensors_dtype_bits(t.dtype)) / 8 == t.nbytes());
    for (uint64_t i = t.begin; i < t.end; ++i) sink = sink ^ data[header.data_start() + i];
    covered = t.end;
    require(header.find(t.name) == &t);
  }
  require(covered == header.data_bytes);

  // Round trip through the writer.
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : header.tensors) {
    entries.push_back({t.name, t.dtype, t.shape, data + header.data_start() + t.begin, t.nbytes()});
  }
  const std::vector<uint8_t> again = serialize_safetensors(entries, header.metadata);
  const SafetensorsHeader back = parse_safetensors_header(again.data(), again.size());
  require(back.header_bytes % 8 == 0);
  require(back.metadata == header.metadata);
  require(back.tensors.size() == header.tensors.size());
  for (const auto& t : header.tensors) {
    const SafetensorsTensorInfo* u = back.find(t.name);
    require(u != nullptr && u->dtype == t.dtype && u->shape == t.shape && u->nbytes() == t.nbytes());
    require(t.nbytes() == 0 || std::memcmp(again.data() + back.data_start() + u->begin,
                                           data + header.data_start() + t.begin, t.nbytes()) == 0);
  }
  return 0;
}
