# Cross-compiling zoffload for 64-bit ARM Linux (aarch64) with Debian's
# gcc-aarch64-linux-gnu, against the arm64 libraries installed by multiarch
# (dpkg --add-architecture arm64; libcmocka-dev:arm64 and the others that
# tools/scripts/install-deps-arm64.sh lists). Programs built with it run
# here under qemu-user: CMAKE_CROSSCOMPILING_EMULATOR makes ctest start each
# test as `qemu-aarch64 -cpu cortex-a53 <test>` (see below for why no -L).
#
#   cmake -S . -B build-arm64 -G Ninja --toolchain cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# The cross toolchain's own sysroot first, then multiarch's arm64 folders;
# never the build machine's x86-64 libraries.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config answers for arm64: multiarch puts the .pc files here.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# ctest and the build run the programs under qemu-user on a plain ARMv8.0
# CPU model (Cortex-A53: Advanced SIMD, no SVE, no fp16 arithmetic, no
# dot product), so nothing newer than what every aarch64 CPU has slips in.
# The dynamic loader and libc must come from one glibc build: multiarch's
# libc6:arm64 (which libcmocka0:arm64 pulls in) sits at /lib and
# /usr/lib/aarch64-linux-gnu, and the loader finds the libraries through
# ld.so.cache. `-L /usr/aarch64-linux-gnu` would start the cross
# toolchain's own loader (libc6-arm64-cross, another Debian revision) with
# multiarch's libc.so.6, and their private ABI differs: pthread_create
# then loops forever in the stack cache. So -L only without multiarch.
set(ZO_QEMU_CPU cortex-a53 CACHE STRING "qemu-aarch64 CPU model the tests run on")
find_program(ZO_QEMU_AARCH64 qemu-aarch64)
if(ZO_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ZO_QEMU_AARCH64} -cpu ${ZO_QEMU_CPU})
  if(NOT EXISTS /lib/ld-linux-aarch64.so.1)
    list(APPEND CMAKE_CROSSCOMPILING_EMULATOR -L /usr/aarch64-linux-gnu)
  endif()
endif()
