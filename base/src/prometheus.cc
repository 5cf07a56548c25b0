#include "meshlearn/base/prometheus.h"

#include <charconv>
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "meshlearn/base/check.h"

namespace meshlearn {
namespace {

bool ValidName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string Escape(std::string_view v, bool quote) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && quote) out += "\\\"";
    else out += c;
  }
  return out;
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

}  // namespace

PrometheusText& PrometheusText::Family(std::string_view name, std::string_view type,
                                       std::string_view help) {
  CHECK(ValidName(name)) << "metric name " << name;
  text_ += "# HELP " + std::string(name) + " " + Escape(help, false) + "\n";
  text_ += "# TYPE " + std::string(name) + " " + std::string(type) + "\n";
  return *this;
}

PrometheusText& PrometheusText::Sample(std::string_view name, const MetricLabels& labels,
                                       uint64_t value) {
  Line(name, labels, std::to_string(value));
  return *this;
}

PrometheusText& PrometheusText::Sample(std::string_view name, const MetricLabels& labels,
                                       double value) {
  Line(name, labels, FormatDouble(value));
  return *this;
}

void PrometheusText::Line(std::string_view name, const MetricLabels& labels,
                          std::string_view value) {
  CHECK(ValidName(name)) << "metric name " << name;
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      CHECK(ValidName(labels[i].first) && labels[i].first.find(':') == std::string::npos)
          << "label name " << labels[i].first;
      if (i > 0) text_ += ',';
      text_ += labels[i].first + "=\"" + Escape(labels[i].second, true) + "\"";
    }
    text_ += '}';
  }
  text_ += ' ';
  text_ += value;
  text_ += '\n';
}

std::optional<double> PrometheusSample(std::string_view page, std::string_view series) {
  const std::string key = std::string(series) + " ";
  for (size_t at = page.find(key); at != std::string_view::npos; at = page.find(key, at + 1)) {
    if (at != 0 && page[at - 1] != '\n') continue;
    const size_t start = at + key.size();
    const size_t end = std::min(page.find('\n', start), page.size());
    return std::strtod(std::string(page.substr(start, end - start)).c_str(), nullptr);
  }
  return std::nullopt;
}

void LabeledCounters::Add(const std::vector<std::string>& label_values, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  counts_[label_values] += n;
}

std::map<std::vector<std::string>, uint64_t> LabeledCounters::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Write(PrometheusText& out, std::string_view name,
                      const MetricLabels& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string n(name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    MetricLabels l = labels;
    l.emplace_back("le", i < bounds_.size() ? FormatDouble(bounds_[i]) : "+Inf");
    out.Sample(n + "_bucket", l, cumulative);
  }
  out.Sample(n + "_sum", labels, sum_);
  out.Sample(n + "_count", labels, count_);
}

}  // namespace meshlearn
