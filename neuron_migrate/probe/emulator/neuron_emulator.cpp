// neuron-migrate's emulated `neuron` device: a PrivateUse1 backend whose memory is host memory.
//
// Built on first use by neuron_migrate/probe/emulator/build.py (g++, against the installed torch) and loaded
// with torch.ops.load_library. It talks to Python only through the `neuron_emu::*` ops defined at the end.
//
// What it provides (see shared/design/PRIVATEUSE1.md for the measured facts behind it):
// - an allocator, a device guard and PrivateUse1 hooks (device count, current device, generators);
// - the kernels every backend needs: empty, empty_strided, the views with backend kernels, resize_, set_,
//   copies between host and device, _local_scalar_dense (`.item()`);
// - "device kernels" registered at run time for a list of op overloads (the ones the compat table calls
//   native): they compute on the host through at::native::cpu_fallback and are tracked as executed;
// - kernels that raise like the device for ops the table calls unsupported (or run and are tracked, when
//   keep-going is on);
// - a boxed CPU fallback for every other op, tracked like torch_neuronx's get_fallback_ops();
// - c10d collectives on device tensors routed to the process group's CPU backend (gloo) through host
//   aliases of the same memory, so `init_process_group("neuron")` works unchanged.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr c10::DeviceType kEmu = c10::DeviceType::PrivateUse1;

std::atomic<int> g_device_count{1};
thread_local c10::DeviceIndex tl_device = 0;
std::atomic<bool> g_keep_going{false};

// ------------------------------------------------------------------------------------------ tracking

struct Tracker {
  std::mutex mu;
  std::unordered_map<std::string, int64_t> counts;
  void add(const c10::OperatorHandle& op) {
    const auto& n = op.operator_name();
    std::string key = n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
    std::lock_guard<std::mutex> g(mu);
    ++counts[key];
  }
  void add_name(const std::string& key) {
    std::lock_guard<std::mutex> g(mu);
    ++counts[key];
  }
  std::tuple<std::vector<std::string>, std::vector<int64_t>> dump() {
    std::lock_guard<std::mutex> g(mu);
    std::map<std::string, int64_t> sorted(counts.begin(), counts.end());
    std::vector<std::string> names;
    std::vector<int64_t> n;
    for (auto& kv : sorted) {
      names.push_back(kv.first);
      n.push_back(kv.second);
    }
    return {names, n};
  }
  void clear() {
    std::lock_guard<std::mutex> g(mu);
    counts.clear();
  }
};

Tracker g_fallback, g_executed, g_unsupported;

void check_index(c10::DeviceIndex i) {
  TORCH_CHECK(i >= 0 && i < g_device_count.load(), "neuron (emulated): invalid device index ", int(i),
              "; the emulated device has ", g_device_count.load(), " device(s)");
}

// ------------------------------------------------------------------------------------------ memory

void emu_delete(void* p) { c10::free_cpu(p); }

struct EmuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    return {p, p, &emu_delete, c10::Device(kEmu, tl_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &emu_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

EmuAllocator g_alloc;
REGISTER_ALLOCATOR(kEmu, &g_alloc);

struct DeviceScope {  // the allocator reads the thread's current device
  c10::DeviceIndex saved;
  explicit DeviceScope(std::optional<c10::Device> d) : saved(tl_device) {
    if (d.has_value() && d->type() == kEmu && d->has_index()) {
      check_index(d->index());
      tl_device = d->index();
    }
  }
  ~DeviceScope() { tl_device = saved; }
};

// A CPU tensor over the same memory as a device tensor (the device's memory is host memory); it keeps the
// device storage alive.
at::Tensor host_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kEmu) return t;
  c10::Storage src = t.storage();
  void* data = src.mutable_data();
  auto ctx = new c10::Storage(src);
  c10::DataPtr dp(data, ctx, [](void* c) { delete static_cast<c10::Storage*>(c); }, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), src.nbytes(), std::move(dp), nullptr, false);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

// ------------------------------------------------------------------------------------------ guard, hooks

struct EmuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kEmu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kEmu, tl_device); }
  void setDevice(c10::Device d) const override {
    if (d.has_index()) {
      check_index(d.index());
      tl_device = d.index();
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) tl_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return g_device_count.load(); }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmuGuard);

