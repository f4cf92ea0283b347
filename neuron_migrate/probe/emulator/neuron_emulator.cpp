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
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
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
// As TorchNeuron's c10_neuron: once the neuron process group has started, this process owns one device, whose
// PyTorch index is its local rank (device_count() is the local world size); -1 before that.
std::atomic<int> g_local_device{-1};
// The thread's own current device (set_device); -1: the process default (its local device, else 0).
thread_local int tl_override = -1;

struct CurrentDevice {  // reads and writes as a c10::DeviceIndex, resolving the process default on read
  operator c10::DeviceIndex() const {
    if (tl_override >= 0) return (c10::DeviceIndex)tl_override;
    int local = g_local_device.load();
    return (c10::DeviceIndex)(local >= 0 ? local : 0);
  }
  CurrentDevice& operator=(int d) {
    tl_override = d;
    return *this;
  }
};
thread_local CurrentDevice tl_device;
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

void check_range(c10::DeviceIndex i) {
  TORCH_CHECK(i >= 0 && i < g_device_count.load(), "neuron (emulated): invalid device index ", int(i),
              "; the emulated device has ", g_device_count.load(), " device(s)");
}

void check_index(c10::DeviceIndex i) {
  check_range(i);
  int local = g_local_device.load();
  TORCH_CHECK(local < 0 || i == local, "neuron (emulated): device neuron:", int(i), " does not attach to this process: ",
              "in a distributed run each process owns one NeuronCore, neuron:", local, " (its local rank), as on TorchNeuron");
}

// ------------------------------------------------------------------------------------------ memory

// Device memory is host memory. The allocator keeps the statistics an accelerator's allocator keeps
// (torch.accelerator.memory_allocated / max_memory_allocated / memory_stats / reset_peak_memory_stats).
constexpr int kMaxDevices = 64;

struct MemStats {
  std::mutex mu;
  std::unordered_map<void*, std::pair<size_t, c10::DeviceIndex>> live;
  c10::CachingDeviceAllocator::DeviceStats stats[kMaxDevices];
  void add(void* p, size_t n, c10::DeviceIndex d) {
    std::lock_guard<std::mutex> g(mu);
    live[p] = {n, d};
    auto& s = stats[d];
    for (auto* a : {&s.allocation, &s.segment, &s.active}) (*a)[0].increase(1);
    for (auto* a : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) (*a)[0].increase(n);
    ++s.num_device_alloc;
  }
  void remove(void* p) {
    std::lock_guard<std::mutex> g(mu);
    auto it = live.find(p);
    if (it == live.end()) return;
    size_t n = it->second.first;
    auto& s = stats[it->second.second];
    live.erase(it);
    for (auto* a : {&s.allocation, &s.segment, &s.active}) (*a)[0].decrease(1);
    for (auto* a : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) (*a)[0].decrease(n);
    ++s.num_device_free;
  }
};
MemStats g_mem;

void emu_delete(void* p) {
  g_mem.remove(p);
  c10::free_cpu(p);
}

struct EmuAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (p) g_mem.add(p, nbytes, tl_device);
    return {p, p, &emu_delete, c10::Device(kEmu, tl_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &emu_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}  // nothing is cached: freed memory goes back at once
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    check_index(d);
    std::lock_guard<std::mutex> g(g_mem.mu);
    return g_mem.stats[d];
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override {
    check_index(d);
    std::lock_guard<std::mutex> g(g_mem.mu);
    auto& s = g_mem.stats[d];
    for (auto* a : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                    &s.requested_bytes})
      (*a)[0].reset_accumulated();
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  }
  void resetPeakStats(c10::DeviceIndex d) override {
    check_index(d);
    std::lock_guard<std::mutex> g(g_mem.mu);
    auto& s = g_mem.stats[d];
    for (auto* a : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                    &s.requested_bytes})
      (*a)[0].reset_peak();
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {  // (free, total): the host's
    check_index(d);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return {(size_t)sysconf(_SC_AVPHYS_PAGES) * page, (size_t)sysconf(_SC_PHYS_PAGES) * page};
  }
};

EmuAllocator g_alloc;

