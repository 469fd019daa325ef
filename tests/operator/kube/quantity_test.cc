#include "operator/kube/quantity.h"

#include <gtest/gtest.h>

#include "operator/kube/kube_time.h"
#include "operator/kube/label_selector.h"
#include "operator/kube/resource.h"

namespace pstar::op {
namespace {

TEST(Quantity, ParsesBinaryDecimalAndExponentForms) {
  EXPECT_EQ(*ParseQuantity("64Gi"), int64_t{64} << 30);
  EXPECT_EQ(*ParseQuantity("1536Mi"), int64_t{1536} << 20);
  EXPECT_EQ(*ParseQuantity("1.5Ki"), 1536);
  EXPECT_EQ(*ParseQuantity("500M"), 500000000);
  EXPECT_EQ(*ParseQuantity("1.5G"), 1500000000);
  EXPECT_EQ(*ParseQuantity("1e3"), 1000);
  EXPECT_EQ(*ParseQuantity("1E3"), 1000);
  EXPECT_EQ(*ParseQuantity("2E"), 2000000000000000000);
  EXPECT_EQ(*ParseQuantity("12345"), 12345);
  EXPECT_EQ(*ParseQuantity("0"), 0);
  EXPECT_EQ(*ParseQuantity("100m"), 1);    // rounded up to a whole byte
  EXPECT_EQ(*ParseQuantity("1500m"), 2);
  EXPECT_EQ(*ParseQuantity("+1k"), 1000);
  EXPECT_EQ(*ParseQuantity("0.000Gi"), 0);
}

TEST(Quantity, RejectsBadInput) {
  for (const char* bad : {"", "Gi", "1Xi", "1.2.3", "-1", "1 Gi", "12Q", "1e", "9Ei", "1e99"}) {
    EXPECT_FALSE(ParseQuantity(bad).ok()) << bad;
  }
  auto r = ParseQuantity("1Zi");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1Zi"), std::string::npos);
}

TEST(Quantity, CpuMillis) {
  EXPECT_EQ(*ParseCpuMillis("2"), 2000);
  EXPECT_EQ(*ParseCpuMillis("100m"), 100);
  EXPECT_EQ(*ParseCpuMillis("0.5"), 500);
  EXPECT_EQ(*ParseCpuMillis("1.0001"), 1001);  // rounded up
  EXPECT_EQ(*ParseCpuMillis("1k"), 1000000);
}

TEST(Quantity, FormatBytesIsTheShortestExactForm) {
  EXPECT_EQ(FormatBytesQuantity(int64_t{12} << 30), "12Gi");
  EXPECT_EQ(FormatBytesQuantity(int64_t{1536} << 20), "1536Mi");
  EXPECT_EQ(FormatBytesQuantity(1024), "1Ki");
  EXPECT_EQ(FormatBytesQuantity(1000), "1000");
  EXPECT_EQ(FormatBytesQuantity(0), "0");
  EXPECT_EQ(FormatBytesQuantity(int64_t{3} << 60), "3Ei");
  for (int64_t v : {int64_t{1} << 33, int64_t{1536} << 20, int64_t{123456789}}) {
    EXPECT_EQ(*ParseQuantity(FormatBytesQuantity(v)), v);
  }
}

TEST(LabelSelector, SortedAndCommaSeparated) {
  EXPECT_EQ(FormatSelector({}), "");
  EXPECT_EQ(FormatSelector({{"b", "2"}, {"a", "1"}, {"patrickstar.io/job-name", "j"}}),
            "a=1,b=2,patrickstar.io/job-name=j");
}

TEST(ResourceRef, Paths) {
  EXPECT_EQ(Pods().api_version(), "v1");
  EXPECT_EQ(Pods().Path("ns"), "/api/v1/namespaces/ns/pods");
  EXPECT_EQ(Pods().Path(""), "/api/v1/pods");
  EXPECT_EQ(Pods().Path("ns", "p", "status"), "/api/v1/namespaces/ns/pods/p/status");
  EXPECT_EQ(Nodes().Path("ignored", "n1"), "/api/v1/nodes/n1");
  EXPECT_EQ(Leases().api_version(), "coordination.k8s.io/v1");
  EXPECT_EQ(Leases().Path("kube-system", "l"), "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l");
  EXPECT_EQ(PatrickStarJobs().api_version(), "patrickstar.io/v1alpha1");
  EXPECT_EQ(PatrickStarJobs().kind, "PatrickStarJob");
  EXPECT_EQ(PatrickStarJobs().Path("d", "j", "status"), "/apis/patrickstar.io/v1alpha1/namespaces/d/patrickstarjobs/j/status");
  EXPECT_EQ(Services().plural, "services");
  EXPECT_EQ(ConfigMaps().kind, "ConfigMap");
  EXPECT_EQ(Events().Path("x"), "/api/v1/namespaces/x/events");
}

TEST(KubeTime, FormatAndParse) {
  WallTime t = WallTime(std::chrono::seconds(1767323045)) + std::chrono::microseconds(42);
  EXPECT_EQ(FormatTime(t), "2026-01-02T03:04:05Z");
  EXPECT_EQ(FormatMicroTime(t), "2026-01-02T03:04:05.000042Z");
  EXPECT_EQ(*ParseTime("2026-01-02T03:04:05.000042Z"), t);
  EXPECT_EQ(*ParseTime("2026-01-02T03:04:05Z"), WallTime(std::chrono::seconds(1767323045)));
  EXPECT_EQ(*ParseTime("2026-01-02T05:04:05+02:00"), WallTime(std::chrono::seconds(1767323045)));
  EXPECT_FALSE(ParseTime("2026-01-02 03:04:05").ok());
  EXPECT_FALSE(ParseTime("2026-01-02T03:04:05").ok());
}

}  // namespace
}  // namespace pstar::op
