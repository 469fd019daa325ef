// pstar launch's rendezvous: the port --standalone picks and the store's secret.
#include "worker/cli/launch_command.h"

#include <gtest/gtest.h>

namespace pstar::cli {
namespace {

TEST(LaunchRendezvous, OneNodeGetsAFreshSecretUnlessItInheritsOne) {
  LaunchOptions one;
  ASSERT_TRUE(SetRendezvous(&one, nullptr).ok());
  ASSERT_EQ(one.store_token.size(), 32u);
  EXPECT_EQ(one.store_token.find_first_not_of("0123456789abcdef"), std::string::npos);
  LaunchOptions again;
  ASSERT_TRUE(SetRendezvous(&again, "").ok());
  EXPECT_NE(again.store_token, one.store_token);

  LaunchOptions inherits;
  ASSERT_TRUE(SetRendezvous(&inherits, "shared-secret").ok());
  EXPECT_EQ(inherits.store_token, "");  // the ranks inherit the environment's
  EXPECT_EQ(inherits.master_port, 29500);
}

TEST(LaunchRendezvous, SeveralNodesAreNotGivenASecretOfTheirOwn) {
  LaunchOptions nodes;
  nodes.nnodes = 2;
  ASSERT_TRUE(SetRendezvous(&nodes, nullptr).ok());
  EXPECT_EQ(nodes.store_token, "");
}

TEST(LaunchRendezvous, StandalonePicksAPortNotTheDefault) {
  LaunchOptions standalone;
  standalone.standalone = true;
  standalone.master_port = 0;
  ASSERT_TRUE(SetRendezvous(&standalone, nullptr).ok());
  EXPECT_GT(standalone.master_port, 0);
  EXPECT_LT(standalone.master_port, 65536);
}

}  // namespace
}  // namespace pstar::cli
