// The safetensors header reader on hostile JSON: nesting past io/json.h's limit (which overflowed the
// stack in the error message's dump()), and huge values quoted in messages.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors_format.h"
#include "support/errors.h"

using namespace loom::io;

namespace {

std::vector<uint8_t> file_of(std::string header, size_t data_bytes = 0) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  out += header;
  out.append(data_bytes, '\0');
  return std::vector<uint8_t>(out.begin(), out.end());
}

std::string error_of(const std::vector<uint8_t>& file) {
  try {
    parse_safetensors_header(file.data(), file.size());
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "(no error)";
}

const std::string kDeep = std::string(70000, '[') + std::string(70000, ']');

}  // namespace

TEST(SafetensorsLimits, DeepHeadersAreRefusedQuickly) {
  for (const std::string& header : {"{\"a\":{\"dtype\":\"U8\",\"shape\":" + kDeep + ",\"data_offsets\":[0,0]}}",
                                    "{\"__metadata__\":{\"x\":" + kDeep + "}}", "{\"a\":" + kDeep + "}"}) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_HAS(error_of(file_of(header)), "header nests JSON arrays/objects more than 64 levels deep");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  }
  // Nesting inside a string is no nesting: this header is only refused for its metadata value's type.
  EXPECT_HAS(error_of(file_of("{\"__metadata__\":{\"x\":\"" + kDeep + "\",\"y\":1}}")),
             "__metadata__ value for key 'y' is a number (1)");
}

TEST(SafetensorsLimits, MessagesQuoteAShortPrefix) {
  std::string big = "[";
  for (int i = 0; i < 100000; ++i) big += (i ? ",\"" : "\"") + std::string(20, 's') + "\"";
  big += "]";
  for (const std::string& header :
       {"{\"a\":{\"dtype\":\"U8\",\"shape\":" + big + ",\"data_offsets\":[0,0]}}",
        "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":" + big + "}}", "{\"a\":" + big + "}",
        "{\"__metadata__\":{\"k\":" + big + "}}", "{\"__metadata__\":" + big + "}",
        "{\"a\":{\"dtype\":" + big + ",\"shape\":[1],\"data_offsets\":[0,1]}}",
        std::string("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"") + std::string(1 << 20, 'u')}) {
    const std::string msg = error_of(file_of(header, 1));
    EXPECT_LT(msg.size(), 300u) << msg.substr(0, 500);
    EXPECT_NE(msg, "(no error)");
  }
}
