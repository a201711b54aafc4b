# Finds zoffload's dependencies through pkg-config. A missing required one
# stops configure with one line naming the Debian package that provides it.
find_package(PkgConfig)
if(NOT PKG_CONFIG_FOUND)
  message(FATAL_ERROR "zoffload: pkg-config not found: install the Debian package 'pkgconf'")
endif()

set(ZO_DEP_TARGETS "")
macro(zo_require_pc name module debpkg)
  pkg_check_modules(${name} QUIET IMPORTED_TARGET GLOBAL ${module})
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR "zoffload: required dependency '${module}' not found: install the Debian package '${debpkg}'")
  endif()
  list(APPEND ZO_DEP_TARGETS PkgConfig::${name})
endmacro()

zo_require_pc(NUMA numa libnuma-dev)
zo_require_pc(URING liburing liburing-dev)
zo_require_pc(HWLOC hwloc libhwloc-dev)
zo_require_pc(JANSSON jansson libjansson-dev)
zo_require_pc(XXHASH libxxhash libxxhash-dev)
zo_require_pc(OPENBLAS openblas libopenblas-dev)
# oneDNN (no pkg-config file): the cpu device's bf16 GEMMs. Debian builds it
# on libgomp, whose per-thread thread count the cpu GEMM sets to one. ZO_ONEDNN
# OFF builds without it (bf16 GEMMs through OpenBLAS sgemm, as ZO_CPU_GEMM=
# openblas picks at run time): the aarch64 cross build, whose multiarch
# libdnnl-dev:arm64 cannot be installed beside the amd64 one (both ship
# oneapi/dnnl/dnnl_config.h, different).
option(ZO_ONEDNN "bf16 GEMMs of the cpu device on oneDNN (libdnnl-dev)" ON)
if(ZO_ONEDNN)
  find_path(DNNL_INCLUDE_DIR dnnl.h)
  find_library(DNNL_LIBRARY dnnl)
  if(NOT DNNL_INCLUDE_DIR OR NOT DNNL_LIBRARY)
    message(FATAL_ERROR "zoffload: required dependency 'oneDNN' not found: install the Debian package 'libdnnl-dev' (or configure with -DZO_ONEDNN=OFF: bf16 GEMMs through OpenBLAS)")
  endif()
  list(APPEND ZO_DEP_TARGETS ${DNNL_LIBRARY} gomp)
  set(ZO_PC_DNNL "-ldnnl -lgomp ")
else()
  set(ZO_PC_DNNL "")
endif()
find_package(Threads REQUIRED)
list(APPEND ZO_DEP_TARGETS Threads::Threads m)

# CMocka is needed only for the tests.
if(BUILD_TESTING)
  pkg_check_modules(CMOCKA QUIET IMPORTED_TARGET GLOBAL cmocka)
  if(NOT CMOCKA_FOUND)
    message(FATAL_ERROR "zoffload: tests need 'cmocka': install the Debian package 'libcmocka-dev' (or configure with -DBUILD_TESTING=OFF)")
  endif()
endif()

# MPI is optional: multi-rank modes and tests use it when present.
set(ZO_HAVE_MPI OFF)
find_package(MPI QUIET COMPONENTS C)
if(MPI_C_FOUND)
  set(ZO_HAVE_MPI ON)
  # The communicator's mpi backend (offload/comm) is in the library.
  list(APPEND ZO_DEP_TARGETS MPI::MPI_C)
endif()

# NCCL ships with the CUDA Toolkit here; look beside it and in the usual places.
macro(zo_find_nccl)
  set(ZO_HAVE_NCCL OFF)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/include /usr/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/lib /usr/lib/x86_64-linux-gnu)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(ZO_HAVE_NCCL ON)
  else()
    message(WARNING "zoffload: NCCL not found (install the Debian package 'libnccl-dev' or NVIDIA's NCCL); multi-GPU collectives disabled")
  endif()
endmacro()