struct EmuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();  // random ops compute on the host
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override { return at::detail::createCPUGenerator(); }
  c10::DeviceIndex deviceCount() const override { return g_device_count.load(); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    check_index(d);
    tl_device = d;
  }
  c10::DeviceIndex getCurrentDevice() const override { return tl_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = tl_device;
    setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kEmu, tl_device); }
  bool isPinnedPtr(const void*) const override { return false; }
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "neuron (emulated): trying to resize a storage that is not resizable");
    size_t old = impl->nbytes();
    c10::DataPtr fresh = g_alloc.allocate(newsize);
    if (old && newsize) std::memcpy(fresh.get(), impl->data(), std::min(old, newsize));
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new EmuHooks()); }
};
RegisterHooks g_register_hooks;

// ------------------------------------------------------------------------------------------ core kernels

at::Tensor emu_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                     std::optional<at::Device> device, std::optional<bool> pin,
                     std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided,
              "neuron (emulated): only strided (dense) tensors exist on the device, got layout ", *layout);
  DeviceScope scope(device);
  return at::detail::empty_generic(size, &g_alloc, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor emu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                             std::optional<at::Layout> layout, std::optional<at::Device> device,
                             std::optional<bool> pin) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided,
              "neuron (emulated): only strided (dense) tensors exist on the device, got layout ", *layout);
  DeviceScope scope(device);
  return at::detail::empty_strided_generic(size, stride, &g_alloc,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor emu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = host_alias(dst);
  at::Tensor s = host_alias(self);
  TORCH_CHECK(d.device().is_cpu() && s.device().is_cpu(),
              "neuron (emulated): copies only between the host and the emulated device, got ", self.device(), " -> ",
              dst.device());
  d.copy_(s, non_blocking);
  return dst;
}

at::Tensor emu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return emu_copy_from(self, dst, false);
}

at::Scalar emu_local_scalar_dense(const at::Tensor& self) { return at::_local_scalar_dense(host_alias(self)); }

const at::Tensor& emu_resize_(const at::Tensor& self, c10::IntArrayRef size,
                              std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() == size && !memory_format.has_value()) return self;
  impl->set_sizes_contiguous(size);
  if (memory_format.has_value()) impl->empty_tensor_restride(*memory_format);
  size_t needed = (size_t)(impl->numel() + impl->storage_offset()) * self.dtype().itemsize();
  if (impl->numel() == 0) needed = 0;
  const c10::Storage& st = impl->storage();
  if (needed > st.nbytes()) {
    DeviceScope scope(self.device());
    at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(st, needed);
  }
  return self;
}

at::Tensor& emu_set_storage_offset_(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                                    c10::IntArrayRef stride) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  return self;
}

at::Tensor& emu_set_storage_(at::Tensor& self, c10::Storage source) {
  int64_t n = (int64_t)(source.nbytes() / self.dtype().itemsize());
  return emu_set_storage_offset_(self, std::move(source), 0, {n}, {});
}

at::Tensor& emu_set_empty_(at::Tensor& self) {
  DeviceScope scope(self.device());
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, &g_alloc, true);
  return emu_set_storage_offset_(self, std::move(st), 0, {0}, {});
}

// ------------------------------------------------------------------------------------------ boxed kernels

void fallback_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  g_fallback.add(op);
  at::native::cpu_fallback(op, stack);
}

void native_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  g_executed.add(op);
  at::native::cpu_fallback(op, stack);
}

void unsupported_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  g_unsupported.add(op);
  if (g_keep_going.load()) {
    at::native::cpu_fallback(op, stack);
    return;
  }
  const auto& n = op.operator_name();
  TORCH_CHECK_NOT_IMPLEMENTED(false, "neuron: ", n.name, n.overload_name.empty() ? "" : ".", n.overload_name,
                              " is not supported on the neuron device (emulated device: the compatibility table "
                              "rates it unsupported)");
}

// c10d collectives: swap device tensors for host aliases, run the CPU kernel (the process group's CPU
// backend, gloo), and hand back the caller's own tensors.
void collective_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  std::unordered_map<c10::TensorImpl*, at::Tensor> back;
  auto swap = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != kEmu) return t;
    at::Tensor h = host_alias(t);
    back[h.unsafeGetTensorImpl()] = t;
    return h;
  };
  for (size_t i = stack->size() - nargs; i < stack->size(); ++i) {
    auto& iv = (*stack)[i];
    if (iv.isTensor()) {
      iv = swap(iv.toTensor());
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : iv.toTensorList()) l.push_back(swap(t));
      iv = l;
    } else if (iv.isList()) {  // Tensor[][]
      auto outer = iv.toList();
      bool nested = false;
      c10::impl::GenericList nl(outer.elementType());
      for (size_t k = 0; k < outer.size(); ++k) {
        c10::IValue e = outer.get(k);
        if (e.isTensorList()) {
          nested = true;
          c10::List<at::Tensor> l;
          for (const at::Tensor& t : e.toTensorList()) l.push_back(swap(t));
          nl.push_back(l);
        } else {
          nl.push_back(e);
        }
      }
      if (nested) iv = nl;
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  auto unswap = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    auto it = back.find(t.unsafeGetTensorImpl());
    return it == back.end() ? t : it->second;
  };
  const size_t nret = schema.returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    auto& iv = (*stack)[i];
    if (iv.isTensor()) {
      iv = unswap(iv.toTensor());
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : iv.toTensorList()) l.push_back(unswap(t));
      iv = l;
    }
  }
}

