// CHECK macros: a broken invariant aborts with file, line and a message. They are for bugs,
// never for bad input (bad input gets a Status).
//
//   CHECK(n > 0) << "n=" << n;
//   CHECK_EQ(a.size(), b.size());
//   DCHECK(...)  // compiled out in release builds (NDEBUG) unless under sanitizers
#pragma once

#include <sstream>

namespace meshlearn::internal {

// Collects the streamed message and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `CHECK(x) << ...` be an expression of type void.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace meshlearn::internal

#define CHECK(condition)                   \
  (condition) ? (void)0                    \
              : ::meshlearn::internal::Voidify() & \
                    ::meshlearn::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#define ML_CHECK_OP_(a, b, op) CHECK((a)op(b)) << #a " = " << (a) << ", " #b " = " << (b) << " "
#define CHECK_EQ(a, b) ML_CHECK_OP_(a, b, ==)
#define CHECK_NE(a, b) ML_CHECK_OP_(a, b, !=)
#define CHECK_LT(a, b) ML_CHECK_OP_(a, b, <)
#define CHECK_LE(a, b) ML_CHECK_OP_(a, b, <=)
#define CHECK_GT(a, b) ML_CHECK_OP_(a, b, >)
#define CHECK_GE(a, b) ML_CHECK_OP_(a, b, >=)

#if defined(NDEBUG) && !defined(MESHLEARN_SANITIZE)
#define DCHECK(condition) \
  while (false) CHECK(condition)
#else
#define DCHECK(condition) CHECK(condition)
#endif