// Pinned host memory (tensor.pin_memory(), DataLoader(pin_memory=True)): ordinary host memory whose ranges are
// remembered, so is_pinned() answers as on an accelerator.
std::mutex g_pin_mu;
std::map<uintptr_t, size_t> g_pinned;

void pinned_delete(void* p) {
  {
    std::lock_guard<std::mutex> g(g_pin_mu);
    g_pinned.erase((uintptr_t)p);
  }
  c10::free_cpu(p);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = c10::alloc_cpu(nbytes ? nbytes : 1);
    {
      std::lock_guard<std::mutex> g(g_pin_mu);
      g_pinned[(uintptr_t)p] = nbytes ? nbytes : 1;
    }
    return {p, p, &pinned_delete, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &pinned_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
PinnedAllocator g_pinned_alloc;

bool is_pinned_ptr(const void* data) {
  std::lock_guard<std::mutex> g(g_pin_mu);
  auto it = g_pinned.upper_bound((uintptr_t)data);
  if (it == g_pinned.begin()) return false;
  --it;
  return (uintptr_t)data < it->first + it->second;
}

// Generators: torch.Generator("neuron") is a device generator (its device is neuron:N) whose state is a host
// generator; the host kernels draw from that host generator. A CPU generator given to a device op raises, as on
// CUDA.
struct NeuronGenerator final : c10::GeneratorImpl {
  at::Generator host;
  NeuronGenerator(c10::DeviceIndex idx, at::Generator h)
      : c10::GeneratorImpl(c10::Device(kEmu, idx), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host(std::move(h)) {}
  void set_current_seed(uint64_t seed) override { host.set_current_seed(seed); }
  void set_offset(uint64_t offset) override { host.set_offset(offset); }
  uint64_t get_offset() const override { return host.get_offset(); }
  uint64_t current_seed() const override { return host.current_seed(); }
  uint64_t seed() override { return host.seed(); }
  void set_state(const c10::TensorImpl& state) override { host.unsafeGetGeneratorImpl()->set_state(state); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return host.unsafeGetGeneratorImpl()->get_state();
  }
  NeuronGenerator* clone_impl() const override { return new NeuronGenerator(device_.index(), host.clone()); }
};

// Each device has its default generator, as each CUDA device has (torch.manual_seed seeds it through
// torch.neuron.manual_seed_all); random ops without a generator draw from it, not from the host's. The vector is
// sized once, so the references getDefaultGenerator hands out stay valid.
std::mutex g_gen_mu;
std::recursive_mutex g_swap_mu;  // one swap at a time (a random op's host kernel may call another)
std::vector<at::Generator> g_default_gens;

const at::Generator& device_default_generator(c10::DeviceIndex idx) {
  if (idx < 0) idx = tl_device;
  check_range(idx);  // torch.manual_seed seeds every device's generator (manual_seed_all), in every process
  std::lock_guard<std::mutex> g(g_gen_mu);
  if (g_default_gens.empty()) g_default_gens.resize(64);
  at::Generator& gen = g_default_gens[idx];
  if (!gen.defined()) gen = at::make_generator<NeuronGenerator>(idx, at::detail::createCPUGenerator());
  return gen;
}

REGISTER_ALLOCATOR(kEmu, &g_alloc);

struct DeviceScope {  // the allocator reads the thread's current device
  int saved;
  explicit DeviceScope(std::optional<c10::Device> d) : saved(tl_override) {
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
  // Streams and events are no-ops (the host computes synchronously); a stream without an index is on the current
  // device, as on CUDA, and timed events measure host time.
  static c10::Device indexed(c10::Device d) { return d.has_index() ? d : c10::Device(kEmu, tl_device); }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, indexed(d)); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, indexed(d)); }
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, indexed(d)); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, indexed(d));
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return g_device_count.load(); }
  struct EmuEvent {
    std::chrono::steady_clock::time_point at;
  };
  void destroyEvent(void* e, const c10::DeviceIndex) const noexcept override { delete static_cast<EmuEvent*>(e); }
  void record(void** e, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*e == nullptr) *e = new EmuEvent();
    static_cast<EmuEvent*>(*e)->at = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    TORCH_CHECK(a && b, "Both events must be recorded before calculating elapsed time.");
    return std::chrono::duration<double, std::milli>(static_cast<EmuEvent*>(b)->at - static_cast<EmuEvent*>(a)->at)
        .count();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmuGuard);

