// A stand-in for torch's c10/core/GradMode.h: only what
// assets/agent/fastcall.cpp uses, for tests/agent_attrib (no torch on CI).
#pragma once

namespace c10 {
struct GradMode {
    static bool is_enabled() { return true; }
};
}  // namespace c10
