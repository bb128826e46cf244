// Exceptions must not cross into Rust: each extern "C" entry point of csrc/ runs its body through `guarded`,
// which turns any exception into a malloc'd message the Rust side reads and frees
// (ringtrain_script_free_error; worker/src/models/scripted.rs's `check`).
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>

namespace {

char* copy_message(const char* what) {
  char* out = static_cast<char*>(std::malloc(std::strlen(what) + 1));
  if (out != nullptr) {
    std::strcpy(out, what);
  }
  return out;
}

// Runs `body`, turning any exception into a malloc'd message in *error (freed by ringtrain_script_free_error).
template <typename F>
int guarded(char** error, F body) {
  try {
    body();
    return 0;
  } catch (const c10::Error& e) {
    *error = copy_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    *error = copy_message(e.what());
  } catch (...) {
    *error = copy_message("unknown C++ exception");
  }
  return -1;
}

}  // namespace
