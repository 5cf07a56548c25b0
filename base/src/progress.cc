#include "meshlearn/base/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace meshlearn {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_us_(NowMicros()) {}

ProgressBar::~ProgressBar() {
  if (!finished_) Finish();
}

std::string ProgressBar::FormatDuration(double seconds) {
  if (seconds < 0 || seconds != seconds) return "?";
  char buf[32];
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  }
  return buf;
}

void ProgressBar::Update(int64_t done, const std::string& status) {
  done_ = done;
  status_ = status;
  if (!enabled_) return;
  int64_t now = NowMicros();
  if (tty_) {
    if (now - last_draw_us_ < 100000 && done_ < total_) return;
  } else {
    int decile = total_ > 0 ? static_cast<int>(10 * done_ / total_) : 0;
    if (decile == last_decile_) return;
    last_decile_ = decile;
  }
  last_draw_us_ = now;
  Draw(false);
}

void ProgressBar::Finish(const std::string& status) {
  if (finished_) return;
  finished_ = true;
  if (!status.empty()) status_ = status;
  if (enabled_) Draw(true);
}

void ProgressBar::Draw(bool final_line) {
  double elapsed = static_cast<double>(NowMicros() - start_us_) / 1e6;
  double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
  double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : -1;
  constexpr int kWidth = 24;
  int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : 0;
  if (filled > kWidth) filled = kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  int pct = total_ > 0 ? static_cast<int>(100 * done_ / total_) : 0;
  std::string time = final_line ? "took " + FormatDuration(elapsed) : "ETA " + FormatDuration(eta);
  std::fprintf(stderr, "%s%s [%s] %3d%% %lld/%lld %s  %.1f %s/s  %s  %s%s", tty_ ? "\r\033[K" : "",
               label_.c_str(), bar.c_str(), pct, static_cast<long long>(done_),
               static_cast<long long>(total_), unit_.c_str(), rate, unit_.c_str(), time.c_str(),
               status_.c_str(), (tty_ && !final_line) ? "" : "\n");
  std::fflush(stderr);
}

}  // namespace meshlearn
