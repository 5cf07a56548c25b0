#include "meshlearn/base/config.h"

#include <gtest/gtest.h>

namespace meshlearn {
namespace {

constexpr char kTask[] = R"(
name = "fashion"
steps = 100
[optimizer]
kind = "adamw"
lr = 0.001
[[layers]]
kind = "linear"
out = 256
[[layers]]
kind = "relu"
)";

ConfigFile Parse(const char* text) {
  Result<ConfigFile> c = ConfigFile::Parse(text, "task.toml");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

TEST(Config, TypedValuesAndDefaults) {
  ConfigFile c = Parse(kTask);
  EXPECT_EQ(*c.GetString("name"), "fashion");
  EXPECT_EQ(*c.GetInt("steps"), 100);
  EXPECT_DOUBLE_EQ(*c.GetDouble("optimizer.lr"), 0.001);
  EXPECT_EQ(*c.GetInt("batch", 64), 64);
  EXPECT_EQ(*c.GetEnum("optimizer.kind", {"sgd", "adamw"}), "adamw");
  Result<std::vector<ConfigFile>> layers = c.GetTableArray("layers");
  ASSERT_TRUE(layers.ok());
  ASSERT_EQ(layers->size(), 2u);
  EXPECT_EQ(*(*layers)[0].GetInt("out"), 256);
}

TEST(Config, ErrorsNameFileKeyAndFix) {
  ConfigFile c = Parse("[optimizer]\nlr = -1\n");
  Result<double> lr = c.GetDouble("optimizer.lr", {.min = 0, .min_exclusive = true});
  ASSERT_FALSE(lr.ok());
  EXPECT_EQ(lr.status().message(), "task.toml: optimizer.lr must be > 0, got -1");

  Result<int64_t> missing = c.GetInt("steps");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "task.toml: steps is missing; add it (an integer)");

  Result<std::string> wrong_type = c.GetString("optimizer.lr");
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_NE(wrong_type.status().message().find("must be a string, got -1"), std::string::npos);
}

TEST(Config, SubTableErrorsKeepFullKey) {
  ConfigFile c = Parse(kTask);
  std::vector<ConfigFile> layers = *c.GetTableArray("layers");
  Result<int64_t> r = layers[1].GetInt("out");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layers[1].out is missing"), std::string::npos);
}

TEST(Config, UnknownKeySuggestsClosest) {
  ConfigFile c = Parse("optimzer = 1\n");
  Status s = c.CheckKnownKeys({"optimizer", "steps"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown key 'optimzer' (did you mean 'optimizer'?)"),
            std::string::npos);
}

TEST(Config, InvalidTomlReportsLine) {
  Result<ConfigFile> c = ConfigFile::Parse("a = 1\nb = = 2\n", "bad.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind("bad.toml:2:", 0), 0u) << c.status().message();
}

TEST(Config, EnumRejectsOthers) {
  ConfigFile c = Parse("kind = \"lbfgs\"\n");
  Result<std::string> k = c.GetEnum("kind", {"sgd", "adamw"});
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().message(), "task.toml: kind must be one of sgd, adamw, got \"lbfgs\"");
}

TEST(Config, LoadMissingFile) {
  MemEnv env;
  Result<ConfigFile> c = ConfigFile::Load(&env, "/nope.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nope.toml"), std::string::npos);
}

TEST(Config, NonFiniteRejected) {
  ConfigFile c = Parse("x = nan\ny = inf\n");
  EXPECT_FALSE(c.GetDouble("x").ok());
  EXPECT_FALSE(c.GetDouble("y").ok());
}

}  // namespace
}  // namespace meshlearn
