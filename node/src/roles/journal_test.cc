// The node's journal format (roles/journal.h): round trip, and every way a file can be wrong is
// an error naming the file and the field, never a default.
#include "journal.h"

#include <gtest/gtest.h>

#include "meshlearn/base/env.h"
#include "records.h"

namespace meshlearn::node::journal {
namespace {

using nlohmann::json;

UnitProgress Sample() {
  return UnitProgress{.start_state = Blake2b("start"),
                      .stream = 7,
                      .step = 20,
                      .loss_sum_bits = 0x400921fb54442d18ull,
                      .checkpoint = "ckpt-20.safetensors",
                      .hashes = {Blake2b("a"), Blake2b("b")}};
}

void ExpectError(const std::string& text, const std::string& needle) {
  Result<UnitProgress> r = DecodeJournal<UnitProgress>(text, "units/x/progress.json");
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("units/x/progress.json"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
}

TEST(JournalTest, RoundTripsThroughAFileWrittenAtomically) {
  MemEnv env;
  ASSERT_TRUE(env.CreateDirs("/d").ok());
  ASSERT_TRUE(WriteJournal(&env, "/d/progress.json", Sample()).ok());
  Result<UnitProgress> back = ReadJournal<UnitProgress>(&env, "/d/progress.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->start_state, Sample().start_state);
  EXPECT_EQ(back->stream, 7u);
  EXPECT_EQ(back->step, 20);
  EXPECT_EQ(back->loss_sum_bits, Sample().loss_sum_bits);
  EXPECT_EQ(back->checkpoint, "ckpt-20.safetensors");
  EXPECT_EQ(back->hashes, Sample().hashes);
  json j = json::parse(EncodeJournal(Sample()));
  EXPECT_EQ(j["journal"], "unit_progress");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(ReadJournal<UnitProgress>(&env, "/d/none.json").status().code(),
            StatusCode::kNotFound);
}

TEST(JournalTest, AMissingUnknownOrMistypedFieldIsAnErrorNamingIt) {
  json j = json::parse(EncodeJournal(Sample()));
  json missing = j;
  missing["record"].erase("stream");
  ExpectError(missing.dump(), "stream missing");
  json unknown = j;
  unknown["record"]["streams"] = 7;  // a renamed field
  ExpectError(unknown.dump(), "unknown field streams");
  json mistyped = j;
  mistyped["record"]["step"] = "20";
  ExpectError(mistyped.dump(), "step");
  json bad_hash = j;
  bad_hash["record"]["hashes"] = {"zz"};
  ExpectError(bad_hash.dump(), "hashes");
}

TEST(JournalTest, AnotherKindOrVersionIsRefused) {
  json j = json::parse(EncodeJournal(Sample()));
  json other = j;
  other["version"] = 2;
  ExpectError(other.dump(), "version 2");
  other = j;
  other["journal"] = "unit_done";
  ExpectError(other.dump(), "not a unit_progress journal");
  ExpectError("{\"epoch\": 3}", "unknown key epoch");  // the loose JSON of before
  ExpectError("not json", "not a JSON object");
  // A record of one kind does not read as another.
  EXPECT_FALSE(DecodeJournal<UnitDone>(EncodeJournal(Sample()), "f").ok());
}

}  // namespace
}  // namespace meshlearn::node::journal
