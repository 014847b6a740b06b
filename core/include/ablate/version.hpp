// Versions a plugin is checked against before the loader uses anything else in it: the plugin API
// version (bumped on any change to the descriptor or to a component interface) and a build
// fingerprint (compiler, C++ library ABI, core version) compiled into both core and each plugin.
#pragma once

#define ABLATE_VERSION_MAJOR 0
#define ABLATE_VERSION_MINOR 1
#define ABLATE_VERSION_PATCH 0
#define ABLATE_VERSION_STRING "0.1.0"

// The plugin ABI version. A plugin built against another value is refused.
#define ABLATE_API_VERSION 24

#define ABLATE_STRINGIFY_INNER(x) #x
#define ABLATE_STRINGIFY(x) ABLATE_STRINGIFY_INNER(x)

#if defined(__clang__)
#define ABLATE_COMPILER_ID "clang-" ABLATE_STRINGIFY(__clang_major__) "." ABLATE_STRINGIFY(__clang_minor__)
#elif defined(__GNUC__)
#define ABLATE_COMPILER_ID "gcc-" ABLATE_STRINGIFY(__GNUC__) "." ABLATE_STRINGIFY(__GNUC_MINOR__)
#else
#define ABLATE_COMPILER_ID "unknown"
#endif

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define ABLATE_CXXABI_ID "libstdc++-cxx11abi" ABLATE_STRINGIFY(_GLIBCXX_USE_CXX11_ABI)
#elif defined(_LIBCPP_VERSION)
#define ABLATE_CXXABI_ID "libc++"
#else
#define ABLATE_CXXABI_ID "unknown-stdlib"
#endif

// "compiler;c++ library ABI;core version". The loader requires the last two to match exactly and
// only warns when the compiler differs (gcc and clang share libstdc++'s ABI).
#define ABLATE_BUILD_FINGERPRINT ABLATE_COMPILER_ID ";" ABLATE_CXXABI_ID ";core-" ABLATE_VERSION_STRING

namespace ablate {
inline constexpr int kApiVersion = ABLATE_API_VERSION;
const char* core_version() noexcept;
const char* core_build_fingerprint() noexcept;
}  // namespace ablate
