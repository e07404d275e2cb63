// NCCL's functions as the cuda ranks' exchange loads them (nccl_api.h): no GPU needed.
#include "services/compute/cuda/nccl_api.h"

#include <gtest/gtest.h>

#include <cstring>

namespace mer::cuda {
namespace {

TEST(NcclApi, LoadsEveryFunctionTheExchangeCalls) {
  const absl::StatusOr<const NcclApi*> api = LoadNccl();
  // A host whose loader finds no libnccl.so.2 gets the message that says what to do; the CUDA
  // toolkit this project builds with ships it.
  if (!api.ok()) {
    EXPECT_NE(api.status().message().find("LD_LIBRARY_PATH"), std::string::npos) << api.status();
    GTEST_SKIP() << api.status();
  }
  const NcclApi& nccl = **api;
  EXPECT_NE(nccl.CommInitAll, nullptr);
  EXPECT_NE(nccl.AllReduce, nullptr);
  EXPECT_NE(nccl.CommAbort, nullptr);
  EXPECT_NE(nccl.CommDestroy, nullptr);
  EXPECT_NE(nccl.GroupStart, nullptr);
  EXPECT_NE(nccl.GroupEnd, nullptr);
  EXPECT_NE(nccl.GetLastError, nullptr);
  ASSERT_NE(nccl.GetErrorString, nullptr);
  // Calls that need no device: the library is the one the header describes.
  EXPECT_STREQ(nccl.GetErrorString(ncclSuccess), "no error");
  EXPECT_GT(std::strlen(nccl.GetErrorString(ncclInvalidUsage)), 0u);
  // Loaded once for the process.
  EXPECT_EQ(*LoadNccl(), &nccl);
}

}  // namespace
}  // namespace mer::cuda
