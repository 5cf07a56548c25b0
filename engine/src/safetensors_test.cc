#include "meshlearn/engine/safetensors.h"

#include <cstring>

#include <gtest/gtest.h>

namespace meshlearn::engine {
namespace {

std::string Header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

void ExpectBad(const std::string& bytes, const std::string& needle) {
  Result<SafetensorsFile> f = SafetensorsFile::Parse(bytes, "m.safetensors");
  ASSERT_FALSE(f.ok()) << "accepted a malformed file; expected: " << needle;
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("m.safetensors"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().message();
}

TEST(SafetensorsTest, RoundTripIsCanonical) {
  Tensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b({4}, {-1, -2, -3, -4});
  SafetensorsWriter w1, w2;
  w1.AddF32("b", b);
  w1.AddF32("a", a);
  w1.SetMetadata("step", "7");
  w2.AddF32("a", a);
  w2.SetMetadata("step", "7");
  w2.AddF32("b", b);
  const std::string bytes = w1.Serialize();
  EXPECT_EQ(bytes, w2.Serialize());  // insertion order does not matter
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  Result<SafetensorsFile> f = SafetensorsFile::Parse(bytes, "x");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(*f->Metadata("step"), "7");
  Result<Tensor> ra = f->GetF32("a", {2, 3});
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(ra->vec(), a.vec());
  EXPECT_FALSE(f->GetF32("a", {3, 2}).ok());
  EXPECT_FALSE(f->GetF32("missing").ok());
}

// A writer that views the tensors (no copy) serializes the same bytes as one that copies them,
// and WriteTo hands them out in pieces that concatenate to Serialize's bytes; a sink's error ends
// it. A viewing writer reads the tensors when it serializes, not when they are added.
TEST(SafetensorsTest, ViewedTensorsAndPiecewiseWritingGiveTheSameBytes) {
  Tensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b({4}, {-1, -2, -3, -4});
  SafetensorsWriter copy;
  SafetensorsWriter view(SafetensorsWriter::Mode::kView);
  for (SafetensorsWriter* w : {&copy, &view}) {
    w->AddF32("b", b);
    w->AddF32("a", a);
    w->SetMetadata("step", "7");
  }
  const std::string bytes = copy.Serialize();
  EXPECT_EQ(view.Serialize(), bytes);
  std::string pieces;
  int n = 0;
  ASSERT_TRUE(view.WriteTo([&](std::string_view p) {
                    pieces.append(p);
                    ++n;
                    return Status::Ok();
                  })
                  .ok());
  EXPECT_EQ(pieces, bytes);
  EXPECT_EQ(n, 3);  // the header, then a and b
  Status full = view.WriteTo([](std::string_view) { return ResourceExhausted("disk full"); });
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  a.data()[0] = 9;
  EXPECT_EQ(copy.Serialize(), bytes);
  EXPECT_NE(view.Serialize(), bytes);
}

TEST(SafetensorsTest, EmptyTensorAndNoMetadata) {
  SafetensorsWriter w;
  w.AddF32("e", Tensor({0, 4}));
  Result<SafetensorsFile> f = SafetensorsFile::Parse(w.Serialize(), "x");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->GetF32("e")->size(), 0);
}

TEST(SafetensorsTest, RefusesTruncatedLength) {
  ExpectBad("abc", "shorter than the 8-byte header");
}

TEST(SafetensorsTest, RefusesHeaderPastEnd) {
  std::string b = Header("{}", "");
  b.resize(b.size() - 1);
  ExpectBad(b, "runs past the end");
}

TEST(SafetensorsTest, RefusesHugeHeaderLength) {
  std::string b(8, '\xff');
  ExpectBad(b + "{}", "exceeds the limit");
}

TEST(SafetensorsTest, RefusesBadJson) { ExpectBad(Header("{\"a\": ", ""), "not valid JSON"); }

TEST(SafetensorsTest, RefusesNonObjectHeader) { ExpectBad(Header("[1,2]", ""), "not an object"); }

TEST(SafetensorsTest, RefusesUnknownDtype) {
  ExpectBad(Header(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", "abcd"),
            "unsupported dtype 'Q7'");
}

TEST(SafetensorsTest, RefusesNegativeShape) {
  ExpectBad(Header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"),
            "non-negative");
}

TEST(SafetensorsTest, RefusesShapeOffsetMismatch) {
  ExpectBad(Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"), "needs 8");
}

TEST(SafetensorsTest, RefusesOffsetsOutOfRange) {
  ExpectBad(Header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd"),
            "out of range");
}

TEST(SafetensorsTest, RefusesOverlap) {
  ExpectBad(Header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                   "abcd"),
            "overlaps");
}

TEST(SafetensorsTest, RefusesHole) {
  ExpectBad(Header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "abcdefgh"),
            "belong to no tensor");
}

TEST(SafetensorsTest, RefusesTrailingBytes) {
  ExpectBad(Header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcdXY"),
            "trailing bytes");
}

TEST(SafetensorsTest, RefusesNonStringMetadata) {
  ExpectBad(Header(R"({"__metadata__":{"step":7}})", ""), "__metadata__.step is not a string");
}

TEST(SafetensorsTest, RefusesTruncatedFile) {
  SafetensorsWriter w;
  w.AddF32("a", Tensor({16}));
  std::string b = w.Serialize();
  b.resize(b.size() - 5);
  ExpectBad(b, "out of range");
}

TEST(SafetensorsTest, WritesAtomicallyThroughEnv) {
  MemEnv env;
  SafetensorsWriter w;
  w.AddF32("a", Tensor({3}, {1, 2, 3}));
  ASSERT_TRUE(w.Write(&env, "/m.safetensors").ok());
  Result<SafetensorsFile> f = SafetensorsFile::Read(&env, "/m.safetensors");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->GetF32("a")->vec(), (std::vector<float>{1, 2, 3}));
  EXPECT_FALSE(SafetensorsFile::Read(&env, "/missing.safetensors").ok());
}

}  // namespace
}  // namespace meshlearn::engine
