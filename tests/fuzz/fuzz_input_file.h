// For the fuzz targets whose reader takes a path: the input written to one
// file in a directory of this process, replaced on each run.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace pstar::fuzz {

inline const std::string& WorkDir() {
  static const std::string dir = [] {
    std::string d = std::filesystem::temp_directory_path().string() + "/pstar-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes the input as WorkDir()/name and returns its path.
inline std::string WriteInput(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = WorkDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                 std::streamsize(size));
  return path;
}

}  // namespace pstar::fuzz
