// libFuzzer target over the GGUF reader: parse_gguf on arbitrary bytes. Built and run by tools/fuzz.sh
// (ASan + UBSan). A finding is any crash, sanitizer report, exception other than loom::Error, or a
// broken invariant below (reported through __builtin_trap):
//   * a refused input throws loom::Error and nothing else;
//   * an accepted input's tensors lie inside the buffer, in order, aligned, with the byte size their type
//     and dims imply (every byte is read and dequantized, so ASan sees any out-of-bounds range);
//   * writing an accepted file back out (write_gguf) and parsing that gives the same metadata, tensors
//     and bytes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "gguf/format.h"

using namespace loom::gguf;

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

bool same_value(const Value& a, const Value& b);

bool same_array(const Array& a, const Array& b) {
  if (a.element != b.element || a.count != b.count || a.raw != b.raw || a.items.size() != b.items.size()) return false;
  for (size_t i = 0; i < a.items.size(); ++i) {
    if (!same_value(a.items[i], b.items[i])) return false;
  }
  return true;
}

bool same_value(const Value& a, const Value& b) {
  if (a.type() != b.type()) return false;
  if (const Array* x = std::get_if<Array>(&a.v)) return same_array(*x, std::get<Array>(b.v));
  if (const float* x = std::get_if<float>(&a.v)) return std::memcmp(x, &std::get<float>(b.v), 4) == 0;  // NaN bits
  if (const double* x = std::get_if<double>(&a.v)) return std::memcmp(x, &std::get<double>(b.v), 8) == 0;
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Array>) {
          return false;  // handled above
        } else {
          return x == std::get<T>(b.v);
        }
      },
      a.v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Header h;
  try {
    h = parse_gguf(data, size);
  } catch (const loom::Error&) {
    return 0;  // refused, as it should be for most inputs
  }
  require(h.data_start % h.alignment == 0);
  require(h.tensors.empty() || h.data_start + h.data_bytes <= size);  // no tensors: the padding may be absent
  uint64_t expected = 0;
  volatile uint8_t sink = 0;
  std::vector<TensorEntry> entries;
  std::vector<float> values;
  for (const TensorInfo& t : h.tensors) {
    require(t.offset == expected && t.offset % h.alignment == 0);
    require(static_cast<int64_t>(t.nbytes) ==
            loom::quant::row_bytes(t.type, static_cast<int64_t>(t.ne[0])) * static_cast<int64_t>(t.numel() / t.ne[0]));
    const uint8_t* p = data + h.data_start + t.offset;
    for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink ^ p[i];
    if (t.numel() <= (1u << 16)) {  // dequantizing reads every block (NaN/Inf scales are allowed)
      values.resize(t.numel());
      loom::quant::dequantize(t.type, p, static_cast<int64_t>(t.numel()), values.data());
    }
    expected = (t.offset + t.nbytes + h.alignment - 1) / h.alignment * h.alignment;
    require(h.find_tensor(t.name) == &t);
    entries.push_back({t.name, t.ne, t.type, p, t.nbytes});
  }
  for (const KeyValue& kv : h.metadata) require(h.find(kv.key) == &kv.value);

  // Round trip through the writer.
  const std::vector<uint8_t> again = serialize_gguf(h.metadata, entries);
  const Header back = parse_gguf(again.data(), again.size());
  require(back.alignment == h.alignment && back.metadata.size() == h.metadata.size() &&
          back.tensors.size() == h.tensors.size());
  for (size_t i = 0; i < h.metadata.size(); ++i) {
    require(back.metadata[i].key == h.metadata[i].key && same_value(back.metadata[i].value, h.metadata[i].value));
  }
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorInfo &a = h.tensors[i], &b = back.tensors[i];
    require(a.name == b.name && a.ne == b.ne && a.type == b.type && a.nbytes == b.nbytes && a.offset == b.offset);
    require(std::memcmp(again.data() + back.data_start + b.offset, data + h.data_start + a.offset, a.nbytes) == 0);
  }
  return 0;
}
