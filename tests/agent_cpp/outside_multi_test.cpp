// outside.cpp built against CUPTI 13.2's callback API (the stand-in with
// FAKE_CUPTI_13_2, tests/agent_cpp.rs): it subscribes with multiple
// subscribers allowed, so a profiler that allows them too runs beside it
// and it comes back after stepping aside; a profiler that will not share
// still gets CUPTI once it steps aside, and then this says why it cannot
// come back. Prints "ok WHAT" per check; exits 1 at the first failure.

#define VS_OUTSIDE_TEST 1
#define FAKE_CUPTI_13_2 1
#include "outside.cpp"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

int keep(const uint64_t*) { return 1; }

void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAIL %s\n", what);
    std::exit(1);
  }
  std::printf("ok %s\n", what);
}

}  // namespace

int main() {
  char why[128];
  check(vs_outside_start(keep, why, sizeof why) == 0 && fake_cupti_asked_multi == 1 && vs_outside_shared() == 1,
        "subscribes through cuptiSubscribe_v2 with multiple subscribers allowed");
  check(fake_cupti_other_subscribe(1) == CUPTI_SUCCESS, "a profiler that allows them too subscribes beside it");
  check(vs_outside_stop() == 0 && vs_outside_shared() == 0, "steps aside (as before every profile)");
  check(vs_outside_start(keep, why, sizeof why) == 0 && vs_outside_shared() == 1,
        "comes back while that profiler still holds CUPTI");
  fake_cupti_other_client = 0;
  check(fake_cupti_other_subscribe(0) == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
        "a profiler that will not share cannot subscribe beside it");
  check(vs_outside_stop() == 0 && fake_cupti_other_subscribe(0) == CUPTI_SUCCESS,
        "it gets CUPTI once this steps aside");
  check(vs_outside_start(keep, why, sizeof why) == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED &&
            vs_outside_shared() == 0 && std::string(why).find("MULTIPLE_SUBSCRIBERS") != std::string::npos,
        "then this cannot come back, and says why");
  return 0;
}
