// A progress bar for long work, on stderr: bar, count, rate, ETA and a free-form status.
//
//   ProgressBar bar("train", total_steps, "step");
//   for (...) { ...; bar.Update(step + 1, fmt::format("loss {:.4f}", loss)); }
//   bar.Finish();
//
// On a terminal it redraws one line (at most 10 times a second); otherwise (CI, pipes) it prints
// a plain line every 10% so logs stay readable. Disabled entirely when `enabled` is false
// (--json output).
#pragma once

#include <cstdint>
#include <string>

namespace meshlearn {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit, bool enabled = true);
  ~ProgressBar();
  void Update(int64_t done, const std::string& status = "");
  void Finish(const std::string& status = "");

  // "1m05s", "3h02m" — shared by reports.
  static std::string FormatDuration(double seconds);

 private:
  void Draw(bool final_line);

  std::string label_;
  int64_t total_;
  std::string unit_;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  int64_t done_ = 0;
  std::string status_;
  int64_t start_us_;
  int64_t last_draw_us_ = 0;
  int last_decile_ = -1;
};

}  // namespace meshlearn
