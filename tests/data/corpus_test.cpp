// The R-serialisation reader behind `loom corpus austen`, on hand-built XDR blobs and (when present) on
// the real r-cran-janeaustenr database.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/corpus.h"

namespace fs = std::filesystem;
using loom::data::RObject;

namespace {

// Writes R's XDR serialisation by hand (serialize.c's layout), independently of the parser.
struct Xdr {
  std::vector<uint8_t> b;
  void i32(int32_t v) {
    auto u = static_cast<uint32_t>(v);
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(u >> s));
  }
  void header(int version = 3) {
    b.push_back('X');
    b.push_back('\n');
    i32(version);
    i32(0x040201);  // written by R 4.2.1
    i32(0x030500);  // readable by R >= 3.5.0
    if (version == 3) {
      i32(5);
      for (char c : std::string("UTF-8")) b.push_back(static_cast<uint8_t>(c));
    }
  }
  // flags = type | (has_attr << 9) | (has_tag << 10) | (levels << 12)
  void flags(int type, bool attr = false, bool tag = false, int levels = 0) {
    i32(type | (attr ? 1 << 9 : 0) | (tag ? 1 << 10 : 0) | (levels << 12));
  }
  void charsxp(const std::string& s, int levels = 64 /* ASCII */) {
    flags(9, false, false, levels);
    i32(static_cast<int32_t>(s.size()));
    for (char c : s) b.push_back(static_cast<uint8_t>(c));
  }
  void na_string() {
    flags(9);
    i32(-1);
  }
  void nil() { i32(254); }
};

std::vector<uint8_t> zlib_record(const std::vector<uint8_t>& raw) {
  uLongf n = compressBound(raw.size());
  std::vector<uint8_t> z(n);
  EXPECT_EQ(compress(z.data(), &n, raw.data(), raw.size()), Z_OK);
  z.resize(n);
  std::vector<uint8_t> rec;
  auto len = static_cast<uint32_t>(raw.size());
  for (int s = 24; s >= 0; s -= 8) rec.push_back(static_cast<uint8_t>(len >> s));
  rec.insert(rec.end(), z.begin(), z.end());
  return rec;
}

std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& raw) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, raw.size()) + 64);
  zs.next_in = const_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// c("Hello,", NA, "caf\xe9" (latin1), "") : STRSXP of 4.
void write_text_vector(Xdr& x) {
  x.flags(16);
  x.i32(4);
  x.charsxp("Hello,");
  x.na_string();
  x.charsxp("caf\xe9", 4 /* LATIN1 */);
  x.charsxp("");
}

