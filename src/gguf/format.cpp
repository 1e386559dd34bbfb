// GGUF on bytes: see format.h for the layout and the reader's rules.
#include "gguf/format.h"

#include <bit>
#include <cstring>

#include "core/error.h"
#include "io/safetensors_format.h"  // find_invalid_utf8, quote_name

namespace loom::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is read and written in place: little-endian only");

namespace {

constexpr const char* kTypeNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
constexpr size_t kScalarBytes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  // 0: not a fixed-size scalar
static_assert(std::size(kTypeNames) == static_cast<size_t>(ValueType::F64) + 1);
static_assert(std::variant_size_v<decltype(Value::v)> == std::size(kTypeNames),
              "Value's variant must hold one alternative per GGUF type, in type-id order");

bool is_scalar(ValueType t) { return kScalarBytes[static_cast<size_t>(t)] != 0; }
size_t scalar_bytes(ValueType t) { return kScalarBytes[static_cast<size_t>(t)]; }

// A read position in the file with every read bounds-checked; `where` says what is being read.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    LOOM_CHECK(n <= left(), "truncated file: ", what, " needs ", n, " bytes at offset ", pos_, " but only ", left(),
               " remain (file size ", size_, ")");
  }
  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view bytes(uint64_t n, const std::string& what) {
    need(n, what);
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }
  // A GGUF string: u64 length, then the bytes.
  std::string_view string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " (its length)");
    LOOM_CHECK(n <= left(), "truncated file: ", what, " has length ", n, " at offset ", pos_ - 8, " but only ", left(),
               " bytes remain (file size ", size_, ")");
    return bytes(n, what);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  uint64_t pos_ = 0;
};

