#include "data/corpus.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("corpus: cannot open ", path));
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Special SEXPTYPE codes used only in the stream (serialize.c).
constexpr int kRefSxp = 255, kNilValueSxp = 254, kGlobalEnvSxp = 253, kUnboundValueSxp = 252,
              kMissingArgSxp = 251, kBaseNamespaceSxp = 250, kEmptyEnvSxp = 242, kBaseEnvSxp = 241;
// CHARSXP encoding bits in the "levels" part of the flags.
constexpr int kLatin1Mask = 1 << 2;

// A big-endian (XDR) reader over the serialised bytes that names the offset in its errors.
class XdrReader {
 public:
  explicit XdrReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  void need(size_t n) const {
    LOOM_CHECK(pos_ + n <= bytes_.size(), "R serialisation: truncated at byte ", pos_, ": need ", n,
               " more bytes but only ", bytes_.size() - pos_, " remain");
  }
  int32_t read_int() {
    need(4);
    uint32_t u = (uint32_t{bytes_[pos_]} << 24) | (uint32_t{bytes_[pos_ + 1]} << 16) |
                 (uint32_t{bytes_[pos_ + 2]} << 8) | uint32_t{bytes_[pos_ + 3]};
    pos_ += 4;
    return static_cast<int32_t>(u);
  }
  double read_double() {
    need(8);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | bytes_[pos_ + i];
    pos_ += 8;
    double d;
    std::memcpy(&d, &u, 8);
    return d;
  }
  std::string read_bytes(size_t n) {
    need(n);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  size_t pos() const { return pos_; }
  bool at_end() const { return pos_ == bytes_.size(); }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

std::string latin1_to_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

class RParser {
 public:
  explicit RParser(std::span<const uint8_t> bytes) : in_(bytes) {}

  RObject parse() {
    std::string format = in_.read_bytes(2);
    LOOM_CHECK(format == "X\n", "R serialisation: only the XDR format (\"X\\n\") is supported, got ",
               format == "A\n" ? "ASCII" : format == "B\n" ? "native binary" : "an unknown header");
    int32_t version = in_.read_int();
    LOOM_CHECK(version == 2 || version == 3, "R serialisation: format version ", version,
               " is not supported (expected 2 or 3)");
    in_.read_int();  // the writer's R version
    in_.read_int();  // the minimal reader R version
    if (version == 3) {
      int32_t nelen = in_.read_int();
      LOOM_CHECK(nelen >= 0 && nelen < 1024, "R serialisation: bad native-encoding length ", nelen);
      in_.read_bytes(static_cast<size_t>(nelen));
    }
    return read_item();
  }

 private:
  int64_t read_length() {
    int32_t len = in_.read_int();
    if (len == -1) {  // a long vector: two more ints, upper and lower 32 bits
      int64_t hi = in_.read_int(), lo = static_cast<uint32_t>(in_.read_int());
      int64_t n = (hi << 32) + lo;
      LOOM_CHECK(n >= 0, "R serialisation: bad long vector length ", n);
      return n;
    }
    LOOM_CHECK(len >= 0, "R serialisation: negative length ", len, " at byte ", in_.pos() - 4);
    return len;
  }

  // Bounds a declared element count by what the remaining bytes could hold, so a corrupt length fails
  // with a message instead of a huge allocation.
  void check_count(int64_t n, size_t min_bytes_each) {
    in_.need(static_cast<size_t>(n) * min_bytes_each);
  }

  RObject read_charsxp_body(int levels, bool has_attr) {
    RObject obj;
    obj.type = kRChar;
    int32_t len = in_.read_int();
    if (len == -1) {
      obj.strings.push_back(std::nullopt);  // NA_STRING
    } else {
      LOOM_CHECK(len >= 0, "R serialisation: negative string length ", len);
      std::string s = in_.read_bytes(static_cast<size_t>(len));
      obj.strings.push_back((levels & kLatin1Mask) ? latin1_to_utf8(s) : s);
    }
    if (has_attr) read_item();  // R reads and drops a CHARSXP's attributes
    return obj;
  }

  std::optional<std::string> read_string_element() {
    size_t at = in_.pos();
    int32_t flags = in_.read_int();
    int type = flags & 0xFF;
    LOOM_CHECK(type == kRChar, "R serialisation: a character vector element at byte ", at,
               " has SEXPTYPE ", type, ", expected CHARSXP (9)");
    return read_charsxp_body(flags >> 12, (flags & (1 << 9)) != 0).strings[0];
  }

  void read_attributes(RObject& obj) {
    RObject attrs = read_item();
    LOOM_CHECK(attrs.type == kRPairList, "R serialisation: attributes must be a pairlist, got SEXPTYPE ",
               attrs.type);
    for (size_t i = 0; i < attrs.items.size(); ++i) {
      obj.attributes.emplace_back(attrs.tags[i], std::move(attrs.items[i]));
    }
  }

  std::string read_tag() {
    RObject tag = read_item();
    if (tag.type == kRNil) return "";
    LOOM_CHECK(tag.type == kRSymbol, "R serialisation: a pairlist tag must be a symbol, got SEXPTYPE ",
               tag.type);
    return tag.strings[0].value_or("NA");
  }

  RObject read_item() {
    LOOM_CHECK(++depth_ < 512, "R serialisation: objects nested deeper than 512 levels");
    size_t at = in_.pos();
    int32_t flags = in_.read_int();
    int type = flags & 0xFF;
    int levels = flags >> 12;
    bool has_attr = (flags & (1 << 9)) != 0;
    bool has_tag = (flags & (1 << 10)) != 0;
    RObject obj;
    switch (type) {
      case kNilValueSxp:
      case kGlobalEnvSxp:
      case kUnboundValueSxp:
      case kMissingArgSxp:
      case kBaseNamespaceSxp:
      case kEmptyEnvSxp:
      case kBaseEnvSxp:
        obj.type = kRNil;  // singletons carry no data we need
        break;
      case kRefSxp: {
        int64_t index = flags >> 8;
        if (index == 0) index = in_.read_int();
        LOOM_CHECK(index >= 1 && index <= static_cast<int64_t>(refs_.size()), "R serialisation: reference ",
                   index, " at byte ", at, " but only ", refs_.size(), " objects are referable");
        obj = refs_[static_cast<size_t>(index - 1)];
        break;
      }
      case kRSymbol: {
        RObject name = read_item();
        LOOM_CHECK(name.type == kRChar, "R serialisation: a symbol's name must be a CHARSXP, got ", name.type);
        obj.type = kRSymbol;
        obj.strings = std::move(name.strings);
        refs_.push_back(obj);
        break;
      }
      case kRPairList: {
        // A pairlist is a chain of (attributes?, tag?, car, cdr) cells; read the chain iteratively and
        // flatten it into items + tags.
        obj.type = kRPairList;
        bool cell_has_attr = has_attr, cell_has_tag = has_tag;
        for (;;) {
          if (cell_has_attr) read_item();  // attributes on pairlist cells: not needed
          obj.tags.push_back(cell_has_tag ? read_tag() : "");
          obj.items.push_back(read_item());
          size_t cdr_at = in_.pos();
          int32_t cdr_flags = in_.read_int();
          int cdr_type = cdr_flags & 0xFF;
          if (cdr_type == kNilValueSxp) break;
          LOOM_CHECK(cdr_type == kRPairList, "R serialisation: a pairlist's tail at byte ", cdr_at,
                     " has SEXPTYPE ", cdr_type, " (dotted pairs are not supported)");
          cell_has_attr = (cdr_flags & (1 << 9)) != 0;
          cell_has_tag = (cdr_flags & (1 << 10)) != 0;
        }
        --depth_;
        return obj;  // attributes were consumed per cell
      }
      case kRChar:
        obj = read_charsxp_body(levels, has_attr);
        --depth_;
        return obj;
      case kRLogical:
      case kRInteger: {
        obj.type = type;
        int64_t n = read_length();
        check_count(n, 4);
        obj.ints.resize(static_cast<size_t>(n));
        for (auto& v : obj.ints) v = in_.read_int();
        break;
      }
      case kRReal: {
        obj.type = type;
        int64_t n = read_length();
        check_count(n, 8);
        obj.reals.resize(static_cast<size_t>(n));
        for (auto& v : obj.reals) v = in_.read_double();
        break;
      }
      case kRString: {
        obj.type = type;
        int64_t n = read_length();
        check_count(n, 8);  // each element is at least flags + length
        obj.strings.reserve(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) obj.strings.push_back(read_string_element());
        break;
      }
      case kRList:
      case kRExpression: {
        obj.type = type;
        int64_t n = read_length();
        check_count(n, 4);
        obj.items.reserve(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) obj.items.push_back(read_item());
        break;
      }
      default:
        LOOM_FAIL("R serialisation: SEXPTYPE ", type, " at byte ", at,
                  " is not supported (only vectors, pairlists and symbols are)");
    }
    if (has_attr && obj.type != kRNil) read_attributes(obj);
    --depth_;
    return obj;
  }

  XdrReader in_;
  std::vector<RObject> refs_;
  int depth_ = 0;
};

}  // namespace

const RObject* RObject::attribute(const std::string& name) const {
  for (const auto& [key, value] : attributes) {
    if (key == name) return &value;
  }
  return nullptr;
}

std::vector<std::string> RObject::names() const {
  std::vector<std::string> out;
  if (const RObject* n = attribute("names")) {
    for (const auto& s : n->strings) out.push_back(s.value_or("NA"));
  }
  return out;
}

std::vector<uint8_t> inflate_bytes(std::span<const uint8_t> compressed, std::optional<size_t> expected_size) {
  z_stream zs{};
  // 15 + 32: a 32 KiB window, and detect zlib or gzip from the header.
  LOOM_CHECK(inflateInit2(&zs, 15 + 32) == Z_OK, "inflate: zlib initialisation failed");
  std::vector<uint8_t> out(expected_size.value_or(compressed.size() * 4 + 1024));
  zs.next_in = const_cast<Bytef*>(compressed.data());
  zs.avail_in = static_cast<uInt>(compressed.size());
  int rc = Z_OK;
  for (;;) {
    if (zs.total_out == out.size()) out.resize(out.size() * 2 + 1024);
    zs.next_out = out.data() + zs.total_out;
    zs.avail_out = static_cast<uInt>(out.size() - zs.total_out);
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) break;
    if (rc != Z_OK && rc != Z_BUF_ERROR) break;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) break;  // input ended before the stream did
  }
  size_t produced = zs.total_out;
  std::string msg = zs.msg ? zs.msg : "";
  inflateEnd(&zs);
  LOOM_CHECK(rc == Z_STREAM_END, "inflate: corrupt or truncated compressed data (zlib code ", rc,
             msg.empty() ? "" : ": ", msg, ") after ", produced, " output bytes");
  out.resize(produced);
  if (expected_size) {
    LOOM_CHECK(produced == *expected_size, "inflate: expected ", *expected_size, " bytes but got ", produced);
  }
  return out;
}

