// The SHA-256 of a model file (`mer-compute --verify-model`): the FIPS 180-2 test vector, and a
// GGUF checked against its own digest, a wrong one and a malformed one.
#include "common/gguf/gguf_digest.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_writer.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

TEST(GgufDigestTest, Sha256OfTheStandardVector) {
  const std::string abc = "abc";
  EXPECT_EQ(Sha256Hex(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(abc.data()), abc.size())),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(GgufDigestTest, AFileIsCheckedAgainstItsDigest) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/gguf_digest_test_", getpid(), ".gguf");
  GgufWriter w;
  w.AddString("general.name", "digest test");
  w.AddTensor("t", GgmlType::kF32, {4});
  ASSERT_TRUE(w.Open(path).ok());
  const float data[4] = {1, 2, 3, 4};
  ASSERT_TRUE(w.Append(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data), sizeof data)).ok());
  ASSERT_TRUE(w.Finish().ok());
  auto file = GgufFile::Open(path);
  std::remove(path.c_str());
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string digest = Sha256Hex((*file)->bytes());
  EXPECT_TRUE(VerifySha256(**file, digest).ok());
  EXPECT_TRUE(VerifySha256(**file, absl::AsciiStrToUpper(digest)).ok());
  std::string other = digest;
  other[10] = other[10] == '0' ? '1' : '0';
  const absl::Status wrong = VerifySha256(**file, other);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kDataLoss) << wrong;
  EXPECT_NE(wrong.message().find(absl::StrCat("SHA-256 ", digest)), absl::string_view::npos) << wrong;
  EXPECT_NE(wrong.message().find(path), absl::string_view::npos) << wrong;
  EXPECT_EQ(VerifySha256(**file, "abc").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifySha256(**file, std::string(64, 'g')).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mer