void check_utf8(std::string_view s, const std::string& what) {
  auto bad = io::find_invalid_utf8(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  LOOM_CHECK(!bad, what, " ", quoted(s), " is not valid UTF-8 (at byte ", bad.value_or(0), ")");
}

ValueType read_value_type(Cursor& in, const std::string& what) {
  const uint32_t id = in.read<uint32_t>(what + " (its type)");
  LOOM_CHECK(id <= static_cast<uint32_t>(ValueType::F64), what, ": unknown value type ", id,
             " (GGUF's are 0..12: u8, i8, u16, i16, u32, i32, f32, bool, string, array, u64, i64, f64)");
  return static_cast<ValueType>(id);
}

template <typename T>
Value scalar_value(Cursor& in, const std::string& what) {
  return Value{in.read<T>(what)};
}

Value read_value(Cursor& in, ValueType type, int depth, const std::string& what);

Array read_array(Cursor& in, int depth, const std::string& what) {
  LOOM_CHECK(depth < kMaxArrayDepth, what, ": arrays nested more than ", kMaxArrayDepth, " deep");
  Array a;
  a.element = read_value_type(in, what + " (its element type)");
  a.count = in.read<uint64_t>(what + " (its element count)");
  if (is_scalar(a.element)) {
    const uint64_t each = scalar_bytes(a.element);
    LOOM_CHECK(a.count <= in.left() / each, "truncated file: ", what, " is an array of ", a.count, " ",
               value_type_name(a.element), " (", each, " bytes each) but only ", in.left(), " bytes remain");
    std::string_view raw = in.bytes(a.count * each, what);
    if (a.element == ValueType::Bool) {
      for (size_t i = 0; i < raw.size(); ++i) {
        LOOM_CHECK(raw[i] == 0 || raw[i] == 1, what, ": bool element ", i, " is ", static_cast<int>(static_cast<uint8_t>(raw[i])),
                   " (must be 0 or 1)");
      }
    }
    a.raw.assign(raw);
    return a;
  }
  // A string takes at least 8 bytes, an array at least 12: a count larger than the bytes left allow is
  // refused before anything is allocated for it.
  const uint64_t least = a.element == ValueType::String ? 8 : 12;
  LOOM_CHECK(a.count <= in.left() / least, "truncated file: ", what, " is an array of ", a.count, " ",
             value_type_name(a.element), " but only ", in.left(), " bytes remain");
  a.items.reserve(static_cast<size_t>(a.count));
  for (uint64_t i = 0; i < a.count; ++i) {
    a.items.push_back(read_value(in, a.element, depth + 1, str(what, "[", i, "]")));
  }
  return a;
}

Value read_value(Cursor& in, ValueType type, int depth, const std::string& what) {
  switch (type) {
    case ValueType::U8: return scalar_value<uint8_t>(in, what);
    case ValueType::I8: return scalar_value<int8_t>(in, what);
    case ValueType::U16: return scalar_value<uint16_t>(in, what);
    case ValueType::I16: return scalar_value<int16_t>(in, what);
    case ValueType::U32: return scalar_value<uint32_t>(in, what);
    case ValueType::I32: return scalar_value<int32_t>(in, what);
    case ValueType::F32: return scalar_value<float>(in, what);
    case ValueType::Bool: {
      const uint8_t b = in.read<uint8_t>(what);
      LOOM_CHECK(b <= 1, what, ": bool is ", static_cast<int>(b), " (must be 0 or 1)");
      return Value{b == 1};
    }
    case ValueType::String: return Value{std::string(in.string(what))};
    case ValueType::Array: return Value{read_array(in, depth, what)};
    case ValueType::U64: return scalar_value<uint64_t>(in, what);
    case ValueType::I64: return scalar_value<int64_t>(in, what);
    case ValueType::F64: return scalar_value<double>(in, what);
  }
  LOOM_ASSERT(false, "unhandled GGUF value type ", static_cast<uint32_t>(type));
  return {};
}

uint64_t align_up(uint64_t x, uint64_t alignment, const std::string& what) {
  const uint64_t rem = x % alignment;
  if (rem == 0) return x;
  uint64_t out = 0;
  LOOM_CHECK(!__builtin_add_overflow(x, alignment - rem, &out), what, ": offset ", x, " overflows when aligned to ",
             alignment);
  return out;
}

std::string dims_string(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// Bytes of a tensor of type `type` and dims `ne` (ggml order), checked; refuses what ggml would.
uint64_t tensor_bytes(const std::string& name, quant::QuantType type, const std::vector<uint64_t>& ne) {
  LOOM_CHECK(!ne.empty() && ne.size() <= static_cast<size_t>(kMaxDims), "tensor ", quoted(name), " has ", ne.size(),
             " dimensions (GGUF allows 1 to ", kMaxDims, ")");
  uint64_t numel = 1;
  for (uint64_t d : ne) {
    LOOM_CHECK(d >= 1, "tensor ", quoted(name), " has a dimension of size 0: ne = ", dims_string(ne));
    LOOM_CHECK(d <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(numel, d, &numel) &&
                   numel <= static_cast<uint64_t>(INT64_MAX),
               "tensor ", quoted(name), ": ne = ", dims_string(ne), " has more than 2^63 elements");
  }
  const int64_t block = quant::block_elements(type);
  LOOM_CHECK(ne[0] % static_cast<uint64_t>(block) == 0, "tensor ", quoted(name), ": its rows of ne[0] = ", ne[0],
             " elements are not a whole number of ", quant::quant_type_name(type), " blocks of ", block);
  // ne[0] < 2^63 (checked above), but its byte size may not be: checked before quant::row_bytes works in int64.
  const uint64_t blocks = ne[0] / static_cast<uint64_t>(block);
  LOOM_CHECK(blocks <= static_cast<uint64_t>(INT64_MAX / quant::block_bytes(type)), "tensor ", quoted(name), ": ne = ",
             dims_string(ne), " of ", quant::quant_type_name(type), " has rows of more than 2^63 bytes");
  const uint64_t row = static_cast<uint64_t>(quant::row_bytes(type, static_cast<int64_t>(ne[0])));
  uint64_t bytes = row;
  for (size_t i = 1; i < ne.size(); ++i) {
    LOOM_CHECK(!__builtin_mul_overflow(bytes, ne[i], &bytes), "tensor ", quoted(name), ": ne = ", dims_string(ne),
               " of ", quant::quant_type_name(type), " has more than 2^64 bytes");
  }
  return bytes;
}

}  // namespace

const char* value_type_name(ValueType type) {
  const auto i = static_cast<size_t>(type);
  return i < std::size(kTypeNames) ? kTypeNames[i] : "unknown";
}

std::string quoted(std::string_view text) { return io::quote_name(text); }

// ---- values ---------------------------------------------------------------------------------------

bool Value::is_integer() const {
  const ValueType t = type();
  return t != ValueType::F32 && t != ValueType::F64 && t != ValueType::Bool && t != ValueType::String &&
         t != ValueType::Array;
}

std::string Value::describe() const {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return "string " + quoted(x);
        } else if constexpr (std::is_same_v<T, Array>) {
          return str("array of ", x.count, " ", value_type_name(x.element));
        } else if constexpr (std::is_same_v<T, bool>) {
          return x ? "bool true" : "bool false";
        } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
          return str(value_type_name(type()), " ", static_cast<int>(x));
        } else {
          return str(value_type_name(type()), " ", x);
        }
      },
      v);
}