RObject parse_r_serialized(std::span<const uint8_t> bytes) { return RParser(bytes).parse(); }

std::map<std::string, std::pair<int64_t, int64_t>> read_lazyload_index(const std::string& rdx_path) {
  std::vector<uint8_t> packed = read_file_bytes(rdx_path);
  // R writes the index with saveRDS-style compression: gzip in practice; some writers use the
  // 4-byte-length + zlib layout of the records. Accept both.
  bool gzip = packed.size() >= 2 && packed[0] == 0x1f && packed[1] == 0x8b;
  RObject index = gzip ? parse_r_serialized(inflate_bytes(packed)) : decode_lazyload_record(packed);
  LOOM_CHECK(index.type == kRList, "corpus: ", rdx_path, " holds SEXPTYPE ", index.type, ", expected a list");
  std::vector<std::string> top = index.names();
  auto it = std::find(top.begin(), top.end(), "variables");
  LOOM_CHECK(it != top.end(), "corpus: ", rdx_path, " has no 'variables' entry");
  const RObject& vars = index.items[static_cast<size_t>(it - top.begin())];
  std::vector<std::string> names = vars.names();
  LOOM_CHECK(names.size() == vars.items.size(), "corpus: ", rdx_path, ": variables have ", names.size(),
             " names for ", vars.items.size(), " entries");
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const RObject& pos = vars.items[i];
    LOOM_CHECK(pos.type == kRInteger && pos.ints.size() == 2, "corpus: ", rdx_path, ": entry '", names[i],
               "' is not an (offset, length) integer pair");
    LOOM_CHECK(pos.ints[0] >= 0 && pos.ints[1] > 0, "corpus: ", rdx_path, ": entry '", names[i],
               "' has offset ", pos.ints[0], " and length ", pos.ints[1]);
    out[names[i]] = {pos.ints[0], pos.ints[1]};
  }
  return out;
}

