# The CUDA backend (src/backend/cuda): cuBLAS, cuDNN and ampc's own kernels.
#
#   AMPC_CUDA=AUTO (default)  built where nvcc, cuBLAS and cuDNN are found
#   AMPC_CUDA=ON              required: configuring fails without them
#   AMPC_CUDA=OFF             the CPU-only library
#
# cuDNN is looked for beside the toolkit and under CUDNN_ROOT (a folder with
# include/cudnn.h and lib/libcudnn.so*, e.g. the nvidia-cudnn Python
# package's); cuBLAS likewise beside the toolkit or under CUBLAS_ROOT. Each
# folder is searched for every name of a library before the next folder
# (NAMES_PER_DIR), so that the header and the library come from one place
# (a root's libcudnn.so.9, not a system libcudnn.so of another version). The kernels are built for sm_80 and sm_90 with PTX for newer
# GPUs (CMAKE_CUDA_ARCHITECTURES overrides), warnings as errors in nvcc and
# in the host compiler it drives; the objects need no C++ runtime, so
# programs in C link libampc.a with the CUDA libraries alone.
#
# Included from the top-level CMakeLists.txt after the `ampc` target is made;
# sets AMPC_CUDA_ENABLED and adds "cuda" to AMPC_BACKENDS. Also defines the
# AMPC_CUDA_EMU test build (see the end of this file).