namespace {
template <typename T>
T load(const std::string& raw, uint64_t i) {
  T v;
  std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
  return v;
}
}  // namespace

int64_t Array::integer(uint64_t i) const {
  LOOM_CHECK(i < count, "array index ", i, " out of range (", count, " elements)");
  switch (element) {
    case ValueType::U8: return load<uint8_t>(raw, i);
    case ValueType::I8: return load<int8_t>(raw, i);
    case ValueType::U16: return load<uint16_t>(raw, i);
    case ValueType::I16: return load<int16_t>(raw, i);
    case ValueType::U32: return load<uint32_t>(raw, i);
    case ValueType::I32: return load<int32_t>(raw, i);
    case ValueType::Bool: return load<uint8_t>(raw, i);
    case ValueType::I64: return load<int64_t>(raw, i);
    case ValueType::U64: {
      const uint64_t u = load<uint64_t>(raw, i);
      LOOM_CHECK(u <= static_cast<uint64_t>(INT64_MAX), "array element ", i, " is u64 ", u, ", too large");
      return static_cast<int64_t>(u);
    }
    default: LOOM_FAIL("an array of ", value_type_name(element), " where integers were expected");
  }
}

double Array::number(uint64_t i) const {
  if (element == ValueType::F32) {
    LOOM_CHECK(i < count, "array index ", i, " out of range (", count, " elements)");
    return load<float>(raw, i);
  }
  if (element == ValueType::F64) {
    LOOM_CHECK(i < count, "array index ", i, " out of range (", count, " elements)");
    return load<double>(raw, i);
  }
  return static_cast<double>(integer(i));
}

const std::string& Array::string(uint64_t i) const {
  LOOM_CHECK(element == ValueType::String, "an array of ", value_type_name(element), " where strings were expected");
  LOOM_CHECK(i < count, "array index ", i, " out of range (", count, " elements)");
  return std::get<std::string>(items[i].v);
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  return n;
}

const Value* Header::find(std::string_view key) const {
  auto it = key_index.find(std::string(key));
  return it == key_index.end() ? nullptr : &metadata[it->second].value;
}

const TensorInfo* Header::find_tensor(std::string_view name) const {
  auto it = tensor_index.find(std::string(name));
  return it == tensor_index.end() ? nullptr : &tensors[it->second];
}

namespace {
const Value& require_key(const Header& h, std::string_view key) {
  const Value* v = h.find(key);
  LOOM_CHECK(v != nullptr, "metadata key ", quoted(key), " is missing");
  return *v;
}
[[noreturn]] void wrong_kind(std::string_view key, const Value& v, const char* wanted) {
  LOOM_FAIL("metadata key ", quoted(key), " is ", v.describe(), ", expected ", wanted);
}
}  // namespace

uint64_t Header::get_uint(std::string_view key) const {
  const Value& v = require_key(*this, key);
  if (!v.is_integer()) wrong_kind(key, v, "a non-negative integer");
  return std::visit(
      [&](const auto& x) -> uint64_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_signed_v<T>) {
            if (x < 0) wrong_kind(key, v, "a non-negative integer");
          }
          return static_cast<uint64_t>(x);
        } else {
          wrong_kind(key, v, "a non-negative integer");
        }
      },
      v.v);
}

double Header::get_number(std::string_view key) const {
  const Value& v = require_key(*this, key);
  if (const float* f = std::get_if<float>(&v.v)) return *f;
  if (const double* d = std::get_if<double>(&v.v)) return *d;
  if (!v.is_integer()) wrong_kind(key, v, "a number");
  if (const int64_t* i = std::get_if<int64_t>(&v.v)) return static_cast<double>(*i);
  if (const int32_t* i = std::get_if<int32_t>(&v.v)) return *i;
  if (const int16_t* i = std::get_if<int16_t>(&v.v)) return *i;
  if (const int8_t* i = std::get_if<int8_t>(&v.v)) return *i;
  return static_cast<double>(get_uint(key));
}