RObject decode_lazyload_record(std::span<const uint8_t> record) {
  LOOM_CHECK(record.size() > 4, "corpus: a lazy-load record of ", record.size(), " bytes is too short");
  size_t uncompressed = (size_t{record[0]} << 24) | (size_t{record[1]} << 16) | (size_t{record[2]} << 8) |
                        size_t{record[3]};
  // R's other compressors (bzip2, xz) put a type byte after the length; its zlib records start with
  // a zlib header (0x78) right there.
  LOOM_CHECK(record[4] == 0x78, "corpus: record is not zlib-compressed (byte 4 is 0x", std::hex,
             int{record[4]}, "); only R's default compress=TRUE databases are supported");
  std::vector<uint8_t> raw = inflate_bytes(record.subspan(4), uncompressed);
  return parse_r_serialized(raw);
}

std::string join_lines(const RObject& obj) {
  LOOM_CHECK(obj.type == kRString, "corpus: expected a character vector, got SEXPTYPE ", obj.type);
  std::string out;
  for (const auto& line : obj.strings) {
    if (!line) continue;
    out += *line;
    out += '\n';
  }
  return out;
}

std::vector<Novel> read_austen_novels(const std::string& rdata_dir) {
  fs::path dir(rdata_dir);
  auto index = read_lazyload_index((dir / "Rdata.rdx").string());
  std::string rdb_path = (dir / "Rdata.rdb").string();
  std::vector<uint8_t> rdb = read_file_bytes(rdb_path);
  std::vector<Novel> novels;
  for (const auto& [name, where] : index) {
    auto [offset, length] = where;
    LOOM_CHECK(static_cast<uint64_t>(offset + length) <= rdb.size(), "corpus: record '", name, "' at offset ",
               offset, " with length ", length, " runs past the end of ", rdb_path, " (", rdb.size(),
               " bytes)");
    RObject obj = decode_lazyload_record(std::span<const uint8_t>(rdb).subspan(
        static_cast<size_t>(offset), static_cast<size_t>(length)));
    if (obj.type != kRString) continue;  // a data package may hold other objects; novels are text
    novels.push_back({name, join_lines(obj)});
  }
  LOOM_CHECK(!novels.empty(), "corpus: no character vectors found in ", rdata_dir);
  return novels;
}

std::vector<std::string> write_austen_corpus(const std::string& rdata_dir, const std::string& out_dir) {
  std::vector<Novel> novels = read_austen_novels(rdata_dir);
  fs::create_directories(out_dir);
  std::vector<std::string> paths;
  for (const auto& novel : novels) {
    fs::path path = fs::path(out_dir) / (novel.name + ".txt");
    std::ofstream out(path, std::ios::binary);
    out.write(novel.text.data(), static_cast<std::streamsize>(novel.text.size()));
    if (!out) throw IoError(str("corpus: cannot write ", path.string()));
    paths.push_back(path.string());
  }
  return paths;
}

}  // namespace loom::data
