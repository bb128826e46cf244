// Mixed-precision autocast with an explicit device and dtype. tch 0.24's `tch::autocast` only reaches the
// deprecated CUDA-only switch (whose default dtype is fp16, not bf16) and nothing for the CPU, so ringtrain
// calls ATen's autocast state directly. Built by worker/build.rs against libtorch's headers.
#include <ATen/autocast_mode.h>

extern "C" {

// Enables bf16 autocast for `cuda` (1) or the CPU (0) and enters one nesting level; returns whether autocast
// was already enabled there (to restore it on exit).
int ringtrain_autocast_enter(int cuda) {
  try {
    const auto device = cuda ? at::kCUDA : at::kCPU;
    const bool was = at::autocast::is_autocast_enabled(device);
    at::autocast::set_autocast_enabled(device, true);
    at::autocast::set_autocast_dtype(device, at::kBFloat16);
    at::autocast::increment_nesting();
    return was ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

// Leaves the level entered above, restoring the previous state; the cache of casted weights is cleared when
// the outermost level ends (as torch.autocast does), so the next step casts the updated weights.
int ringtrain_autocast_exit(int cuda, int was_enabled) {
  try {
    const auto device = cuda ? at::kCUDA : at::kCPU;
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    at::autocast::set_autocast_enabled(device, was_enabled != 0);
    return 0;
  } catch (...) {
    return -1;
  }
}
}
