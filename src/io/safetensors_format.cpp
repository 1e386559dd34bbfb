// safetensors on bytes: see safetensors_format.h for the rules and why each one is there.
#include "io/safetensors_format.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json.h"

namespace loom::io {
namespace {

using json = nlohmann::json;

struct DtypeRow {
  SafetensorsDtype dtype;
  const char* name;
  int bits;
};

// In enum order, so that kDtypes[int(d)].dtype == d (checked in safetensors_dtype_name).
constexpr DtypeRow kDtypes[] = {
    {SafetensorsDtype::BOOL, "BOOL", 8},         {SafetensorsDtype::F4, "F4", 4},
    {SafetensorsDtype::F6_E2M3, "F6_E2M3", 6},   {SafetensorsDtype::F6_E3M2, "F6_E3M2", 6},
    {SafetensorsDtype::U8, "U8", 8},             {SafetensorsDtype::I8, "I8", 8},
    {SafetensorsDtype::F8_E5M2, "F8_E5M2", 8},   {SafetensorsDtype::F8_E4M3, "F8_E4M3", 8},
    {SafetensorsDtype::F8_E8M0, "F8_E8M0", 8},   {SafetensorsDtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {SafetensorsDtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {SafetensorsDtype::I16, "I16", 16},          {SafetensorsDtype::U16, "U16", 16},
    {SafetensorsDtype::F16, "F16", 16},          {SafetensorsDtype::BF16, "BF16", 16},
    {SafetensorsDtype::I32, "I32", 32},          {SafetensorsDtype::U32, "U32", 32},
    {SafetensorsDtype::F32, "F32", 32},          {SafetensorsDtype::C64, "C64", 64},
    {SafetensorsDtype::F64, "F64", 64},          {SafetensorsDtype::I64, "I64", 64},
    {SafetensorsDtype::U64, "U64", 64},
};
static_assert(std::size(kDtypes) == static_cast<size_t>(SafetensorsDtype::U64) + 1,
              "kDtypes must list every SafetensorsDtype, in enum order");

std::string known_dtype_list() {
  std::string s;
  for (const auto& row : kDtypes) s += (s.empty() ? "" : ", ") + std::string(row.name);
  return s;
}

std::string hex_byte(uint8_t b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

// A JSON value for an error message, cut short (without serializing the rest of it).
std::string brief(const json& v) { return brief_json(v, 57); }

std::string offsets_string(uint64_t begin, uint64_t end) {
  return str("[", begin, ", ", end, "]");
}

// Parses `text` as JSON, refusing duplicate keys in any object. nlohmann (like serde_json) would keep
// the last duplicate silently; its parser callback sees every key as it is read, before the DOM merges
// them, so one set of seen keys per open object finds them.
json parse_json_rejecting_duplicates(const uint8_t* text, size_t n) {
  std::vector<std::unordered_set<std::string>> seen;  // one per open object, innermost last
  std::vector<std::string> owners;                    // the key each open object hangs from
  std::string last_key;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
        owners.push_back(seen.empty() ? std::string() : last_key);
        seen.emplace_back();
        break;
      case json::parse_event_t::object_end:
        seen.pop_back();
        owners.pop_back();
        break;
      case json::parse_event_t::key: {
        std::string key = parsed.get<std::string>();
        if (!seen.back().insert(key).second) {
          if (seen.size() == 1) {
            LOOM_FAIL("duplicate tensor name ", quote_name(key), " in the header");
          }
          if (seen.size() == 2 && owners.back() == kSafetensorsMetadataKey) {
            LOOM_FAIL("duplicate key ", quote_name(key), " in __metadata__");
          }
          LOOM_FAIL("duplicate key ", quote_name(key), " in the header entry for ",
                    quote_name(owners.back()));
        }
        last_key = std::move(key);
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, text + n, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    LOOM_FAIL("header is not valid JSON: ", brief_parse_error(e.what()));
  }
}

uint64_t get_u64(const json& v, const std::string& tensor, const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  LOOM_FAIL("tensor ", quote_name(tensor), ": ", what, " is ", brief(v),
            ", but must be a non-negative integer below 2^64");
}

// The byte size of `numel` elements of `dtype`, or an error if it overflows or is not whole bytes.
uint64_t checked_nbytes(const std::string& tensor, SafetensorsDtype dtype,
                        const std::vector<uint64_t>& shape) {
  uint64_t numel = 1;
  for (uint64_t d : shape) {
    LOOM_CHECK(!__builtin_mul_overflow(numel, d, &numel), "tensor ", quote_name(tensor), ": shape ",
               shape_string(shape), " has more than 2^64 elements (the element count overflows)");
  }
  uint64_t bits = 0;
  LOOM_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(safetensors_dtype_bits(dtype)), &bits),
             "tensor ", quote_name(tensor), ": shape ", shape_string(shape), " of ",
             safetensors_dtype_name(dtype), " is larger than 2^64 bits (the byte size overflows)");
  LOOM_CHECK(bits % 8 == 0, "tensor ", quote_name(tensor), ": ", numel, " elements of ",
             safetensors_dtype_name(dtype), " (", safetensors_dtype_bits(dtype),
             " bits each) do not fill a whole number of bytes");
  return bits / 8;
}

SafetensorsTensorInfo parse_tensor_entry(const std::string& name, const json& entry) {
  LOOM_CHECK(entry.is_object(), "tensor ", quote_name(name), ": header entry is ", brief(entry),
             ", but must be an object with dtype, shape and data_offsets");
  for (const auto& [field, value] : entry.items()) {
    LOOM_CHECK(field == "dtype" || field == "shape" || field == "data_offsets", "tensor ",
               quote_name(name), ": unknown field ", quote_name(field),
               " (expected dtype, shape and data_offsets)");
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    LOOM_CHECK(entry.contains(field), "tensor ", quote_name(name), ": missing field '", field, "'");
  }
  SafetensorsTensorInfo info;
  info.name = name;

  const json& dtype = entry["dtype"];
  LOOM_CHECK(dtype.is_string(), "tensor ", quote_name(name), ": dtype is ", brief(dtype),
             ", but must be a string");
  auto parsed = safetensors_dtype_from_name(dtype.get<std::string>());
  LOOM_CHECK(parsed.has_value(), "tensor ", quote_name(name), ": unknown dtype ",
             quote_name(dtype.get<std::string>()), " (known: ", known_dtype_list(), ")");
  info.dtype = *parsed;

  const json& shape = entry["shape"];
  LOOM_CHECK(shape.is_array(), "tensor ", quote_name(name), ": shape is ", brief(shape),
             ", but must be an array of dimensions");
  for (size_t i = 0; i < shape.size(); ++i) {
    info.shape.push_back(get_u64(shape[i], name, ("shape entry " + std::to_string(i)).c_str()));
  }

  const json& offsets = entry["data_offsets"];
  LOOM_CHECK(offsets.is_array() && offsets.size() == 2, "tensor ", quote_name(name),
             ": data_offsets is ", brief(offsets), ", but must be [begin, end]");
  info.begin = get_u64(offsets[0], name, "data_offsets[0]");
  info.end = get_u64(offsets[1], name, "data_offsets[1]");
  LOOM_CHECK(info.begin <= info.end, "tensor ", quote_name(name), ": data_offsets ",
             offsets_string(info.begin, info.end), " end before they begin");

  uint64_t expected = checked_nbytes(name, info.dtype, info.shape);
  LOOM_CHECK(expected == info.nbytes(), "tensor ", quote_name(name), ": shape ", shape_string(info.shape),
             " of ", safetensors_dtype_name(info.dtype), " needs ", expected, " bytes, but data_offsets ",
             offsets_string(info.begin, info.end), " span ", info.nbytes(), " bytes");
  return info;
}

void parse_metadata(const json& value, SafetensorsHeader& header) {
  if (value.is_null()) return;  // the reference reads `null` as "no metadata"
  LOOM_CHECK(value.is_object(), "__metadata__ is ", brief(value),
             ", but must be an object of string values");
  header.has_metadata = true;
  for (const auto& [key, v] : value.items()) {
    LOOM_CHECK(v.is_string(), "__metadata__ value for key ", quote_name(key), " is a ", v.type_name(),
               " (", brief(v), "), but metadata values must be strings");
    header.metadata.emplace(key, v.get<std::string>());
  }
}

}  // namespace

const char* safetensors_dtype_name(SafetensorsDtype dtype) {
  const auto i = static_cast<size_t>(dtype);
  LOOM_ASSERT(i < std::size(kDtypes) && kDtypes[i].dtype == dtype, "bad SafetensorsDtype ", i);
  return kDtypes[i].name;
}

std::optional<SafetensorsDtype> safetensors_dtype_from_name(std::string_view name) {
  for (const auto& row : kDtypes) {
    if (name == row.name) return row.dtype;
  }
  return std::nullopt;
}

int safetensors_dtype_bits(SafetensorsDtype dtype) {
  const auto i = static_cast<size_t>(dtype);
  LOOM_ASSERT(i < std::size(kDtypes), "bad SafetensorsDtype ", i);
  return kDtypes[i].bits;
}

uint64_t SafetensorsTensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

const SafetensorsTensorInfo* SafetensorsHeader::find(std::string_view name) const {
  auto it = index.find(std::string(name));
  return it == index.end() ? nullptr : &tensors[it->second];
}

std::optional<size_t> find_invalid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;  // a continuation byte without a lead, or 0xF8..0xFF
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      const uint8_t d = s[i + k];
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong encodings, UTF-16 surrogates and code points past Unicode's end are not UTF-8.
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::nullopt;
}

std::string quote_name(std::string_view name) {
  constexpr size_t kMaxShown = 100;
  const bool utf8 = !find_invalid_utf8(reinterpret_cast<const uint8_t*>(name.data()), name.size());
  std::string_view shown = name;
  if (shown.size() > kMaxShown) {
    size_t cut = kMaxShown;
    while (utf8 && cut > 0 && (static_cast<uint8_t>(name[cut]) & 0xC0) == 0x80) --cut;  // whole chars
    shown = name.substr(0, cut);
  }
  std::string out = "'";
  for (char ch : shown) {
    const auto b = static_cast<uint8_t>(ch);
    if (ch == '\'' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (b < 0x20 || b == 0x7f || (!utf8 && b >= 0x80)) {
      out += "\\x" + hex_byte(b).substr(2);
    } else {
      out += ch;
    }
  }
  out += "'";
  if (shown.size() < name.size()) out += str("... (", name.size(), " bytes)");
  return out;
}

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size) {
  LOOM_CHECK(size >= 8, "file is ", size, " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian u64
  if (n > kSafetensorsMaxHeaderBytes || n > size - 8) {
    // A user who passes the wrong file (a tokenizer.json, a GGUF) would otherwise only hear about an
    // absurd header length: say what the file looks like instead.
    if (std::memcmp(data, "GGUF", 4) == 0) {
      LOOM_FAIL("this is a GGUF file, not safetensors (it starts with the magic 'GGUF'); name it with a "
                ".gguf extension so loom reads it as GGUF");
    }
    bool text = true;
    for (int i = 0; i < 8; ++i) text = text && (data[i] == '\n' || data[i] == '\r' || data[i] == '\t' ||
                                                (data[i] >= 0x20 && data[i] < 0x7f));
    if (text) {
      LOOM_FAIL("not a safetensors file: it starts with the text '",
                std::string(reinterpret_cast<const char*>(data), 8),
                "', while a safetensors file starts with an 8-byte little-endian header length");
    }
  }
  LOOM_CHECK(n <= kSafetensorsMaxHeaderBytes, "header length ", n, " exceeds the limit of ",
             kSafetensorsMaxHeaderBytes, " bytes");
  LOOM_CHECK(n <= size - 8, "header length ", n, " runs past the end of the file (", size,
             " bytes, which leaves at most ", size - 8, " bytes for the header)");
  LOOM_CHECK(n > 0, "header length is 0; the header must be a JSON object");

  const uint8_t* text = data + 8;
  if (auto bad = find_invalid_utf8(text, n)) {
    LOOM_FAIL("header is not valid UTF-8: byte ", hex_byte(text[*bad]), " at header offset ", *bad,
              " (file offset ", 8 + *bad, ") does not start a valid UTF-8 sequence");
  }
  if (const void* nul = std::memchr(text, 0, n)) {
    LOOM_FAIL("header contains a NUL byte at header offset ", static_cast<const uint8_t*>(nul) - text);
  }
  LOOM_CHECK(text[0] == '{', "header must start with '{', but its first byte is ", hex_byte(text[0]));
  // A real header nests 3 deep; one nested 70,000 deep used to overflow the stack in brief()'s dump().
  check_json_limits(std::string_view(reinterpret_cast<const char*>(text), n), "header",
                    JsonLimits{.max_depth = 64, .max_bytes = kSafetensorsMaxHeaderBytes});

  const json root = parse_json_rejecting_duplicates(text, n);
  LOOM_CHECK(root.is_object(), "header must be a JSON object, got ", root.type_name());

  SafetensorsHeader header;
  header.header_bytes = n;
  header.data_bytes = size - 8 - n;
  for (const auto& [key, value] : root.items()) {
    if (key == kSafetensorsMetadataKey) {
      parse_metadata(value, header);
    } else {
      header.tensors.push_back(parse_tensor_entry(key, value));
    }
  }

  // File order. The reference sorts by offsets too: older writers ordered the header differently.
  std::sort(header.tensors.begin(), header.tensors.end(), [](const auto& a, const auto& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  uint64_t covered = 0;  // the tensors so far cover data bytes [0, covered)
  const SafetensorsTensorInfo* prev = nullptr;
  for (const auto& t : header.tensors) {
    if (t.begin < covered) {
      LOOM_FAIL("tensors ", quote_name(prev->name), " (data_offsets ", offsets_string(prev->begin, prev->end),
                ") and ", quote_name(t.name), " (data_offsets ", offsets_string(t.begin, t.end), ") overlap");
    }
    if (t.begin > covered) {
      if (prev == nullptr) {
        LOOM_FAIL("gap in the data section: the first tensor ", quote_name(t.name), " starts at offset ",
                  t.begin, ", so data bytes [0, ", t.begin, ") belong to no tensor");
      }
      LOOM_FAIL("gap in the data section: data bytes [", covered, ", ", t.begin,
                ") between tensor ", quote_name(prev->name), " (data_offsets ",
                offsets_string(prev->begin, prev->end), ") and tensor ", quote_name(t.name),
                " (data_offsets ", offsets_string(t.begin, t.end), ") belong to no tensor");
    }
    covered = t.end;
    prev = &t;
  }
  if (covered > header.data_bytes) {
    const auto& t = *std::find_if(header.tensors.begin(), header.tensors.end(),
                                  [&](const auto& x) { return x.end > header.data_bytes; });
    LOOM_FAIL("file is truncated: tensor ", quote_name(t.name), " has data_offsets ",
              offsets_string(t.begin, t.end), ", but the data section holds only ", header.data_bytes,
              " bytes (file is ", size, " bytes, header ", n, ")");
  }
  LOOM_CHECK(covered == header.data_bytes, header.data_bytes - covered,
             " trailing bytes after the last tensor: the tensors cover data bytes [0, ", covered,
             ") of a ", header.data_bytes, "-byte data section");

  for (size_t i = 0; i < header.tensors.size(); ++i) header.index.emplace(header.tensors[i].name, i);
  return header;
}

SafetensorsLayout plan_safetensors_layout(const std::vector<SafetensorsEntry>& entries,
                                          const std::map<std::string, std::string>& metadata) {
  auto valid_utf8 = [](const std::string& s) {
    return !find_invalid_utf8(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  std::unordered_set<std::string_view> names;
  for (const auto& e : entries) {
    LOOM_CHECK(e.name != kSafetensorsMetadataKey, "write_safetensors: a tensor cannot be named ",
               kSafetensorsMetadataKey);
    LOOM_CHECK(valid_utf8(e.name), "write_safetensors: tensor name ", quote_name(e.name),
               " is not valid UTF-8");
    LOOM_CHECK(names.insert(e.name).second, "write_safetensors: two tensors are named ", quote_name(e.name));
    uint64_t expected = checked_nbytes(e.name, e.dtype, e.shape);
    LOOM_CHECK(expected == e.nbytes, "write_safetensors: tensor ", quote_name(e.name), " has ", e.nbytes,
               " bytes, but shape ", shape_string(e.shape), " of ", safetensors_dtype_name(e.dtype),
               " needs ", expected);
    LOOM_CHECK(e.data != nullptr || e.nbytes == 0, "write_safetensors: tensor ", quote_name(e.name),
               " has no data");
  }
  for (const auto& [k, v] : metadata) {
    LOOM_CHECK(valid_utf8(k) && valid_utf8(v), "write_safetensors: metadata entry ", quote_name(k),
               " is not valid UTF-8");
  }

  SafetensorsLayout layout;
  layout.order.resize(entries.size());
  std::iota(layout.order.begin(), layout.order.end(), size_t{0});
  // The reference's order: descending dtype (widest first keeps every tensor aligned), then name.
  std::sort(layout.order.begin(), layout.order.end(), [&](size_t a, size_t b) {
    if (entries[a].dtype != entries[b].dtype) return entries[a].dtype > entries[b].dtype;
    return entries[a].name < entries[b].name;
  });

  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;  // std::map: sorted keys, so deterministic
    root[kSafetensorsMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (size_t i : layout.order) {
    const auto& e = entries[i];
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = safetensors_dtype_name(e.dtype);
    info["shape"] = e.shape;
    info["data_offsets"] = {offset, offset + e.nbytes};
    root[e.name] = std::move(info);
    offset += e.nbytes;
  }
  layout.data_bytes = offset;

  std::string text = root.dump();  // compact, as serde_json::to_string writes it
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so that the data section starts 8-aligned
  LOOM_CHECK(text.size() <= kSafetensorsMaxHeaderBytes, "write_safetensors: the header would be ",
             text.size(), " bytes, over the format's limit of ", kSafetensorsMaxHeaderBytes);
  layout.prefix.resize(8);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) layout.prefix[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  layout.prefix += text;
  return layout;
}

std::vector<uint8_t> serialize_safetensors(const std::vector<SafetensorsEntry>& entries,
                                           const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout layout = plan_safetensors_layout(entries, metadata);
  std::vector<uint8_t> out(layout.prefix.begin(), layout.prefix.end());
  out.reserve(layout.file_bytes());
  for (size_t i : layout.order) {
    if (entries[i].nbytes == 0) continue;
    const auto* p = static_cast<const uint8_t*>(entries[i].data);
    out.insert(out.end(), p, p + entries[i].nbytes);
  }
  return out;
}

}  // namespace loom::io
