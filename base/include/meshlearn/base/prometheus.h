// Metrics in the Prometheus text exposition format (version 0.0.4), for the `GET /metrics` of
// `chain serve` and `node run` (docs/operators.md, "Metrics").
//
//   PrometheusText out;
//   out.Family("meshlearn_chain_height", "gauge", "Height of the last committed block.")
//      .Sample("meshlearn_chain_height", {}, chain.Height());
//   out.Family("meshlearn_rpc_requests_total", "counter", "JSON-RPC requests answered.");
//   for (auto& [labels, n] : requests.Snapshot())
//     out.Sample("meshlearn_rpc_requests_total", {{"method", labels[0]}, {"status", labels[1]}}, n);
//   res.set_content(out.text(), PrometheusText::kContentType);
//
// Metric and label names are the caller's constants ([a-zA-Z_:][a-zA-Z0-9_:]*, CHECKed); label
// values are escaped (backslash, double quote, newline), so a hostile value cannot break a line.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshlearn {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class PrometheusText {
 public:
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

  // "# HELP" and "# TYPE" lines of a family; `type` is counter, gauge, histogram or untyped.
  PrometheusText& Family(std::string_view name, std::string_view type, std::string_view help);
  // One sample line. Integers are written exactly; doubles shortest-round-trip ("+Inf" too).
  PrometheusText& Sample(std::string_view name, const MetricLabels& labels, uint64_t value);
  PrometheusText& Sample(std::string_view name, const MetricLabels& labels, double value);

  const std::string& text() const { return text_; }

 private:
  void Line(std::string_view name, const MetricLabels& labels, std::string_view value);
  std::string text_;
};

// The value of the sample line `series` ("name", or "name{labels}" exactly as written) in a
// scraped page; nullopt if the page has none. For tests and tools that read a scrape.
std::optional<double> PrometheusSample(std::string_view page, std::string_view series);

// Counters keyed by label values (e.g. {method, status}), safe to bump from any thread.
class LabeledCounters {
 public:
  void Add(const std::vector<std::string>& label_values, uint64_t n = 1);
  std::map<std::vector<std::string>, uint64_t> Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, uint64_t> counts_;
};

// Cumulative histogram with fixed upper bounds (seconds, bytes, ...), safe from any thread.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // Writes name_bucket{le=...}, name_sum and name_count (the family line is the caller's).
  void Write(PrometheusText& out, std::string_view name, const MetricLabels& labels = {}) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

}  // namespace meshlearn
