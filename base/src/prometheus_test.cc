#include "meshlearn/base/prometheus.h"

#include <gtest/gtest.h>

namespace meshlearn {
namespace {

TEST(PrometheusText, FamiliesSamplesAndEscaping) {
  PrometheusText out;
  out.Family("m_total", "counter", "Help with a \\ backslash\nand a newline.")
      .Sample("m_total", {}, uint64_t{18446744073709551615ull})
      .Sample("m_total", {{"method", "a\"b\\c\nd"}}, 0.5);
  EXPECT_EQ(out.text(),
            "# HELP m_total Help with a \\\\ backslash\\nand a newline.\n"
            "# TYPE m_total counter\n"
            "m_total 18446744073709551615\n"
            "m_total{method=\"a\\\"b\\\\c\\nd\"} 0.5\n");
}

TEST(PrometheusText, HistogramBucketsAreCumulative) {
  Histogram h({1, 10});
  for (double v : {0.5, 1.0, 5.0, 50.0}) h.Observe(v);
  PrometheusText out;
  h.Write(out, "d_seconds", {{"kind", "unit"}});
  EXPECT_EQ(out.text(),
            "d_seconds_bucket{kind=\"unit\",le=\"1\"} 2\n"
            "d_seconds_bucket{kind=\"unit\",le=\"10\"} 3\n"
            "d_seconds_bucket{kind=\"unit\",le=\"+Inf\"} 4\n"
            "d_seconds_sum{kind=\"unit\"} 56.5\n"
            "d_seconds_count{kind=\"unit\"} 4\n");
}

TEST(PrometheusText, SampleReadsBackTheValueOfOneSeries) {
  PrometheusText out;
  out.Family("x_total", "counter", "h")
      .Sample("x_total", {{"a", "1"}}, uint64_t{7})
      .Sample("x_total", {}, 2.5);
  EXPECT_EQ(PrometheusSample(out.text(), "x_total{a=\"1\"}"), 7.0);
  EXPECT_EQ(PrometheusSample(out.text(), "x_total"), 2.5);
  EXPECT_EQ(PrometheusSample(out.text(), "x"), std::nullopt);  // a prefix is not a series
}

TEST(LabeledCounters, CountsPerLabelSet) {
  LabeledCounters c;
  c.Add({"get_task", "ok"});
  c.Add({"get_task", "ok"}, 2);
  c.Add({"send_tx", "-32000"});
  auto snap = c.Snapshot();
  EXPECT_EQ((snap[{"get_task", "ok"}]), 3u);
  EXPECT_EQ((snap[{"send_tx", "-32000"}]), 1u);
  EXPECT_EQ(snap.size(), 2u);
}

}  // namespace
}  // namespace meshlearn