// The index object: list(variables = list(a = c(off, len), b = ...), references = list(), compressed = TRUE)
// with "names" attributes; the second "names" symbol is written as a back-reference (REFSXP), as R does.
std::vector<uint8_t> index_blob(const std::vector<std::pair<std::string, std::pair<int, int>>>& vars) {
  Xdr x;
  x.header();
  x.flags(19, /*attr=*/true);
  x.i32(3);
  {  // variables
    x.flags(19, true);
    x.i32(static_cast<int32_t>(vars.size()));
    for (const auto& [name, where] : vars) {
      x.flags(13);
      x.i32(2);
      x.i32(where.first);
      x.i32(where.second);
    }
    x.flags(2, false, true);  // attribute pairlist cell with a tag
    x.flags(1);               // SYMSXP "names": ref index 1
    x.charsxp("names");
    x.flags(16);
    x.i32(static_cast<int32_t>(vars.size()));
    for (const auto& [name, where] : vars) x.charsxp(name);
    x.nil();
  }
  {  // references: an empty list
    x.flags(19);
    x.i32(0);
  }
  {  // compressed: TRUE
    x.flags(10);
    x.i32(1);
    x.i32(1);
  }
  x.flags(2, false, true);
  x.i32(255 | (1 << 8));  // REFSXP to reference 1 ("names"), index packed in the flags
  x.flags(16);
  x.i32(3);
  x.charsxp("variables");
  x.charsxp("references");
  x.charsxp("compressed");
  x.nil();
  return x.b;
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("loom_trainkit_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(RSerialize, ParsesCharacterVectorWithNaAndLatin1) {
  for (int version : {2, 3}) {
    Xdr x;
    x.header(version);
    write_text_vector(x);
    RObject obj = loom::data::parse_r_serialized(x.b);
    ASSERT_EQ(obj.type, loom::data::kRString);
    ASSERT_EQ(obj.strings.size(), 4u);
    EXPECT_EQ(*obj.strings[0], "Hello,");
    EXPECT_FALSE(obj.strings[1].has_value());
    EXPECT_EQ(*obj.strings[2], "caf\xc3\xa9");  // latin1 e-acute became UTF-8
    EXPECT_EQ(*obj.strings[3], "");
    EXPECT_EQ(loom::data::join_lines(obj), "Hello,\ncaf\xc3\xa9\n\n");
  }
}

TEST(RSerialize, ParsesNamedListWithSymbolReferences) {
  auto blob = index_blob({{"emma", {0, 10}}, {"persuasion", {10, 20}}});
  RObject obj = loom::data::parse_r_serialized(blob);
  ASSERT_EQ(obj.type, loom::data::kRList);
  EXPECT_EQ(obj.names(), (std::vector<std::string>{"variables", "references", "compressed"}));
  const RObject& vars = obj.items[0];
  EXPECT_EQ(vars.names(), (std::vector<std::string>{"emma", "persuasion"}));
  EXPECT_EQ(vars.items[1].ints, (std::vector<int32_t>{10, 20}));
  EXPECT_EQ(obj.items[2].type, loom::data::kRLogical);
}

TEST(RSerialize, RejectsMalformedInput) {
  Xdr x;
  x.header();
  write_text_vector(x);
  std::vector<uint8_t> truncated(x.b.begin(), x.b.end() - 3);
  EXPECT_THROW(loom::data::parse_r_serialized(truncated), loom::Error);
  std::vector<uint8_t> ascii = x.b;
  ascii[0] = 'A';
  try {
    loom::data::parse_r_serialized(ascii);
    FAIL() << "ASCII format accepted";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("XDR"), std::string::npos) << e.what();
  }
  Xdr env;
  env.header();
  env.flags(4);  // ENVSXP: not supported
  try {
    loom::data::parse_r_serialized(env.b);
    FAIL() << "environment accepted";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("SEXPTYPE 4"), std::string::npos) << e.what();
  }
  Xdr bad_version;
  bad_version.header(3);
  bad_version.b[5] = 7;  // version 7
  EXPECT_THROW(loom::data::parse_r_serialized(bad_version.b), loom::Error);
}

TEST(RSerialize, InflateDetectsZlibAndGzipAndRejectsGarbage) {
  std::vector<uint8_t> raw(5000);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 7 % 251);
  auto rec = zlib_record(raw);
  EXPECT_EQ(loom::data::inflate_bytes(std::span<const uint8_t>(rec).subspan(4), raw.size()), raw);
  EXPECT_EQ(loom::data::inflate_bytes(gzip_bytes(raw)), raw);
  std::vector<uint8_t> garbage(100, 0x42);
  EXPECT_THROW(loom::data::inflate_bytes(garbage), loom::Error);
  EXPECT_THROW(loom::data::inflate_bytes(std::span<const uint8_t>(rec).subspan(4), raw.size() + 1), loom::Error);
}

