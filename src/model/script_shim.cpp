// The TorchScript calls ddpbench needs and tch 0.24 lacks: a module's buffers
// (BatchNorm running statistics), which must be broadcast from rank 0 like its
// parameters, and a forward pass that says which type it returned instead of failing
// alike for every non-tensor. Tensors cross as heap-allocated at::Tensor, as tch's own
// C API passes them, so the Rust side wraps them with Tensor::from_ptr. Every call
// catches C++ exceptions and returns their text in *err (freed by
// ddpbench_script_free_text); no exception crosses into Rust.
#include <torch/script.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using torch::jit::Module;

namespace {
char *copy_text(const std::string &s) {
  char *p = static_cast<char *>(std::malloc(s.size() + 1));
  if (p != nullptr) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

at::Device device_of(int device) {
  return device < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
}
}  // namespace

extern "C" {
typedef void (*ddpbench_named_fn)(void *data, const char *name, void *tensor);

void ddpbench_script_free_text(char *text) { std::free(text); }

void *ddpbench_script_load(const char *path, int device, char **err) {
  try {
    return new Module(torch::jit::load(path, device_of(device)));
  } catch (const std::exception &e) {
    *err = copy_text(e.what());
    return nullptr;
  }
}

void ddpbench_script_free(void *module) { delete static_cast<Module *>(module); }

int ddpbench_script_set_train(void *module, int on, char **err) {
  try {
    static_cast<Module *>(module)->train(on != 0);
    return 0;
  } catch (const std::exception &e) {
    *err = copy_text(e.what());
    return 1;
  }
}

// Calls f once per parameter (buffers == 0) or buffer, with its dotted name, in the
// module's own order.
int ddpbench_script_named(void *module, int buffers, void *data, ddpbench_named_fn f, char **err) {
  try {
    auto *m = static_cast<Module *>(module);
    if (buffers != 0) {
      for (const auto &b : m->named_buffers()) f(data, b.name.c_str(), new at::Tensor(b.value));
    } else {
      for (const auto &p : m->named_parameters()) f(data, p.name.c_str(), new at::Tensor(p.value));
    }
    return 0;
  } catch (const std::exception &e) {
    *err = copy_text(e.what());
    return 1;
  }
}

// forward(inputs...): 0 and *out set when it returned one tensor; 1 when it threw (the
// text in *err); 2 when it returned something else (its type in *err).
int ddpbench_script_forward(void *module, void *const *inputs, int n, void **out, char **err) {
  try {
    std::vector<torch::jit::IValue> args;
    for (int i = 0; i < n; ++i) args.emplace_back(*static_cast<at::Tensor *>(inputs[i]));
    torch::jit::IValue result = static_cast<Module *>(module)->forward(std::move(args));
    if (!result.isTensor()) {
      *err = copy_text(result.type()->str());
      return 2;
    }
    *out = new at::Tensor(result.toTensor());
    return 0;
  } catch (const std::exception &e) {
    *err = copy_text(e.what());
    return 1;
  }
}

int ddpbench_script_save(void *module, const char *path, char **err) {
  try {
    static_cast<Module *>(module)->save(path);
    return 0;
  } catch (const std::exception &e) {
    *err = copy_text(e.what());
    return 1;
  }
}
}