bool Header::get_bool(std::string_view key) const {
  const Value& v = require_key(*this, key);
  const bool* b = std::get_if<bool>(&v.v);
  if (!b) wrong_kind(key, v, "a bool");
  return *b;
}

const std::string& Header::get_string(std::string_view key) const {
  const Value& v = require_key(*this, key);
  const std::string* s = std::get_if<std::string>(&v.v);
  if (!s) wrong_kind(key, v, "a string");
  return *s;
}

const Array& Header::get_array(std::string_view key) const {
  const Value& v = require_key(*this, key);
  const Array* a = std::get_if<Array>(&v.v);
  if (!a) wrong_kind(key, v, "an array");
  return *a;
}

// ---- reading --------------------------------------------------------------------------------------

Header parse_gguf(const uint8_t* data, size_t size) {
  Cursor in(data, size);
  Header h;
  const std::string_view magic = in.bytes(4, "the magic \"GGUF\"");
  LOOM_CHECK(magic == "GGUF", "not a GGUF file: it starts with ", quoted(magic), ", not \"GGUF\"");
  h.version = in.read<uint32_t>("the version");
  LOOM_CHECK(h.version == 3 || h.version == 2, "GGUF version ", h.version, " is not supported (loom reads 3, and 2",
             h.version == 1 ? "; version 1 used 32-bit counts and is obsolete" : "",
             __builtin_bswap32(h.version) == 3 || __builtin_bswap32(h.version) == 2 ? "; this looks like a big-endian file" : "",
             ")");
  const uint64_t tensor_count = in.read<uint64_t>("the tensor count");
  const uint64_t kv_count = in.read<uint64_t>("the metadata count");
  // Each entry takes at least 13 bytes (8-byte key length, 1 key byte, 4-byte type), each tensor info
  // at least 8 + 4 + 8 + 4 + 8 bytes: counts the file cannot hold are refused before any allocation.
  LOOM_CHECK(kv_count <= in.left() / 13, "truncated file: ", kv_count, " metadata entries cannot fit in the ",
             in.left(), " bytes left");
  h.metadata.reserve(static_cast<size_t>(kv_count));
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string what = str("metadata entry ", i);
    const std::string_view key = in.string(what + "'s key");
    LOOM_CHECK(!key.empty(), what, " has an empty key");
    LOOM_CHECK(key.size() <= kMaxKeyBytes, what, "'s key is ", key.size(), " bytes long (at most ", kMaxKeyBytes,
               " allowed)");
    check_utf8(key, what + "'s key");
    const std::string key_what = str("metadata ", quoted(key));
    const ValueType type = read_value_type(in, key_what);
    Value value = read_value(in, type, 0, key_what);
    LOOM_CHECK(h.key_index.emplace(std::string(key), h.metadata.size()).second, "metadata key ", quoted(key),
               " appears twice");
    h.metadata.push_back({std::string(key), std::move(value)});
  }

  if (const Value* a = h.find("general.alignment")) {
    const uint32_t* u = std::get_if<uint32_t>(&a->v);
    LOOM_CHECK(u != nullptr, "metadata \"general.alignment\" is ", a->describe(), ", expected a u32");
    LOOM_CHECK(*u != 0 && (*u & (*u - 1)) == 0, "metadata \"general.alignment\" is ", *u,
               ", expected a power of two");
    h.alignment = *u;
  }

  LOOM_CHECK(tensor_count <= in.left() / 32, "truncated file: ", tensor_count, " tensor infos cannot fit in the ",
             in.left(), " bytes left");
  h.tensors.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    const std::string what = str("tensor info ", i);
    t.name = std::string(in.string(what + "'s name"));
    LOOM_CHECK(t.name.size() <= kMaxTensorNameBytes, what, "'s name ", quoted(t.name), " is ", t.name.size(),
               " bytes long (ggml allows at most ", kMaxTensorNameBytes, ")");
    check_utf8(t.name, what + "'s name");
    const std::string tw = str("tensor ", quoted(t.name));
    const uint32_t n_dims = in.read<uint32_t>(tw + "'s dimension count");
    LOOM_CHECK(n_dims >= 1 && n_dims <= static_cast<uint32_t>(kMaxDims), tw, " has ", n_dims,
               " dimensions (GGUF allows 1 to ", kMaxDims, ")");
    for (uint32_t d = 0; d < n_dims; ++d) t.ne.push_back(in.read<uint64_t>(str(tw, "'s ne[", d, "]")));
    const uint32_t type_id = in.read<uint32_t>(tw + "'s type");
    try {
      t.type = quant::quant_type_from_id(type_id);
    } catch (const Error& e) {
      LOOM_FAIL(tw, ": ", e.what());
    }
    t.offset = in.read<uint64_t>(tw + "'s offset");
    t.nbytes = tensor_bytes(t.name, t.type, t.ne);
    LOOM_CHECK(h.tensor_index.emplace(t.name, h.tensors.size()).second, "tensor name ", quoted(t.name),
               " appears twice");
    h.tensors.push_back(std::move(t));
  }

  h.data_start = align_up(in.pos(), h.alignment, "the data section");
  const uint64_t file_size = size;
  uint64_t expected = 0;  // where the next tensor must start, relative to data_start
  for (const TensorInfo& t : h.tensors) {
    const std::string tw = str("tensor ", quoted(t.name));
    LOOM_CHECK(t.offset == expected, tw, " is at offset ", t.offset, " of the data section, expected ", expected,
               " (tensors must follow each other in order, each aligned to ", h.alignment, " bytes)");
    uint64_t end = 0, file_end = 0;
    LOOM_CHECK(!__builtin_add_overflow(t.offset, t.nbytes, &end) &&
                   !__builtin_add_overflow(h.data_start, end, &file_end) && file_end <= file_size,
               "truncated file: ", tw, " (", quant::quant_type_name(t.type), ", ne = ", dims_string(t.ne), ", ",
               t.nbytes, " bytes) at data offset ", t.offset, " ends past the end of the file (data section starts at ",
               h.data_start, ", file size ", file_size, ")");
    h.data_bytes = end;
    expected = align_up(end, h.alignment, tw);
  }
  if (!h.tensors.empty()) {
    const uint64_t end = h.data_start + h.data_bytes;
    LOOM_CHECK(file_size - end < h.alignment, "the file has ", file_size - end,
               " bytes after its last tensor (at most the ", h.alignment, "-byte alignment padding may follow)");
  } else {
    LOOM_CHECK(file_size <= h.data_start, "the file has no tensors but ", file_size - in.pos(),
               " bytes after its tensor infos");
  }
  return h;
}