struct EmuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override { return device_default_generator(d); }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    if (d < 0) d = tl_device;
    check_index(d);
    return at::make_generator<NeuronGenerator>(d, at::detail::createCPUGenerator());
  }
  c10::DeviceIndex deviceCount() const override { return g_device_count.load(); }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    check_index(d);
    tl_device = d;
  }
  c10::DeviceIndex getCurrentDevice() const override { return tl_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    c10::DeviceIndex old = tl_device;
    setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kEmu, tl_device); }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_alloc; }
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

// Tensor.record_stream (FSDP and caching-allocator-aware code call it): the device computes synchronously and
// frees memory at once, so there is nothing to defer, as for any stream of this device.
void emu_record_stream(at::Tensor& self, c10::Stream s) {
  TORCH_CHECK(s.device_type() == kEmu, "record_stream: expected a neuron stream, got one on ", s.device());
}

at::Tensor& emu_set_empty_(at::Tensor& self) {
  DeviceScope scope(self.device());
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, &g_alloc, true);
  return emu_set_storage_offset_(self, std::move(st), 0, {0}, {});
}

// ------------------------------------------------------------------------------------------ boxed kernels

// What the device does with host tensors, as PyTorch's accelerators do (CUDA's rules): a CPU tensor with 0 dims
// (a scalar, `1 - x`, `x * torch.tensor(2.)`) may meet device tensors, and the result is on the device; any
// other CPU tensor in a device op raises "Expected all tensors to be on the same device". Exempt, as on CUDA:
// index lists (`x[cpu_idx]`, Tensor?[] arguments), a PackedSequence's batch sizes and the lengths of
// pack_padded_sequence / ctc_loss, which live on the host. A CPU generator given to a device op raises; a neuron
// generator hands its host generator to the host kernel.
bool exempt_argument(const c10::Argument& a) {
  const std::string& n = a.name();
  if (n == "batch_sizes" || n == "lengths" || n == "input_lengths" || n == "target_lengths") return true;
  const auto& t = a.type();
  if (t->kind() == c10::TypeKind::ListType) {
    return t->expectRef<c10::ListType>().getElementType()->kind() == c10::TypeKind::OptionalType;
  }
  return false;
}

std::string op_label(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

// Checks the arguments, swaps neuron generators for their host generators, and returns the device of the first
// device tensor among the arguments (none: the op has no device tensor).
std::optional<c10::Device> prepare_arguments(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t nargs = args.size();
  const size_t base = stack->size() - nargs;
  std::optional<c10::Device> dev;
  auto note = [&](const at::Tensor& t) {
    if (!dev && t.defined() && t.device().type() == kEmu) dev = t.device();
  };
  for (size_t i = 0; i < nargs; ++i) {
    const auto& iv = (*stack)[base + i];
    if (iv.isTensor()) {
      note(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) note(t);
    } else if (iv.isOptionalTensorList()) {
      for (const auto& t : iv.toOptionalTensorList()) {
        std::optional<at::Tensor> o = t;
        if (o.has_value()) note(*o);
      }
    }
  }
  for (size_t i = 0; i < nargs; ++i) {
    auto& iv = (*stack)[base + i];
    if (!iv.isGenerator()) continue;
    at::Generator g = iv.toGenerator();
    if (!g.defined()) continue;
    if (g.device().type() == kEmu) {
      iv = c10::IValue(static_cast<NeuronGenerator*>(g.unsafeGetGeneratorImpl())->host);
    } else if (dev) {
      TORCH_CHECK(false, "Expected a 'neuron' device type for generator but found '", g.device().type(),
                  "' (in ", op_label(op), ")");
    }
  }
  if (!dev || op.schema().name() == "aten::copy_" || op.schema().name() == "aten::_to_copy") return dev;
  auto check = [&](const at::Tensor& t, const c10::Argument& a) {
    if (!t.defined() || t.device().type() != c10::kCPU) return;
    bool written = a.alias_info() != nullptr && a.alias_info()->isWrite();
    if (!written && t.dim() == 0) return;
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", *dev,
                " and cpu! (when checking argument for argument ", a.name(), " in method ", op_label(op), ")");
  };
  for (size_t i = 0; i < nargs; ++i) {
    const auto& iv = (*stack)[base + i];
    if (exempt_argument(args[i])) continue;
    if (iv.isTensor()) {
      check(iv.toTensor(), args[i]);
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) check(t, args[i]);
    }
  }
  return dev;
}

