// The choice of the CPU kernels' instruction-set variant (kernels/cpu/isa.h).
// ctest runs this suite once more per variant with PSTAR_CPU_ISA pinning it,
// so every kernel test checks every variant the CPU can run.
#include "kernels/cpu/isa.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>

namespace pstar::kernels::cpu {
namespace {

TEST(CpuIsa, TheSelectionIsBuiltAndRunsHere) {
  const std::vector<CpuIsa> built = BuiltCpuIsas();
  ASSERT_FALSE(built.empty());
  const CpuIsa selected = SelectedCpuIsa();
  EXPECT_NE(std::find(built.begin(), built.end(), selected), built.end()) << CpuIsaName(selected);
  EXPECT_TRUE(CpuIsaSupported(selected)) << CpuIsaName(selected);
  const char* want = std::getenv("PSTAR_CPU_ISA");
  if (want != nullptr && *want != '\0') {
    if (!CpuIsaRequestError().empty()) GTEST_SKIP() << CpuIsaRequestError();
    EXPECT_STREQ(CpuIsaName(selected), want);
    return;
  }
  EXPECT_EQ(CpuIsaRequestError(), "");
  // Unpinned: the most capable built variant this CPU runs.
  for (CpuIsa isa : built) {
    if (CpuIsaSupported(isa)) EXPECT_LE(int(isa), int(selected)) << CpuIsaName(isa);
  }
}

TEST(CpuIsa, VariantsHaveDistinctNamesAndTheBaseRunsEverywhere) {
  std::set<std::string> names;
  for (CpuIsa isa : BuiltCpuIsas()) EXPECT_TRUE(names.insert(CpuIsaName(isa)).second) << CpuIsaName(isa);
  EXPECT_TRUE(CpuIsaSupported(BuiltCpuIsas().front()) || BuiltCpuIsas().front() == CpuIsa::kNative);
  EXPECT_TRUE(CpuIsaSupported(CpuIsa::kX86_64));
}

}  // namespace
}  // namespace pstar::kernels::cpu
