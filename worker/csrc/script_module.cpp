// An uploaded TorchScript module, as the trainer needs it. tch 0.24's CModule loads, runs and saves a module
// and lists its parameters, but not its buffers (BatchNorm's running statistics) nor which module type owns a
// tensor, and its pointer is private; these few functions give ringtrain both, on a module of its own.
// Tensors cross as `new torch::Tensor(...)`: the same TensorImpl as the module's, owned by the Rust side
// (tch's Tensor::from_ptr frees it), so an update of the Rust tensor is an update of the module's.
// Built by worker/build.rs against libtorch's headers.
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/script.h>

#include "guarded.h"

#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

std::string type_name(const torch::jit::Module& module) {
  auto type = module.type();
  return type->name() ? type->name()->qualifiedName() : std::string("?");
}

// Every node kind in `block` and the blocks nested in it (if/loop bodies, closures, a fork's subgraph),
// once per (kind, function).
void collect_kinds(torch::jit::Block* block, const std::string& function,
                   std::set<std::pair<std::string, std::string>>& seen) {
  for (torch::jit::Node* node : block->nodes()) {
    seen.emplace(node->kind().toQualString(), function);
    for (torch::jit::Block* nested : node->blocks()) {
      collect_kinds(nested, function, seen);
    }
    if (node->hasAttribute(c10::attr::Subgraph) && node->kindOf(c10::attr::Subgraph) == torch::jit::AttributeKind::g) {
      collect_kinds(node->g(c10::attr::Subgraph)->block(), function, seen);
    }
  }
}

}  // namespace

extern "C" {

typedef void (*ringtrain_tensor_callback)(void* ctx, const char* name, const char* owner_type, int is_buffer,
                                          torch::Tensor* tensor);

void ringtrain_script_free_error(char* error) { std::free(error); }

// Loads a TorchScript file onto the CPU (device < 0) or CUDA device `device`.
void* ringtrain_script_load(const char* path, int device, char** error) {
  torch::jit::Module* loaded = nullptr;
  guarded(error, [&] {
    const auto where = device < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, device);
    loaded = new torch::jit::Module(torch::jit::load(std::string(path), where));
  });
  return loaded;
}

// Loads a TorchScript module from `length` bytes in memory (a member of a composite model's archive); the
// bytes are copied, so the caller may free them after the call.
void* ringtrain_script_load_bytes(const char* bytes, size_t length, int device, char** error) {
  torch::jit::Module* loaded = nullptr;
  guarded(error, [&] {
    const auto where = device < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, device);
    std::istringstream stream(std::string(bytes, length));
    loaded = new torch::jit::Module(torch::jit::load(stream, where));
  });
  return loaded;
}

void ringtrain_script_free(void* module) { delete static_cast<torch::jit::Module*>(module); }

// Every parameter and buffer, with its dotted name (as PyTorch's state_dict names it) and the qualified type
// name of the module that holds it directly (e.g. __torch__.torch.nn.modules.batchnorm.BatchNorm1d).
int ringtrain_script_tensors(void* module, void* ctx, ringtrain_tensor_callback callback, char** error) {
  return guarded(error, [&] {
    auto& root = *static_cast<torch::jit::Module*>(module);
    for (const auto& sub : root.named_modules()) {
      const std::string prefix = sub.name.empty() ? "" : sub.name + ".";
      const std::string owner = type_name(sub.value);
      for (const auto& p : sub.value.named_parameters(false)) {
        callback(ctx, (prefix + p.name).c_str(), owner.c_str(), 0, new torch::Tensor(p.value));
      }
      for (const auto& b : sub.value.named_buffers(false)) {
        callback(ctx, (prefix + b.name).c_str(), owner.c_str(), 1, new torch::Tensor(b.value));
      }
    }
  });
}

// forward(*inputs): the output must be one tensor.
int ringtrain_script_forward(void* module, torch::Tensor** inputs, int count, torch::Tensor** output,
                             char** error) {
  return guarded(error, [&] {
    std::vector<c10::IValue> args;
    args.reserve(count);
    for (int i = 0; i < count; ++i) {
      args.emplace_back(*inputs[i]);
    }
    auto result = static_cast<torch::jit::Module*>(module)->forward(std::move(args));
    if (!result.isTensor()) {
      throw std::runtime_error("forward returned a " + result.tagKind() + ", not one tensor");
    }
    *output = new torch::Tensor(result.toTensor());
  });
}

typedef void (*ringtrain_operator_callback)(void* ctx, const char* kind, const char* function);

// Every operator that any code of the module can run: each function of its compilation unit (the methods of
// every submodule and class -- forward, __setstate__, helpers -- and free functions), plus each method of each
// submodule in case one lives in another unit. The operator allow-list walks this.
int ringtrain_script_operators(void* module, void* ctx, ringtrain_operator_callback callback, char** error) {
  return guarded(error, [&] {
    auto& root = *static_cast<torch::jit::Module*>(module);
    std::set<std::pair<std::string, std::string>> seen;
    auto visit = [&](torch::jit::Function& function) {
      if (function.isGraphFunction()) {
        collect_kinds(torch::jit::toGraphFunction(function).graph()->block(), function.qualname().qualifiedName(), seen);
      }
    };
    for (torch::jit::Function* function : root._ivalue()->compilation_unit()->get_functions()) {
      visit(*function);
    }
    for (const auto& sub : root.named_modules()) {
      for (const auto& method : sub.value.get_methods()) {
        visit(method.function());
      }
    }
    for (const auto& [kind, function] : seen) {
      callback(ctx, kind.c_str(), function.c_str());
    }
  });
}

// Every operator registered in this libtorch, with its schema (for the allow-list's own test).
void ringtrain_registered_operators(void* ctx, ringtrain_operator_callback callback) {
  for (const auto& op : torch::jit::getAllOperators()) {
    std::ostringstream schema;
    schema << op->schema();
    callback(ctx, op->schema().name().c_str(), schema.str().c_str());
  }
}

int ringtrain_script_set_train(void* module, int on, char** error) {
  return guarded(error, [&] { static_cast<torch::jit::Module*>(module)->train(on != 0); });
}

int ringtrain_script_save(void* module, const char* path, char** error) {
  return guarded(error, [&] { static_cast<torch::jit::Module*>(module)->save(std::string(path)); });
}
}