// cpu_fallback puts results on the device of the first tensor argument; when that is a CPU scalar (`1 - x`
// reaches the device as sub(cpu_scalar, x)), the results belong on the device.
void results_to_device(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device dev) {
  const auto& rets = op.schema().returns();
  const size_t nret = rets.size();
  const size_t base = stack->size() - nret;
  for (size_t i = 0; i < nret; ++i) {
    if (rets[i].alias_info() != nullptr) continue;
    auto& iv = (*stack)[base + i];
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      if (t.defined() && t.device().is_cpu()) iv = c10::IValue(t.to(dev));
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> l;
      bool moved = false;
      for (const at::Tensor& t : iv.toTensorList()) {
        moved |= t.defined() && t.device().is_cpu();
        l.push_back(t.defined() && t.device().is_cpu() ? t.to(dev) : t);
      }
      if (moved) iv = l;
    }
  }
}

// The host kernel may lack a dtype the device has (`"histogram_cpu" not implemented for 'Int'`): an op the device
// runs natively is retried with the tensors of that dtype upcast (integers and bool to double, half/bfloat16 to
// float, float to double) and its results cast back; recorded as `aten::op:Int->Double`.
Tracker g_upcast;

std::optional<at::ScalarType> dtype_named(const std::string& name) {
  static const std::pair<const char*, at::ScalarType> names[] = {
      {"Bool", at::kBool},   {"Byte", at::kByte},         {"Char", at::kChar},   {"Short", at::kShort},
      {"Int", at::kInt},     {"Long", at::kLong},         {"Half", at::kHalf},   {"BFloat16", at::kBFloat16},
      {"Float", at::kFloat}, {"Double", at::kDouble},     {"UInt16", at::kUInt16}, {"UInt32", at::kUInt32}};
  for (const auto& kv : names)
    if (name == kv.first) return kv.second;
  return std::nullopt;
}

std::vector<at::ScalarType> upcasts(at::ScalarType from) {
  if (from == at::kHalf || from == at::kBFloat16) return {at::kFloat, at::kDouble};
  if (from == at::kFloat) return {at::kDouble};
  if (from == at::kDouble) return {};
  return {at::kDouble, at::kFloat};  // integers and bool: double holds every int32 exactly
}

// A random op on the device without a generator (dropout, normal_, randperm(device=...)): the host kernel draws
// from the host's default generator, so the device's default generator's state is swapped into it for the call.
// None: not a random op on the device, or one given its generator.
std::optional<c10::Device> random_op_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return std::nullopt;
  const size_t nargs = op.schema().arguments().size();
  std::optional<c10::Device> dev;
  for (size_t i = stack.size() - nargs; i < stack.size(); ++i) {
    const auto& iv = stack[i];
    if (iv.isGenerator() && iv.toGenerator().defined()) return std::nullopt;
    if (!dev && iv.isTensor() && iv.toTensor().defined() && iv.toTensor().device().type() == kEmu) {
      dev = iv.toTensor().device();
    } else if (!dev && iv.isDevice() && iv.toDevice().type() == kEmu) {
      dev = iv.toDevice();
    }
  }
  return dev;
}

struct DeviceGeneratorSwap {
  at::Generator host_default;
  at::Generator device_host;
  at::Tensor saved;
  explicit DeviceGeneratorSwap(c10::Device d)
      : host_default(at::detail::getDefaultCPUGenerator()),
        device_host(static_cast<NeuronGenerator*>(
                        device_default_generator(d.has_index() ? d.index() : tl_device).unsafeGetGeneratorImpl())
                        ->host) {
    saved = host_default.get_state();
    host_default.set_state(device_host.get_state());
  }
  ~DeviceGeneratorSwap() {
    try {
      device_host.set_state(host_default.get_state());
      host_default.set_state(saved);
    } catch (...) {
    }
  }
};

void run_on_host_drawing(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool upcast);

