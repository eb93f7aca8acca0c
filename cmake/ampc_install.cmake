# The library as others use it: the generated config header, a shared
# libampc next to the static one, `cmake --install` / `make install` of the
# libraries, headers, CLI, man pages, pkg-config file and CMake package, and
# the API reference (`cmake --build build --target docs`, with Doxygen).
# Included at the end of the top-level CMakeLists.txt, once the `ampc`
# target is complete.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
include(CheckCCompilerFlag)
include(${CMAKE_CURRENT_LIST_DIR}/ampc_build_info.cmake)

ampc_write_config_header(${PROJECT_BINARY_DIR}/include/ampc/config.h)

# 0.x releases may change the ABI with every minor version.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(AMPC_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(AMPC_SOVERSION ${PROJECT_VERSION_MAJOR})
endif()

# --- the shared library ---------------------------------------------------
# The same sources, include folders, definitions and options as the static
# `ampc` target (copied from it, so one place says how the library is built),
# compiled a second time as position-independent code: the static library the
# CLI, tests and benchmarks link keeps exactly the code it had. Its
# dependencies are private: libampc.so names them itself.
option(AMPC_SHARED "Also build libampc as a shared library" ON)
if(AMPC_SHARED)
  get_target_property(_ampc_sources ampc SOURCES)
  add_library(ampc_shared SHARED ${_ampc_sources})
  foreach(_p INCLUDE_DIRECTORIES COMPILE_DEFINITIONS COMPILE_OPTIONS LINK_LIBRARIES LINK_OPTIONS
             INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_DEFINITIONS)
    get_target_property(_v ampc ${_p})
    if(_v)
      set_property(TARGET ampc_shared PROPERTY ${_p} "${_v}")
    endif()
  endforeach()
  set_target_properties(ampc_shared PROPERTIES
    OUTPUT_NAME ampc
    EXPORT_NAME ampc
    VERSION ${PROJECT_VERSION}
    SOVERSION ${AMPC_SOVERSION}
    POSITION_INDEPENDENT_CODE ON
    LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/libampc.map)
  # calls between the library's own functions stay direct (no PLT), as in
  # the static build; only the public ampc_* names are exported
  check_c_compiler_flag(-fno-semantic-interposition AMPC_HAVE_NO_SEMANTIC_INTERPOSITION)
  if(AMPC_HAVE_NO_SEMANTIC_INTERPOSITION)
    target_compile_options(ampc_shared PRIVATE -fno-semantic-interposition)
  endif()
  target_link_options(ampc_shared PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/libampc.map")
  if(NOT AMPC_SANITIZE)
    target_link_options(ampc_shared PRIVATE "LINKER:--no-undefined")
  endif()
  set_target_properties(ampc PROPERTIES EXPORT_NAME ampc_static)
  set(_ampc_lib_targets ampc ampc_shared)
else()
  set(_ampc_lib_targets ampc)
endif()

# The installed static library names its OpenMP runtime through
# ampc::openmp_runtime, which ampcConfig.cmake defines: OpenMP::OpenMP_C
# where the user's compiler is the one libampc was built with, else the
# runtime library itself (a libampc.a from clang needs libomp, even in a
# program linked by gcc). The build tree keeps OpenMP::OpenMP_C.
get_target_property(_ampc_iface ampc INTERFACE_LINK_LIBRARIES)
list(TRANSFORM _ampc_iface REPLACE "^OpenMP::OpenMP_C$"
     "$<BUILD_INTERFACE:OpenMP::OpenMP_C>;$<INSTALL_INTERFACE:ampc::openmp_runtime>")
set_target_properties(ampc PROPERTIES INTERFACE_LINK_LIBRARIES "${_ampc_iface}")

# --- install ----------------------------------------------------------------
set(AMPC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ampc)
install(TARGETS ${_ampc_lib_targets} EXPORT ampcTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ampc_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ampc DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/ampc/config.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ampc)
install(EXPORT ampcTargets NAMESPACE ampc:: DESTINATION ${AMPC_CMAKE_DIR})
set(AMPC_OPENMP_LIBRARIES "${OpenMP_C_LIBRARIES}")
set(AMPC_MPI_C_LIBRARIES "${MPI_C_LIBRARIES}")
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ampcConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ampcConfig.cmake INSTALL_DESTINATION ${AMPC_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ampcConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ampcConfig.cmake ${PROJECT_BINARY_DIR}/ampcConfigVersion.cmake
  DESTINATION ${AMPC_CMAKE_DIR})

# pkg-config: the prefix relative to the .pc file's folder, and what linking
# the static library needs beyond jansson and zlib (Requires.private)
file(RELATIVE_PATH AMPC_PC_PREFIX_FROM_PCDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" AMPC_PC_PREFIX_FROM_PCDIR "${AMPC_PC_PREFIX_FROM_PCDIR}")
# (the OpenMP runtime as a library, not as the compiler's -fopenmp flag:
# the user's compiler may be another one)
set(_ampc_omp_libs "")
foreach(_lib IN LISTS OpenMP_C_LIBRARIES)
  get_filename_component(_dir ${_lib} DIRECTORY)
  get_filename_component(_name ${_lib} NAME_WE)
  string(REGEX REPLACE "^lib" "" _name "${_name}")
  string(APPEND _ampc_omp_libs " -L${_dir} -l${_name}")
endforeach()
get_filename_component(_ampc_blas_dir ${OPENBLAS_LIB} DIRECTORY)
# (MPI the same way: its C libraries as FindMPI found them)
set(_ampc_mpi_libs "")
if(AMPC_HAVE_MPI)
  foreach(_lib IN LISTS MPI_C_LIBRARIES)
    get_filename_component(_dir ${_lib} DIRECTORY)
    get_filename_component(_name ${_lib} NAME_WE)
    string(REGEX REPLACE "^lib" "" _name "${_name}")
    string(APPEND _ampc_mpi_libs " -L${_dir} -l${_name}")
  endforeach()
endif()
# the CUDA backend's libraries (cmake/ampc_cuda.cmake), with a run path
# where they are not in the system's folders (/usr/local/cuda/lib64)
set(_ampc_cuda_libs "")
if(AMPC_CUDA_ENABLED)
  set(_ampc_cuda_dirs "")
  set(_ampc_nccl_lib "")
  if(AMPC_HAVE_NCCL)
    set(_ampc_nccl_lib ${AMPC_NCCL_LIBRARY})
  endif()
  # (cuBLAS is opened at run time, not linked: its folder is in the run path
  # for that)
  foreach(_lib ${_ampc_nccl_lib} ${AMPC_CUDNN_LIBRARY} ${AMPC_CUDART_LIBRARY} ${AMPC_CUBLAS_LIBRARY})
    get_filename_component(_dir ${_lib} DIRECTORY)
    get_filename_component(_name ${_lib} NAME)
    if(NOT _dir IN_LIST _ampc_cuda_dirs)
      list(APPEND _ampc_cuda_dirs ${_dir})
      string(APPEND _ampc_cuda_libs " -L${_dir}")
      if(NOT _dir IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
        string(APPEND _ampc_cuda_libs " -Wl,-rpath,${_dir}")
      endif()
    endif()
    if(_lib STREQUAL AMPC_CUBLAS_LIBRARY)
      # (only its folder)
    elseif(_name MATCHES "^lib([^.]+)\\.so$")
      string(APPEND _ampc_cuda_libs " -l${CMAKE_MATCH_1}")
    else()
      string(APPEND _ampc_cuda_libs " -l:${_name}")
    endif()
  endforeach()
endif()
set(AMPC_PC_LIBS_PRIVATE "${_ampc_omp_libs} -L${_ampc_blas_dir} -lopenblas${_ampc_mpi_libs}${_ampc_cuda_libs} ${CMAKE_THREAD_LIBS_INIT} -lm")
string(REGEX REPLACE "  +" " " AMPC_PC_LIBS_PRIVATE "${AMPC_PC_LIBS_PRIVATE}")
string(STRIP "${AMPC_PC_LIBS_PRIVATE}" AMPC_PC_LIBS_PRIVATE)
configure_file(${CMAKE_CURRENT_LIST_DIR}/ampc.pc.in ${PROJECT_BINARY_DIR}/ampc.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ampc.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# man pages (written in roff, docs/man/) and the user documentation
file(GLOB AMPC_MAN_PAGES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/man/*.1)
install(FILES ${AMPC_MAN_PAGES} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
file(GLOB AMPC_DOCS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
# (the README's links are docs/NAME.md: the layout kept)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${AMPC_DOCS} DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
# (and its examples/, which it links to too)
install(FILES ${PROJECT_SOURCE_DIR}/examples/resnet18_cifar10.c ${PROJECT_SOURCE_DIR}/examples/CMakeLists.txt
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# --- API reference ----------------------------------------------------------
# `cmake --build build --target docs`: HTML from the public headers' own
# comments into build/docs/api/html (docs/Doxyfile.in says how).
find_program(AMPC_DOXYGEN doxygen)
if(AMPC_DOXYGEN)
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${PROJECT_BINARY_DIR}/docs/Doxyfile @ONLY)
  add_custom_target(docs
    COMMAND ${AMPC_DOXYGEN} ${PROJECT_BINARY_DIR}/docs/Doxyfile
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}/docs
    COMMENT "API reference: ${PROJECT_BINARY_DIR}/docs/api/html/index.html"
    VERBATIM)
endif()