// ---- writing --------------------------------------------------------------------------------------

namespace {

class Out {
 public:
  explicit Out(const ByteSink& sink) : sink_(sink) {}
  void bytes(const void* p, size_t n) {
    if (n) sink_(p, n);
    written_ += n;
  }
  template <typename T>
  void put(T v) {
    bytes(&v, sizeof v);
  }
  void string(std::string_view s) {
    put<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const char zeros[256] = {};
    uint64_t n = (alignment - written_ % alignment) % alignment;
    while (n) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof zeros));
      bytes(zeros, k);
      n -= k;
    }
  }
  uint64_t written() const { return written_; }

 private:
  const ByteSink& sink_;
  uint64_t written_ = 0;
};

void check_value(const Value& v, int depth, const std::string& what) {
  if (const Array* a = std::get_if<Array>(&v.v)) {
    LOOM_CHECK(depth < kMaxArrayDepth, what, ": arrays nested more than ", kMaxArrayDepth, " deep");
    LOOM_CHECK(a->element <= ValueType::F64, what, ": unknown element type ", static_cast<uint32_t>(a->element));
    if (is_scalar(a->element)) {
      LOOM_CHECK(a->items.empty() && a->raw.size() == a->count * scalar_bytes(a->element), what, ": an array of ",
                 a->count, " ", value_type_name(a->element), " needs ", a->count * scalar_bytes(a->element),
                 " raw bytes, has ", a->raw.size());
    } else {
      LOOM_CHECK(a->raw.empty() && a->items.size() == a->count, what, ": an array of ", a->count, " ",
                 value_type_name(a->element), " has ", a->items.size(), " items");
      for (size_t i = 0; i < a->items.size(); ++i) {
        LOOM_CHECK(a->items[i].type() == a->element, what, "[", i, "] is ", a->items[i].describe(),
                   " in an array of ", value_type_name(a->element));
        check_value(a->items[i], depth + 1, str(what, "[", i, "]"));
      }
    }
  }
}

