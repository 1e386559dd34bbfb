// The bundled training corpus: Jane Austen's six novels, read from Debian's r-cran-janeaustenr
// package without R.
//
// The package stores its data as an R "lazy-load database":
//   * data/Rdata.rdx: a gzip (or zlib) compressed R serialisation of list(variables=, references=,
//     compressed=), where `variables` is a named list of integer pairs (offset, length) into the .rdb;
//   * data/Rdata.rdb: the records; each is a 4-byte big-endian *uncompressed* length followed by a zlib
//     stream holding the R serialisation (XDR, format version 2 or 3) of one object; for this package,
//     each novel is a character vector with one element per line of text.
// We parse the subset of R's serialisation format that these files use (vectors, pairlists with tags,
// symbols and references to them, attributes, NA strings) and reject anything else with a clear error.
// Reference: R Internals, "Serialization Formats"; src/main/serialize.c.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

// One R object, as far as we need it. `type` is R's SEXPTYPE number (see RType).
struct RObject {
  int type = 0;
  std::vector<std::optional<std::string>> strings;  // STRSXP (nullopt = NA); CHARSXP/SYMSXP: one entry
  std::vector<int32_t> ints;                        // INTSXP, LGLSXP (NA = INT32_MIN)
  std::vector<double> reals;                        // REALSXP
  std::vector<RObject> items;                       // VECSXP/EXPRSXP elements; LISTSXP cars
  std::vector<std::string> tags;                    // LISTSXP: one tag per car ("" when untagged)
  std::vector<std::pair<std::string, RObject>> attributes;

  // The attribute named `name`, or nullptr.
  const RObject* attribute(const std::string& name) const;
  // names(x) for a vector (empty when it has no names attribute).
  std::vector<std::string> names() const;
};

// The SEXPTYPE numbers we read.
enum RType : int {
  kRNil = 0,
  kRSymbol = 1,
  kRPairList = 2,
  kRChar = 9,
  kRLogical = 10,
  kRInteger = 13,
  kRReal = 14,
  kRString = 16,
  kRList = 19,  // VECSXP
  kRExpression = 20,
};

// Inflates a zlib or gzip stream (detected from its header). `expected_size`, when known, is checked.
std::vector<uint8_t> inflate_bytes(std::span<const uint8_t> compressed,
                                   std::optional<size_t> expected_size = std::nullopt);

// Parses an XDR ("X\n") R serialisation, versions 2 and 3. Throws loom::Error on anything malformed or
// unsupported, naming the byte offset and the SEXPTYPE.
RObject parse_r_serialized(std::span<const uint8_t> bytes);

// The index of a lazy-load database: object name -> (offset, length) of its record in the .rdb.
std::map<std::string, std::pair<int64_t, int64_t>> read_lazyload_index(const std::string& rdx_path);
// Decodes one record (4-byte big-endian uncompressed length + zlib stream) into an R object.
RObject decode_lazyload_record(std::span<const uint8_t> record);

// A character vector's lines joined with '\n' (each line, including the last, ends with '\n'); NA
// elements are dropped. Throws unless `obj` is a character vector.
std::string join_lines(const RObject& obj);

struct Novel {
  std::string name;  // the R object's name: "emma", "prideprejudice", ...
  std::string text;
};

// Reads every character vector in <rdata_dir>/Rdata.{rdx,rdb}, sorted by name.
std::vector<Novel> read_austen_novels(const std::string& rdata_dir);
// Writes <out_dir>/<name>.txt for each novel (creating out_dir); returns the paths written.
std::vector<std::string> write_austen_corpus(const std::string& rdata_dir, const std::string& out_dir);
// Where Debian installs the package's data directory, if the package is installed.
inline constexpr const char* kDebianAustenDataDir = "/usr/lib/R/site-library/janeaustenr/data";

}  // namespace loom::data
