# Writes the table of built-in presets (src/train/presets.h) from configs/*.json: each file's text becomes
# a C++ raw string, so the JSON files stay the only copy and `--config NAME` works from any directory.
# CMakeLists.txt runs it at build time, whenever a file in configs/ changes, is added or is removed:
#
#   cmake -DPRESET_LIST=<file holding the ;-separated JSON paths> -DOUTPUT=<.cpp> -P cmake/preset_table.cmake
cmake_minimum_required(VERSION 3.25)

# The raw strings' closing sequence: a file that contains it would end its string early, so it is an error.
set(delimiter "loom_preset")

file(READ "${PRESET_LIST}" paths)
list(SORT paths)
set(entries "")
set(names "")
foreach(path IN LISTS paths)
  get_filename_component(name "${path}" NAME_WLE)
  # The name becomes a C++ string literal and a --config argument: nothing that needs quoting.
  if(NOT name MATCHES "^[a-z0-9][a-z0-9_.-]*$")
    message(FATAL_ERROR "${path}: a preset's file name must be lower-case letters, digits, '-', '_' and '.' "
                        "(\"${name}\" is not), since it is the name `loom train --config NAME` takes")
  endif()
  file(READ "${path}" text)
  string(FIND "${text}" ")${delimiter}\"" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "${path} contains \")${delimiter}\"\" (at byte ${at}), which would end the C++ raw string "
                        "the preset is compiled into; change that text or the delimiter in cmake/preset_table.cmake")
  endif()
  string(APPEND entries "    {\"${name}\", R\"${delimiter}(${text})${delimiter}\"},\n")
  list(APPEND names "${name}")
endforeach()
# `loom train` with no --config, and a config file without "base", take the "default" preset.
if(NOT "default" IN_LIST names)
  message(FATAL_ERROR "configs/default.json is missing: loom needs a \"default\" preset (presets found: ${names})")
endif()

file(WRITE "${OUTPUT}" "\
// Generated at build time by cmake/preset_table.cmake from configs/*.json: edit those files, not this one.
#include \"train/presets.h\"

namespace loom::train {
namespace {

constexpr Preset kPresets[] = {
${entries}};

}  // namespace

std::span<const Preset> builtin_presets() { return kPresets; }

}  // namespace loom::train
")