void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool upcast) {
  std::optional<c10::Device> rdev = random_op_device(op, *stack);
  if (!rdev) return run_on_host_drawing(op, stack, upcast);
  std::lock_guard<std::recursive_mutex> g(g_swap_mu);
  DeviceGeneratorSwap swap(*rdev);
  run_on_host_drawing(op, stack, upcast);
}

// Ops that write arguments their schema does not mark as written: native_batch_norm updates its running mean and
// variance in training mode (`Tensor? running_mean`, no `(a!)`). The boxed CPU fallback copies back only the marked
// ones, so these go to the host kernel as host aliases of the device tensors, which it then updates in place.
const std::unordered_map<std::string, std::vector<size_t>>& unmarked_writes() {
  static const std::unordered_map<std::string, std::vector<size_t>> ops = {
      {"aten::native_batch_norm", {3, 4}}, {"aten::native_batch_norm.out", {3, 4}}};
  return ops;
}

void alias_unmarked_writes(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t base) {
  const auto& name = op.operator_name();
  const auto it = unmarked_writes().find(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
  if (it == unmarked_writes().end()) return;
  for (size_t i : it->second) {
    auto& iv = (*stack)[base + i];
    if (iv.isTensor() && iv.toTensor().defined()) iv = c10::IValue(host_alias(iv.toTensor()));
  }
}

// A device tensor that is a conjugate or negative view (the backward of a complex multiply hands `grad *
// other.conj()` to the kernels) reaches the CPU fallback, whose copy to the host (_to_cpu) meets ATen's math-bit
// fallback, which materializes it with clone, which is a device op that runs here again: a recursion until the stack
// overflows. Such read-only arguments go to the host kernel materialized on the host instead (same values).
void resolve_math_bits(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t base) {
  const auto& args = op.schema().arguments();
  auto resolve = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != kEmu || !(t.is_conj() || t.is_neg())) return t;
    at::Tensor h = host_alias(t);  // the bits are dispatch keys of the device tensor: the alias has none
    if (t.is_conj()) h._set_conj(true);
    if (t.is_neg()) h._set_neg(true);
    return h.resolve_conj().resolve_neg();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) continue;
    auto& iv = (*stack)[base + i];
    if (iv.isTensor()) {
      iv = c10::IValue(resolve(iv.toTensor()));
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : iv.toTensorList()) l.push_back(resolve(t));
      iv = l;
    }
  }
}

void run_on_host_drawing(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool upcast) {
  const auto& args = op.schema().arguments();
  const size_t nargs = args.size();
  const size_t base = stack->size() - nargs;
  std::optional<c10::Device> dev = prepare_arguments(op, stack);
  bool any_device_tensor = dev.has_value();
  alias_unmarked_writes(op, stack, base);
  resolve_math_bits(op, stack, base);
  std::vector<c10::IValue> saved;
  if (upcast) saved.assign(stack->begin() + base, stack->end());
  try {
    at::native::cpu_fallback(op, stack);
  } catch (const c10::Error& e) {
    if (!upcast) throw;
    std::string msg = e.what_without_backtrace();
    const std::string marker = "not implemented for '";
    auto pos = msg.find(marker);
    if (pos == std::string::npos) throw;
    auto end = msg.find('\'', pos + marker.size());
    std::optional<at::ScalarType> from = dtype_named(msg.substr(pos + marker.size(), end - pos - marker.size()));
    if (!from) throw;
    for (at::ScalarType to : upcasts(*from)) {
      if (stack->size() > base) stack->resize(base);
      std::vector<std::pair<size_t, at::Tensor>> written;  // argument index, original tensor
      for (size_t i = 0; i < nargs; ++i) {
        c10::IValue iv = saved[i];
        if (iv.isTensor() && iv.toTensor().defined() && iv.toTensor().scalar_type() == *from) {
          if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) written.push_back({i, iv.toTensor()});
          iv = c10::IValue(iv.toTensor().to(to));
        } else if (iv.isTensorList()) {
          c10::List<at::Tensor> l;
          for (const at::Tensor& t : iv.toTensorList()) l.push_back(t.defined() && t.scalar_type() == *from ? t.to(to) : t);
          iv = l;
        }
        stack->push_back(iv);
      }
      try {
        at::native::cpu_fallback(op, stack);
      } catch (const c10::Error& e2) {
        if (std::string(e2.what_without_backtrace()).find(marker) != std::string::npos) continue;
        throw;
      }
      const auto& rets = op.schema().returns();
      const size_t rbase = stack->size() - rets.size();
      for (size_t r = 0; r < rets.size(); ++r) {
        auto& iv = (*stack)[rbase + r];
        if (!iv.isTensor()) continue;
        at::Tensor t = iv.toTensor();
        if (!t.defined() || t.scalar_type() != to) continue;
        bool done = false;
        for (auto& w : written) {  // an in-place/out result: write back into the caller's tensor
          if (rets[r].alias_info() != nullptr && args[w.first].alias_info() != nullptr &&
              rets[r].alias_info()->beforeSets() == args[w.first].alias_info()->beforeSets()) {
            w.second.copy_(t);
            iv = c10::IValue(w.second);
            done = true;
            break;
          }
        }
        if (!done) iv = c10::IValue(t.to(*from));
      }
      g_upcast.add_name(op_label(op) + ":" + c10::toString(*from) + "->" + c10::toString(to));
      if (any_device_tensor) results_to_device(op, stack, *dev);
      return;
    }
    throw;
  }
  if (any_device_tensor) results_to_device(op, stack, *dev);
}

