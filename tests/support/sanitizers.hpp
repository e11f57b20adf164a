#pragma once
/// @file sanitizers.hpp
/// Which sanitizers a test binary is built with, for the few checks whose quantity a sanitizer
/// changes (resident memory under AddressSanitizer's quarantine of freed blocks).

namespace test_support {

#if defined(__SANITIZE_ADDRESS__)
/// True when the binary runs under AddressSanitizer.
inline constexpr bool address_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
/// True when the binary runs under AddressSanitizer.
inline constexpr bool address_sanitizer = true;
#else
/// True when the binary runs under AddressSanitizer.
inline constexpr bool address_sanitizer = false;
#endif
#else
/// True when the binary runs under AddressSanitizer.
inline constexpr bool address_sanitizer = false;
#endif

}  // namespace test_support