TEST(RSerialize, ReadsAHandMadeLazyLoadDatabase) {
  // Two character vectors and one integer vector (skipped: not text) in an .rdb, indexed by an .rdx.
  Xdr a, b, c;
  a.header();
  write_text_vector(a);
  b.header(2);
  b.flags(16);
  b.i32(2);
  b.charsxp("It is a truth universally acknowledged,");
  b.charsxp("that a single man");
  c.header();
  c.flags(13);
  c.i32(1);
  c.i32(42);
  std::vector<uint8_t> rdb;
  std::vector<std::pair<std::string, std::pair<int, int>>> vars;
  for (auto [name, blob] : {std::pair{"zeta", &a.b}, std::pair{"alpha", &b.b}, std::pair{"number", &c.b}}) {
    auto rec = zlib_record(*blob);
    vars.push_back({name, {static_cast<int>(rdb.size()), static_cast<int>(rec.size())}});
    rdb.insert(rdb.end(), rec.begin(), rec.end());
  }
  fs::path dir = temp_dir("rdb");
  write_bytes(dir / "Rdata.rdb", rdb);
  write_bytes(dir / "Rdata.rdx", gzip_bytes(index_blob(vars)));

  auto index = loom::data::read_lazyload_index((dir / "Rdata.rdx").string());
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.at("alpha").first, vars[1].second.first);

  auto paths = loom::data::write_austen_corpus(dir.string(), (dir / "out").string());
  ASSERT_EQ(paths.size(), 2u);  // sorted by name; the integer vector is skipped
  EXPECT_EQ(fs::path(paths[0]).filename(), "alpha.txt");
  std::ifstream in(paths[0]);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "It is a truth universally acknowledged,\nthat a single man\n");

  // A record that runs past the end of the .rdb is named in the error.
  vars[0].second.second += 1000;
  write_bytes(dir / "Rdata.rdx", gzip_bytes(index_blob(vars)));
  try {
    loom::data::read_austen_novels(dir.string());
    FAIL() << "out-of-range record accepted";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("zeta"), std::string::npos) << e.what();
  }
  EXPECT_THROW(loom::data::read_austen_novels((dir / "missing").string()), loom::IoError);
  fs::remove_all(dir);
}

// The real package, when its data is around: $LOOM_AUSTEN_RDATA, data/janeaustenr (where
// tools/get_corpus.sh keeps it) or Debian's install location.
TEST(RSerialize, ReadsTheRealJaneAustenPackage) {
  std::vector<std::string> candidates = {(fs::path(LOOM_SOURCE_DIR) / "data" / "janeaustenr").string(),
                                         loom::data::kDebianAustenDataDir};
  if (const char* env = std::getenv("LOOM_AUSTEN_RDATA")) candidates.insert(candidates.begin(), env);
  std::string dir;
  for (const auto& c : candidates) {
    if (fs::exists(fs::path(c) / "Rdata.rdb")) {
      dir = c;
      break;
    }
  }
  if (dir.empty()) GTEST_SKIP() << "no r-cran-janeaustenr data (run tools/get_corpus.sh)";
  auto novels = loom::data::read_austen_novels(dir);
  ASSERT_EQ(novels.size(), 6u);
  EXPECT_EQ(novels[0].name, "emma");
  // janeaustenr's emma has 16235 lines (its R object's length), the first "EMMA".
  EXPECT_EQ(std::count(novels[0].text.begin(), novels[0].text.end(), '\n'), 16235);
  EXPECT_EQ(novels[0].text.substr(0, 5), "EMMA\n");
  size_t total = 0;
  for (const auto& n : novels) total += n.text.size();
  EXPECT_GT(total, 3'500'000u);
  EXPECT_NE(novels[4].text.find("It is a truth universally acknowledged"), std::string::npos);
}

// Corrupt input must fail with loom::Error, never crash or read out of bounds (run under ASan with
// -DLOOM_SANITIZE=ON): every truncation and a byte-level corruption at every offset.
TEST(RSerialize, CorruptBlobsFailCleanly) {
  auto blob = index_blob({{"emma", {0, 10}}, {"persuasion", {10, 20}}});
  Xdr text;
  text.header();
  write_text_vector(text);
  for (const auto* base : {&blob, &text.b}) {
    for (size_t cut = 0; cut < base->size(); ++cut) {
      std::vector<uint8_t> b(base->begin(), base->begin() + static_cast<std::ptrdiff_t>(cut));
      EXPECT_THROW(loom::data::parse_r_serialized(b), loom::Error) << "truncated at " << cut;
    }
    for (size_t i = 0; i < base->size(); ++i) {
      for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x7f}, uint8_t{0x13}}) {
        std::vector<uint8_t> b = *base;
        b[i] = v;
        try {
          loom::data::parse_r_serialized(b);
        } catch (const loom::Error&) {
        }
      }
    }
  }
}