void fallback_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  g_fallback.add(op);
  run_on_host(op, stack, false);
}

void native_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  g_executed.add(op);
  run_on_host(op, stack, true);
}

void unsupported_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  g_unsupported.add(op);
  if (g_keep_going.load()) {
    run_on_host(op, stack, false);
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
  // all_gather_into_tensor: like NCCL, any output holding world_size times the input's elements (SyncBatchNorm
  // gathers C values into a (1, world_size * C) tensor); gloo splits the output along dim 0, so both go flat
  const bool flat = op.operator_name().name == "c10d::_allgather_base_";
  std::unordered_map<c10::TensorImpl*, at::Tensor> back;
  auto swap = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != kEmu) return t;
    at::Tensor h = host_alias(t);
    if (flat && h.is_contiguous()) h = h.view({-1});
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
  if (kind == "upcast") return g_upcast.dump();
  TORCH_CHECK(false, "unknown tracker ", kind);
}

void clear_tracking() {
  g_fallback.clear();
  g_executed.clear();
  g_unsupported.clear();
  g_upcast.clear();
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
  m.impl("record_stream", emu_record_stream);
  // As TorchNeuron (NeuronNativeFunctions.cpp): a CPU and a neuron tensor may swap their contents through
  // `.data =`, so Module.to("neuron") keeps each Parameter object and an optimizer built before it keeps training
  // the model (torch's default for a PrivateUse1 backend makes new Parameters, which such an optimizer never sees).
  m.impl("_has_compatible_shallow_copy_type", [](const at::Tensor& self, const at::Tensor& from) -> bool {
    auto a = self.device().type(), b = from.device().type();
    return a == b || (a == c10::DeviceType::CPU && b == kEmu) || (a == kEmu && b == c10::DeviceType::CPU);
  });
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
  m.def("set_local_device(int index, int local_world_size) -> ()", [](int64_t i, int64_t n) {
    TORCH_CHECK(n >= 1 && n <= 64 && i >= 0 && i < n, "local device ", i, " of ", n, " out of range");
    g_device_count.store((int)n);
    g_local_device.store((int)i);
    tl_device = (int)i;
  });
  m.def("local_device() -> int", []() -> int64_t { return g_local_device.load(); });
  m.def("current_device() -> int", []() -> int64_t { return tl_device; });
  m.def("set_device(int index) -> ()", [](int64_t i) {
    check_index((c10::DeviceIndex)i);
    tl_device = (c10::DeviceIndex)i;
  });
  m.def("default_generator(int index) -> Generator?",
        [](int64_t i) -> std::optional<at::Generator> { return device_default_generator((c10::DeviceIndex)i); });
  m.def("host_alias(Tensor t) -> Tensor", [](const at::Tensor& t) { return host_alias(t); });
  m.def("is_pinned_ptr(int address) -> bool", [](int64_t a) { return is_pinned_ptr((const void*)(uintptr_t)a); });
}