void write_value(Out& out, const Value& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          out.string(x);
        } else if constexpr (std::is_same_v<T, Array>) {
          out.put<uint32_t>(static_cast<uint32_t>(x.element));
          out.put<uint64_t>(x.count);
          if (is_scalar(x.element)) {
            out.bytes(x.raw.data(), x.raw.size());
          } else {
            for (const Value& item : x.items) write_value(out, item);
          }
        } else if constexpr (std::is_same_v<T, bool>) {
          out.put<uint8_t>(x ? 1 : 0);
        } else {
          out.put<T>(x);
        }
      },
      v.v);
}

}  // namespace

uint64_t write_gguf(const ByteSink& sink, const std::vector<KeyValue>& metadata, const std::vector<TensorEntry>& tensors) {
  uint32_t alignment = kDefaultAlignment;
  std::unordered_map<std::string, size_t> keys;
  for (const KeyValue& kv : metadata) {
    LOOM_CHECK(!kv.key.empty() && kv.key.size() <= kMaxKeyBytes, "GGUF writer: metadata key ", quoted(kv.key),
               " must be 1 to ", kMaxKeyBytes, " bytes long");
    check_utf8(kv.key, "GGUF writer: metadata key");
    LOOM_CHECK(keys.emplace(kv.key, 0).second, "GGUF writer: metadata key ", quoted(kv.key), " given twice");
    check_value(kv.value, 0, "GGUF writer: metadata " + quoted(kv.key));
    if (kv.key == "general.alignment") {
      const uint32_t* u = std::get_if<uint32_t>(&kv.value.v);
      LOOM_CHECK(u && *u != 0 && (*u & (*u - 1)) == 0, "GGUF writer: general.alignment is ", kv.value.describe(),
                 ", expected a u32 power of two");
      alignment = *u;
    }
  }
  std::unordered_map<std::string, size_t> names;
  for (const TensorEntry& t : tensors) {
    LOOM_CHECK(t.name.size() <= kMaxTensorNameBytes, "GGUF writer: tensor name ", quoted(t.name), " is longer than ",
               kMaxTensorNameBytes, " bytes");
    check_utf8(t.name, "GGUF writer: tensor name");
    LOOM_CHECK(names.emplace(t.name, 0).second, "GGUF writer: tensor ", quoted(t.name), " given twice");
    const uint64_t want = tensor_bytes(t.name, t.type, t.ne);
    LOOM_CHECK(t.nbytes == want, "GGUF writer: tensor ", quoted(t.name), " has ", t.nbytes, " bytes but ",
               quant::quant_type_name(t.type), " ne = ", dims_string(t.ne), " needs ", want);
  }

  Out out(sink);
  out.bytes("GGUF", 4);
  out.put<uint32_t>(3);
  out.put<uint64_t>(tensors.size());
  out.put<uint64_t>(metadata.size());
  for (const KeyValue& kv : metadata) {
    out.string(kv.key);
    out.put<uint32_t>(static_cast<uint32_t>(kv.value.type()));
    write_value(out, kv.value);
  }
  uint64_t offset = 0;
  for (const TensorEntry& t : tensors) {
    out.string(t.name);
    out.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) out.put<uint64_t>(d);
    out.put<uint32_t>(static_cast<uint32_t>(t.type));
    out.put<uint64_t>(offset);
    offset += (t.nbytes + alignment - 1) / alignment * alignment;
  }
  out.pad_to(alignment);
  for (const TensorEntry& t : tensors) {
    out.bytes(t.data, static_cast<size_t>(t.nbytes));
    out.pad_to(alignment);
  }
  return out.written();
}

Value string_array(const std::vector<std::string>& items) {
  Array a;
  a.element = ValueType::String;
  a.count = items.size();
  a.items.reserve(items.size());
  for (const auto& s : items) a.items.push_back(Value{s});
  return Value{std::move(a)};
}

std::vector<uint8_t> serialize_gguf(const std::vector<KeyValue>& metadata, const std::vector<TensorEntry>& tensors) {
  std::vector<uint8_t> bytes;
  write_gguf([&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }, metadata, tensors);
  return bytes;
}

}  // namespace loom::gguf
