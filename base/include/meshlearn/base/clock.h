// Time comes in through Clock so protocol and ledger code can run on virtual time in tests.
#pragma once

#include <cstdint>

namespace meshlearn {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch (SystemClock) or since an arbitrary zero (FakeClock).
  virtual int64_t NowMillis() const = 0;
  // Monotonic microseconds, for measuring durations.
  virtual int64_t MonotonicMicros() const = 0;
};

// The real clock. Thread-safe.
class SystemClock final : public Clock {
 public:
  int64_t NowMillis() const override;
  int64_t MonotonicMicros() const override;
  static SystemClock* Default();
};

// Virtual time that moves only when told. Not thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_millis = 0) : now_micros_(start_millis * 1000) {}
  int64_t NowMillis() const override { return now_micros_ / 1000; }
  int64_t MonotonicMicros() const override { return now_micros_; }
  void AdvanceMillis(int64_t ms) { now_micros_ += ms * 1000; }
  void AdvanceMicros(int64_t us) { now_micros_ += us; }
  void SetMillis(int64_t ms) { now_micros_ = ms * 1000; }

 private:
  int64_t now_micros_;
};

}  // namespace meshlearn
