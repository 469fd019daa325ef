#include <gtest/gtest.h>

#include <cstdint>

#include "worker/core/arena.h"

namespace pstar {
namespace {

TEST(Arena, CountsEveryByteAndRefusesOverflow) {
  Arena arena("test", 1000);
  EXPECT_EQ(arena.capacity_bytes(), 1024u);
  auto a = arena.AllocateFloats(10);  // 40 -> 64
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 64, 0u);
  EXPECT_EQ(arena.used_bytes(), 64u);
  auto b = arena.AllocateFloats(200);  // 800 -> 832
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(arena.used_bytes(), 896u);
  auto c = arena.AllocateFloats(100);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("capacity 1024"), std::string::npos);
  arena.Reset();
  EXPECT_EQ(arena.used_bytes(), 0u);
  EXPECT_EQ(arena.peak_bytes(), 896u);
}

}  // namespace
}  // namespace pstar
