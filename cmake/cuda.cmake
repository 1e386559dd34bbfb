# The CUDA backend's build (docs/cuda.md). Included from the top-level CMakeLists.txt.
#
# LOOM_CUDA=AUTO (default) builds the backend when nvcc and the toolkit's cuBLASLt are found, ON requires
# them, OFF skips them. Kernels are compiled for Hopper (sm_90 machine code) with compute_90 PTX kept, so
# newer GPUs run them too after the driver compiles the PTX. Sets:
#   LOOM_HAVE_CUDA   ON when the backend is built (the object library loom_cuda)
#   LOOM_HAVE_NCCL   ON when NCCL is found too (the NCCL communicator)
#   LOOM_CUDA_LINK   what loom_lib links: cudart (static: it loads the driver itself at first use, so a
#                    machine without a driver still runs loom), NCCL; cuBLASLt is dlopen'ed at the first GEMM
# (Re)written at generate time when the backend is on; gone when it is off.
file(REMOVE ${CMAKE_BINARY_DIR}/cuda_link_flags.txt)
set(LOOM_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when the toolkit is found), ON, OFF")
set_property(CACHE LOOM_CUDA PROPERTY STRINGS AUTO ON OFF)
set(LOOM_HAVE_CUDA OFF)
set(LOOM_HAVE_NCCL OFF)
set(LOOM_CUDA_LINK "")

string(TOUPPER "${LOOM_CUDA}" loom_cuda_mode)
if(loom_cuda_mode MATCHES "^(ON|TRUE|YES|1)$")
  set(loom_cuda_mode ON)
elseif(loom_cuda_mode MATCHES "^(OFF|FALSE|NO|0)$")
  message(STATUS "loom: CUDA backend off (LOOM_CUDA=${LOOM_CUDA}): CPU backend only")
  return()
elseif(NOT loom_cuda_mode STREQUAL "AUTO")
  message(FATAL_ERROR "LOOM_CUDA must be AUTO, ON or OFF, got '${LOOM_CUDA}'")
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90-real 90-virtual)
endif()
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  enable_language(CUDA)
  find_package(CUDAToolkit)
endif()
if(NOT CMAKE_CUDA_COMPILER OR NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublasLt OR NOT TARGET CUDA::cudart_static)
  if(loom_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "LOOM_CUDA=ON but the CUDA toolkit (nvcc, cudart, cuBLASLt) was not found: "
                        "put nvcc on PATH or set CMAKE_CUDA_COMPILER, or configure with -DLOOM_CUDA=OFF")
  endif()
  message(STATUS "loom: CUDA toolkit not found: CPU backend only (LOOM_CUDA=AUTO)")
  return()
endif()

set(LOOM_HAVE_CUDA ON)
# C++20 as the rest of loom (the kernels include core headers). CMake 3.25 knows no C++20 flag for
# nvcc (and applies CXX_STANDARD to CUDA when CUDA_STANDARD is unset), so name it.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
file(GLOB LOOM_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cu
                                               ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cpp)
# NCCL: the toolkit here ships it in lib/ beside lib64/.
find_path(LOOM_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(LOOM_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
             ${CUDAToolkit_LIBRARY_DIR}/../lib)
if(LOOM_NCCL_INCLUDE_DIR AND LOOM_NCCL_LIBRARY)
  set(LOOM_HAVE_NCCL ON)
  list(APPEND LOOM_CUDA_SOURCES ${CMAKE_SOURCE_DIR}/src/mesh/nccl/nccl_communicator.cpp)
else()
  list(APPEND LOOM_CUDA_SOURCES ${CMAKE_SOURCE_DIR}/src/mesh/nccl/nccl_stub.cpp)
endif()

add_library(loom_cuda OBJECT ${LOOM_CUDA_SOURCES})
set_target_properties(loom_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(loom_cuda PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
# cuBLASLt: its headers at compile time, the library itself dlopen'ed at the first GEMM (gemm.cpp; linking
# it made every loom program map the ~540 MB library at start-up, GPU or not).
target_link_libraries(loom_cuda PRIVATE CUDA::cudart_static)
target_include_directories(loom_cuda PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(loom_cuda PRIVATE LOOM_CUBLASLT_LIBRARY="$<TARGET_FILE:CUDA::cublasLt>")
# -lineinfo: source lines in profiles and compute-sanitizer reports, at no speed cost.
target_compile_options(loom_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr>)
list(APPEND LOOM_CUDA_LINK CUDA::cudart_static ${CMAKE_DL_LIBS})
if(LOOM_HAVE_NCCL)
  target_include_directories(loom_cuda PRIVATE ${LOOM_NCCL_INCLUDE_DIR})
  list(APPEND LOOM_CUDA_LINK ${LOOM_NCCL_LIBRARY})
endif()
# What a program linking build/libloom.a outside CMake must add (tools/fuzz.sh reads it): the static
# CUDA runtime, NCCL, and what the static runtime itself needs (-ldl also serves cuBLASLt's dlopen).
set(LOOM_CUDA_LINK_FLAGS "$<TARGET_LINKER_FILE:CUDA::cudart_static>")
if(LOOM_HAVE_NCCL)
  string(APPEND LOOM_CUDA_LINK_FLAGS " ${LOOM_NCCL_LIBRARY}")
endif()
string(APPEND LOOM_CUDA_LINK_FLAGS " -ldl -lrt -lpthread\n")
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/cuda_link_flags.txt CONTENT "${LOOM_CUDA_LINK_FLAGS}")
message(STATUS "loom: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
               "${CMAKE_CUDA_ARCHITECTURES}, NCCL ${LOOM_HAVE_NCCL})")
