# What a build of libampc contains, in one place: the backends and the CPU
# backend's code paths. Each list entry becomes an AMPC_HAVE_* macro and a
# word of the AMPC_BACKENDS / AMPC_COMMS / AMPC_CPU_PATHS strings in the generated
# include/ampc/config.h, which ampc_version() and `ampc --version` print.
# A new backend (cpu-guarded, cuda) appends itself to AMPC_BACKENDS where its
# sources are added to the build.

set(AMPC_BACKENDS cpu cpu-guarded)
if(AMPC_CUDA_ENABLED) # cmake/ampc_cuda.cmake
  list(APPEND AMPC_BACKENDS cuda)
endif()

# The communicators data-parallel training can use: the in-process one
# always, MPI where the top-level CMakeLists.txt found it (AMPC_HAVE_MPI).
# NCCL appends itself here with the CUDA backend.
set(AMPC_COMMS local)
if(AMPC_HAVE_MPI)
  list(APPEND AMPC_COMMS mpi)
endif()
if(AMPC_HAVE_NCCL) # cmake/ampc_cuda.cmake
  list(APPEND AMPC_COMMS nccl)
endif()

# The hot loops are built twice on x86-64 with GCC or clang (target clones
# and target attributes: AVX2 + FMA, with F16C for the conversions), a third
# time for AVX-512 (x86-64-v4) with GCC, and once elsewhere; see
# src/backend/cpu/cpu_internal.h and src/core/dtype_avx2.c.
set(AMPC_CPU_PATHS baseline)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  list(PREPEND AMPC_CPU_PATHS "avx2+fma+f16c")
  if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
    list(PREPEND AMPC_CPU_PATHS "avx512")
  endif()
endif()

# "avx2+fma+f16c" -> AVX2_FMA_F16C, "cpu-guarded" -> CPU_GUARDED
function(_ampc_macro_name out word)
  string(TOUPPER "${word}" w)
  string(REGEX REPLACE "[^A-Z0-9]+" "_" w "${w}")
  set(${out} "${w}" PARENT_SCOPE)
endfunction()

function(ampc_write_config_header out)
  set(AMPC_HAVE_BACKEND_DEFINES "")
  foreach(b IN LISTS AMPC_BACKENDS)
    _ampc_macro_name(m "${b}")
    string(APPEND AMPC_HAVE_BACKEND_DEFINES "#define AMPC_HAVE_BACKEND_${m} 1\n")
  endforeach()
  set(AMPC_HAVE_CPU_PATH_DEFINES "")
  foreach(p IN LISTS AMPC_CPU_PATHS)
    _ampc_macro_name(m "${p}")
    string(APPEND AMPC_HAVE_CPU_PATH_DEFINES "#define AMPC_HAVE_CPU_PATH_${m} 1\n")
  endforeach()
  set(AMPC_HAVE_COMM_DEFINES "")
  foreach(c IN LISTS AMPC_COMMS)
    _ampc_macro_name(m "${c}")
    string(APPEND AMPC_HAVE_COMM_DEFINES "#define AMPC_HAVE_COMM_${m} 1\n")
  endforeach()
  if(AMPC_HAVE_MPI)
    string(APPEND AMPC_HAVE_COMM_DEFINES "#define AMPC_HAVE_MPI 1\n")
  endif()
  string(REPLACE ";" ", " AMPC_COMMS_STR "${AMPC_COMMS}")
  string(REPLACE ";" ", " AMPC_BACKENDS_STR "${AMPC_BACKENDS}")
  string(REPLACE ";" ", " AMPC_CPU_PATHS_STR "${AMPC_CPU_PATHS}")
  if(CMAKE_BUILD_TYPE)
    set(AMPC_BUILD_TYPE_NAME "${CMAKE_BUILD_TYPE}")
  else()
    set(AMPC_BUILD_TYPE_NAME "none")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/config.h.in ${out} @ONLY)
endfunction()
