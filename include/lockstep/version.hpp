#pragma once
/// @file version.hpp
/// The library version.

namespace lockstep {
inline constexpr int version_major = 0;  ///< major version: breaking API changes
inline constexpr int version_minor = 1;  ///< minor version: additions
inline constexpr int version_patch = 0;  ///< patch version: fixes
}  // namespace lockstep