std::mutex g_lib_mu;
std::vector<std::unique_ptr<torch::Library>> g_libs;

std::vector<std::string> register_kernels(const std::string& kind, const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> g(g_lib_mu);
  std::vector<std::string> failed;
  std::map<std::string, std::vector<std::string>> by_ns;
  for (const auto& full : names) {
    auto pos = full.find("::");
    if (pos == std::string::npos) {
      by_ns["aten"].push_back(full);
    } else {
      by_ns[full.substr(0, pos)].push_back(full.substr(pos + 2));
    }
  }
  for (auto& kv : by_ns) {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, kv.first, c10::DispatchKey::PrivateUse1,
                                                __FILE__, __LINE__);
    for (const auto& n : kv.second) {
      try {
        if (kind == "native") {
          lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&native_kernel>());
        } else if (kind == "unsupported") {
          lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&unsupported_kernel>());
        } else if (kind == "fallback") {
          lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback_kernel>());
        } else if (kind == "collective") {
          lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&collective_kernel>());
        } else {
          TORCH_CHECK(false, "unknown kernel kind ", kind);
        }
      } catch (const std::exception& e) {
        failed.push_back(kv.first + "::" + n + ": " + e.what());
      }
    }
    g_libs.push_back(std::move(lib));
  }
  return failed;
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> tracked(const std::string& kind) {
  if (kind == "fallback") return g_fallback.dump();
  if (kind == "executed") return g_executed.dump();
  if (kind == "unsupported") return g_unsupported.dump();
  TORCH_CHECK(false, "unknown tracker ", kind);
}

void clear_tracking() {
  g_fallback.clear();
  g_executed.clear();
  g_unsupported.clear();
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback_kernel>()); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", emu_empty);
  m.impl("empty_strided", emu_empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("resize_", emu_resize_);
  m.impl("_copy_from", emu_copy_from);
  m.impl("_copy_from_and_resize", emu_copy_from_and_resize);
  m.impl("_local_scalar_dense", emu_local_scalar_dense);
  m.impl("set_.source_Storage", emu_set_storage_);
  m.impl("set_.source_Storage_storage_offset", emu_set_storage_offset_);
  m.impl("set_.source_Tensor", at::native::set_tensor_);
  m.impl("set_", emu_set_empty_);
}

// torch.autocast("neuron"): the CUDA op lists (TorchNeuron follows them), as torch registers them for CUDA.
#define NM_AUTOCAST_LOW(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NM_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NM_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NM_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

namespace at::autocast {  // the macros name at::autocast types unqualified
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NM_AUTOCAST_LOW)
  AT_FORALL_FP32(NM_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NM_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NM_AUTOCAST_PROMOTE)
}
}  // namespace at::autocast

TORCH_LIBRARY(neuron_emu, m) {
  m.def("register_kernels(str kind, str[] names) -> str[]", register_kernels);
  m.def("tracked(str kind) -> (str[], int[])", tracked);
  m.def("clear_tracking() -> ()", clear_tracking);
  m.def("set_keep_going(bool on) -> ()", [](bool on) { g_keep_going.store(on); });
  m.def("set_device_count(int n) -> ()", [](int64_t n) {
    TORCH_CHECK(n >= 1 && n <= 64, "device count must be in 1..64");
    g_device_count.store((int)n);
  });
  m.def("device_count() -> int", []() -> int64_t { return g_device_count.load(); });
  m.def("current_device() -> int", []() -> int64_t { return tl_device; });
  m.def("set_device(int index) -> ()", [](int64_t i) {
    check_index((c10::DeviceIndex)i);
    tl_device = (c10::DeviceIndex)i;
  });
  m.def("host_alias(Tensor t) -> Tensor", [](const at::Tensor& t) { return host_alias(t); });
}
