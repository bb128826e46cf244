// "This parameter's gradient is complete": what the overlapped all-reduce (worker/src/gradients/overlap.rs)
// needs to start summing a bucket while backward goes on. tch 0.24 exposes no autograd hooks, so this does
// what PyTorch DDP's reducer does (torch/csrc/distributed/c10d/reducer.cpp): a post hook on each parameter's
// AccumulateGrad node, which runs right after that node has written this backward's gradient into the
// parameter's .grad. The hook only tells Rust the parameter's index; what a bucket is, and when one is full,
// is decided there. Built by worker/build.rs against libtorch's headers.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "guarded.h"

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

// The hooks of one set of parameters. Each AccumulateGrad node is held here: a variable keeps only a weak
// reference to its node, and a node freed between two backwards would be made anew without the hook (DDP
// keeps them for the same reason).
struct GradHooks {
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;
};

}  // namespace

extern "C" {

typedef void (*ringtrain_grad_ready_callback)(void* ctx, size_t index);

// Adds a hook to each of `count` parameters (leaf tensors that require grad) that calls `callback(ctx, i)`
// once parameter i's gradient of a backward is accumulated. It runs on whichever thread runs that part of
// backward. `params` are tch tensors (tch's `C_tensor` is `at::Tensor`). Returns a handle for
// ringtrain_grad_hooks_remove, or null with *error set.
void* ringtrain_grad_hooks_add(at::Tensor** params, size_t count, ringtrain_grad_ready_callback callback,
                               void* ctx, char** error) {
  GradHooks* added = nullptr;
  guarded(error, [&] {
    auto hooks = std::make_unique<GradHooks>();
    for (size_t i = 0; i < count; ++i) {
      const at::Tensor& param = *params[i];
      if (!param.requires_grad() || !param.is_leaf()) {
        throw std::runtime_error("parameter " + std::to_string(i) + " is not a leaf tensor that requires grad");
      }
      auto accumulator = torch::autograd::impl::grad_accumulator(param);
      auto key = accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [callback, ctx, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            callback(ctx, i);
            return outputs;
          }));
      hooks->hooks.emplace_back(std::move(accumulator), key);
    }
    added = hooks.release();
  });
  return added;
}

// Removes the hooks of ringtrain_grad_hooks_add: after it returns, `callback` is never called again for them.
void ringtrain_grad_hooks_remove(void* handle) {
  auto* hooks = static_cast<GradHooks*>(handle);
  for (auto& [accumulator, key] : hooks->hooks) {
    accumulator->del_post_hook(key);
  }
  delete hooks;
}
}
