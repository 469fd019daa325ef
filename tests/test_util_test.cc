// The shared test helpers whose behaviour decides a verdict.
#include "tests/test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace pstar::test {
namespace {

class ExpectGpuEnv {
 public:
  explicit ExpectGpuEnv(const char* value) {
    if (value == nullptr) unsetenv("PSTAR_EXPECT_GPU");
    else setenv("PSTAR_EXPECT_GPU", value, 1);
  }
  ~ExpectGpuEnv() { unsetenv("PSTAR_EXPECT_GPU"); }
};

TEST(MissingGpus, SkipUnlessTheHostMustHaveThem) {
  {
    ExpectGpuEnv env(nullptr);
    EXPECT_FALSE(MissingGpusAreAFailure(1, 0));
  }
  {
    ExpectGpuEnv env("1");
    EXPECT_TRUE(MissingGpusAreAFailure(1, 0)) << "a GPU host whose GPU is unreachable";
    EXPECT_FALSE(MissingGpusAreAFailure(2, 1)) << "a two-GPU test on a one-GPU host";
    EXPECT_TRUE(MissingGpusAreAFailure(2, 0));
  }
  {
    ExpectGpuEnv env("2");
    EXPECT_TRUE(MissingGpusAreAFailure(2, 1));
  }
  for (const char* ignored : {"", "0", "yes", "-1"}) {
    ExpectGpuEnv env(ignored);
    EXPECT_FALSE(MissingGpusAreAFailure(1, 0)) << "'" << ignored << "'";
  }
}

TEST(MissingGpus, TheMacroFailsOnlyWhenExpected) {
  ExpectGpuEnv env(nullptr);
  PSTAR_REQUIRE_GPUS_FOUND(0, 0);  // nothing needed: runs on
  SUCCEED();
}

}  // namespace
}  // namespace pstar::test