set(AMPC_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (where found), ON or OFF")
set(CUDNN_ROOT "$ENV{CUDNN_ROOT}" CACHE PATH "A cuDNN installation outside the CUDA toolkit (include/, lib/)")
set(CUBLAS_ROOT "$ENV{CUBLAS_ROOT}" CACHE PATH "A cuBLAS installation outside the CUDA toolkit (include/, lib/)")
set(AMPC_CUDA_ENABLED OFF)
set(_ampc_cuda_why "")

function(_ampc_find_cudnn)
  find_path(AMPC_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(AMPC_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR HINTS ${CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib lib64)
endfunction()

if(AMPC_CUDA)
  include(CheckLanguage)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual")
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    set(_ampc_cuda_why "no CUDA compiler (nvcc) found")
  else()
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND)
      set(_ampc_cuda_why "the CUDA toolkit was not found")
    else()
      _ampc_find_cudnn()
      find_library(AMPC_CUDART_LIBRARY NAMES cudart HINTS ${CUDAToolkit_LIBRARY_DIR})
      find_library(AMPC_CUBLAS_LIBRARY NAMES cublas libcublas.so.13 libcublas.so.12 NAMES_PER_DIR HINTS ${CUBLAS_ROOT} ${CUDAToolkit_LIBRARY_DIR}
        PATH_SUFFIXES lib lib64)
      find_library(AMPC_CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12 NAMES_PER_DIR HINTS ${CUBLAS_ROOT}
        ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
      find_path(AMPC_CUBLAS_INCLUDE_DIR cublas_v2.h HINTS ${CUBLAS_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
      if(NOT AMPC_CUDNN_INCLUDE_DIR OR NOT AMPC_CUDNN_LIBRARY)
        set(_ampc_cuda_why "cuDNN was not found (set CUDNN_ROOT)")
      elseif(NOT AMPC_CUDART_LIBRARY OR NOT AMPC_CUBLAS_LIBRARY OR NOT AMPC_CUBLASLT_LIBRARY OR NOT AMPC_CUBLAS_INCLUDE_DIR)
        set(_ampc_cuda_why "the CUDA runtime or cuBLAS library was not found")
      else()
        set(AMPC_CUDA_ENABLED ON)
      endif()
    endif()
  endif()
  if(NOT AMPC_CUDA_ENABLED)
    if(AMPC_CUDA STREQUAL "AUTO")
      message(STATUS "ampc: CUDA backend not built: ${_ampc_cuda_why}")
    else()
      message(FATAL_ERROR "ampc: AMPC_CUDA=${AMPC_CUDA}, but ${_ampc_cuda_why}")
    endif()
  endif()
endif()

file(GLOB AMPC_CUDA_C_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.c)
file(GLOB AMPC_CUDA_CU_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu)

if(AMPC_CUDA_ENABLED)
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  message(STATUS "ampc: CUDA backend: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, "
                 "cuDNN ${AMPC_CUDNN_LIBRARY}")
  # One object library, position-independent, in both the static and the
  # shared libampc: the kernels are compiled once.
  add_library(ampc_cuda OBJECT ${AMPC_CUDA_C_SOURCES} ${AMPC_CUDA_CU_SOURCES})
  set_target_properties(ampc_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_RUNTIME_LIBRARY None)
  target_include_directories(ampc_cuda PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include
    ${PROJECT_SOURCE_DIR}/src ${CUDAToolkit_INCLUDE_DIRS} ${AMPC_CUBLAS_INCLUDE_DIR} ${AMPC_CUDNN_INCLUDE_DIR})
  target_compile_options(ampc_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-fno-exceptions,-fno-rtti,-fno-threadsafe-statics>)
  if(AMPC_WERROR)
    target_compile_options(ampc_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
  endif()
  # the step's arithmetic is step_math.h's, one rounding per operation
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/backend/cuda/step.cu PROPERTIES COMPILE_OPTIONS "-fmad=false")
  target_sources(ampc PRIVATE $<TARGET_OBJECTS:ampc_cuda>)
  # (made before CUDA was enabled, so it did not get the architectures)
  set_target_properties(ampc PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
  # cuBLAS is not linked: src/backend/cuda/cuda_blas.c opens it when a cuda
  # device is made (with it comes cuBLASLt, ~140 MB resident from the moment
  # it is loaded: no cpu run should pay that); the file found here is its
  # last resort after the soname
  get_filename_component(_ampc_cublas_real ${AMPC_CUBLAS_LIBRARY} REALPATH)
  target_compile_definitions(ampc_cuda PRIVATE AMPC_CUBLAS_PATH="${_ampc_cublas_real}")
  target_link_libraries(ampc PUBLIC ${AMPC_CUDNN_LIBRARY} ${AMPC_CUDART_LIBRARY} ${CMAKE_DL_LIBS})
  # The CUDA libraries may live outside the loader's folders (/usr/local/cuda,
  # a Python package's cuDNN): the programs and libampc.so built from here on,
  # and their installed copies, find them where they were linked from.
  set(AMPC_CUDA_LIBRARY_DIRS "")
  foreach(_lib ${AMPC_CUDNN_LIBRARY} ${AMPC_CUBLAS_LIBRARY} ${AMPC_CUBLASLT_LIBRARY} ${AMPC_CUDART_LIBRARY})
    get_filename_component(_dir ${_lib} DIRECTORY)
    list(APPEND AMPC_CUDA_LIBRARY_DIRS ${_dir})
  endforeach()
  list(REMOVE_DUPLICATES AMPC_CUDA_LIBRARY_DIRS)
  list(APPEND CMAKE_BUILD_RPATH ${AMPC_CUDA_LIBRARY_DIRS})
  list(APPEND CMAKE_INSTALL_RPATH ${AMPC_CUDA_LIBRARY_DIRS})
endif()

# --- NCCL: the communicator of the CUDA backend (src/dist/comm_nccl.c) ---------
# Built with the backend where MPI is (its ids and host all-reduces travel
# over the MPI communicator) and NCCL is found beside the toolkit or under
# NCCL_ROOT; AMPC_HAVE_NCCL for the library's own sources, "nccl" in
# AMPC_COMMS. Without it the MPI communicator serves GPUs (staging).
set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "An NCCL installation outside the CUDA toolkit (include/, lib/)")
set(AMPC_HAVE_NCCL 0)
set(AMPC_NCCL_SOURCE ${PROJECT_SOURCE_DIR}/src/dist/comm_nccl.c)
function(_ampc_find_nccl)
  find_path(AMPC_NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
    PATH_SUFFIXES include)
  find_library(AMPC_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib lib64)
endfunction()
if(AMPC_CUDA_ENABLED)
  _ampc_find_nccl()
  if(NOT AMPC_HAVE_MPI)
    message(STATUS "ampc: NCCL communicator not built: it needs MPI")
  elseif(NOT AMPC_NCCL_INCLUDE_DIR OR NOT AMPC_NCCL_LIBRARY)
    message(STATUS "ampc: NCCL communicator not built: nccl.h or libnccl not found (set NCCL_ROOT)")
  else()
    set(AMPC_HAVE_NCCL 1)
    message(STATUS "ampc: NCCL communicator: ${AMPC_NCCL_LIBRARY}")
    target_sources(ampc_cuda PRIVATE ${AMPC_NCCL_SOURCE})
    target_include_directories(ampc_cuda PRIVATE ${AMPC_NCCL_INCLUDE_DIR})
    target_compile_definitions(ampc_cuda PRIVATE AMPC_HAVE_NCCL=1)
    target_compile_definitions(ampc PRIVATE AMPC_HAVE_NCCL=1)
    target_link_libraries(ampc PUBLIC ${AMPC_NCCL_LIBRARY})
    get_filename_component(_dir ${AMPC_NCCL_LIBRARY} DIRECTORY)
    list(APPEND CMAKE_BUILD_RPATH ${_dir})
    list(APPEND CMAKE_INSTALL_RPATH ${_dir})
  endif()
endif()

# --- the host emulation, for tests ---------------------------------------------
# AMPC_CUDA_EMU (default: where the backend is built) makes `ampc_cuda_emu`, a
# static libampc whose cuda backend runs on the host: its kernels compiled as
# C++ against src/backend/cuda/emu/emu.h (blocks in turn, a block's threads
# as host threads) and src/backend/cuda/emu/emu_runtime.cpp in place of the
# CUDA runtime, cuBLAS and cuDNN. tests/CMakeLists.txt runs the op harness
# and the CUDA smoke test against it, so the backend's code is tested on
# machines without a GPU. It needs the CUDA, cuBLAS and cuDNN headers only.
option(AMPC_CUDA_EMU "Build the cuda backend's host emulation and its tests" ${AMPC_CUDA_ENABLED})
if(AMPC_CUDA_EMU)
  if(NOT AMPC_CUDA_ENABLED)
    find_package(CUDAToolkit QUIET)
    _ampc_find_cudnn()
  endif()
  find_path(AMPC_CUDA_RUNTIME_INCLUDE_DIR cuda_runtime_api.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_path(AMPC_CUBLAS_INCLUDE_DIR cublas_v2.h HINTS ${CUBLAS_ROOT} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
    PATH_SUFFIXES include)
  if(NOT AMPC_CUDA_RUNTIME_INCLUDE_DIR OR NOT AMPC_CUBLAS_INCLUDE_DIR OR NOT AMPC_CUDNN_INCLUDE_DIR)
    message(FATAL_ERROR "ampc: AMPC_CUDA_EMU needs the CUDA runtime, cuBLAS and cuDNN headers")
  endif()
  enable_language(CXX)
  set(_ampc_emu_kernels "")
  foreach(_cu ${AMPC_CUDA_CU_SOURCES})
    get_filename_component(_name ${_cu} NAME_WE)
    set(_w ${PROJECT_BINARY_DIR}/cuda_emu/${_name}.cpp)
    file(CONFIGURE OUTPUT ${_w} CONTENT "/* generated: ${_name}.cu for the host emulation */\n#include \"${_cu}\"\n")
    list(APPEND _ampc_emu_kernels ${_w})
  endforeach()
  add_library(ampc_cuda_emu STATIC EXCLUDE_FROM_ALL ${AMPC_SOURCES} ${AMPC_CUDA_C_SOURCES} ${_ampc_emu_kernels}
    ${PROJECT_SOURCE_DIR}/src/backend/cuda/emu/emu_runtime.cpp)
  set_target_properties(ampc_cuda_emu PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
  target_include_directories(ampc_cuda_emu PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include
    PRIVATE ${PROJECT_SOURCE_DIR}/src ${OPENBLAS_INC} ${AMPC_CUDA_RUNTIME_INCLUDE_DIR} ${AMPC_CUBLAS_INCLUDE_DIR}
    ${AMPC_CUDNN_INCLUDE_DIR})
  target_compile_definitions(ampc_cuda_emu PRIVATE AMPC_BLAS_OPENMP=${AMPC_BLAS_OPENMP} AMPC_CUDA_EMU=1)
  # the kernels as on the GPU's step.cu (-fmad=false): no contraction
  target_compile_options(ampc_cuda_emu PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)
  target_link_libraries(ampc_cuda_emu PUBLIC OpenMP::OpenMP_C ${OPENBLAS_LIB} ZLIB::ZLIB PkgConfig::JANSSON Threads::Threads m)
  if(AMPC_HAVE_MPI)
    target_link_libraries(ampc_cuda_emu PUBLIC MPI::MPI_C)
    # the NCCL communicator over emu_nccl.c, NCCL's calls on MPI (headers only)
    _ampc_find_nccl()
    if(AMPC_NCCL_INCLUDE_DIR)
      set(AMPC_CUDA_EMU_NCCL ON)
      target_sources(ampc_cuda_emu PRIVATE ${AMPC_NCCL_SOURCE} ${PROJECT_SOURCE_DIR}/src/backend/cuda/emu/emu_nccl.c)
      target_include_directories(ampc_cuda_emu PRIVATE ${AMPC_NCCL_INCLUDE_DIR})
      target_compile_definitions(ampc_cuda_emu PRIVATE AMPC_HAVE_NCCL=1)
    endif()
  endif()
endif()
