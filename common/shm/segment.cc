#include "common/shm/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer::shm {
namespace bip = boost::interprocess;

namespace {

uint64_t OwnPidNamespace() {
  static const uint64_t ns = [] {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  }();
  return ns;
}

bool ProcessGone(uint32_t pid, uint64_t pid_ns) {
  if (pid == 0 || pid_ns == 0 || pid_ns != OwnPidNamespace()) return false;  // cannot tell
  return kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH;
}

absl::Status ValidateName(const std::string& name) {
  if (name.empty() || name.size() > 200) {
    return absl::InvalidArgumentError(absl::StrCat("shm name '", name, "' must be 1..200 characters"));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("shm name '", name, "' may hold only [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status FromBoost(const bip::interprocess_exception& e, const std::string& what) {
  const int err = e.get_native_error();
  const std::string msg = absl::StrCat(what, ": ", e.what());
  switch (err) {
    case ENOENT: return absl::NotFoundError(msg);
    case EEXIST: return absl::AlreadyExistsError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case ENOMEM: return absl::ResourceExhaustedError(msg);
    default: return absl::UnavailableError(msg);
  }
}

std::atomic_ref<uint64_t> MagicRef(uint8_t* base) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base));
}

PeerInfo ReadProcess(const ProcessInfo& p, Role role) {
  PeerInfo info;
  info.role = role;
  info.state = static_cast<ProcessState>(p.state.load(std::memory_order_acquire));
  info.incarnation = p.incarnation.load(std::memory_order_acquire);
  info.pid = p.pid.load(std::memory_order_relaxed);
  const uint64_t beat = p.heartbeat_ns.load(std::memory_order_acquire);
  const uint64_t now = MonotonicNanos();
  if (beat != 0) {
    info.heartbeat_age = now > beat ? absl::Nanoseconds(now - beat) : absl::ZeroDuration();
  }
  info.gone = info.state == ProcessState::kDetached ||
              ProcessGone(info.pid, p.pid_ns.load(std::memory_order_relaxed));
  return info;
}

RingControl* RingAt(uint8_t* base, uint64_t offset) {
  return std::launder(reinterpret_cast<RingControl*>(base + offset));
}

void WakeEverything(uint8_t* base, const SegmentHeader& h) {
  for (uint64_t off : {h.demand_ring_offset, h.hint_ring_offset, h.completion_ring_offset}) {
    RingControl* c = RingAt(base, off);
    c->data_futex.fetch_add(1, std::memory_order_release);
    c->space_futex.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&c->data_futex);
    FutexWakeAll(&c->space_futex);
  }
}

// Identity of the object a name refers to now, to tell whether the name is still ours.
bool SameObject(const std::string& name, int fd) {
  struct stat ours, now;
  if (fstat(fd, &ours) != 0) return false;
  const int other = shm_open(("/" + name).c_str(), O_RDONLY, 0);
  if (other < 0) return false;
  const bool same = fstat(other, &now) == 0 && now.st_ino == ours.st_ino && now.st_dev == ours.st_dev;
  close(other);
  return same;
}

}  // namespace

struct ShmSegment::Impl {
  bip::shared_memory_object shm;
  bip::mapped_region region;

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread heartbeat;
};

ShmSegment::ShmSegment(std::string name, Role role)
    : name_(std::move(name)), role_(role), impl_(std::make_unique<Impl>()) {}

ShmSegment::~ShmSegment() {
  StopHeartbeat();
  if (base_ != nullptr) {
    ProcessInfo& me = control().process[static_cast<int>(role_)];
    // Only if nobody has taken the role over since.
    if (me.incarnation.load(std::memory_order_acquire) == incarnation_) {
      me.state.store(static_cast<uint32_t>(ProcessState::kDetached), std::memory_order_release);
    }
    if (creator_) WakeEverything(base_, header_);
    if (creator_ && unlink_on_close_ && SameObject(name_, impl_->shm.get_mapping_handle().handle)) {
      bip::shared_memory_object::remove(name_.c_str());
    }
  }
}

absl::Status ShmSegment::Remove(const std::string& name) {
  RETURN_IF_ERROR(ValidateName(name));
  bip::shared_memory_object::remove(name.c_str());
  return absl::OkStatus();
}

void ShmSegment::Register(Role role) {
  ProcessInfo& me = control().process[static_cast<int>(role)];
  incarnation_ = me.incarnation.fetch_add(1, std::memory_order_acq_rel) + 1;
  const uint64_t now = MonotonicNanos();
  me.pid.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
  me.pid_ns.store(OwnPidNamespace(), std::memory_order_relaxed);
  me.attach_ns.store(now, std::memory_order_relaxed);
  me.heartbeat_ns.store(now, std::memory_order_relaxed);
  if (role == Role::kCompute) {
    // The step epochs are compute's alone; a predecessor's are void now.
    for (auto& e : control().step_epochs) e.store(0, std::memory_order_relaxed);
  }
  me.state.store(static_cast<uint32_t>(ProcessState::kAttached), std::memory_order_release);
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name,
                                                               const CreateOptions& options) {
  RETURN_IF_ERROR(ValidateName(name));
  ASSIGN_OR_RETURN(SegmentHeader header, BuildHeader(options.geometry));
  header.created_unix_ns = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));

  // A segment left under this name: supersede it (if it is of this layout) and unlink it.
  try {
    bip::shared_memory_object old(bip::open_only, name.c_str(), bip::read_write);
    bip::offset_t old_size = 0;
    if (old.get_size(old_size) && old_size >= static_cast<bip::offset_t>(sizeof(SegmentHeader))) {
      bip::mapped_region region(old, bip::read_write);
      uint8_t* base = static_cast<uint8_t*>(region.get_address());
      if (MagicRef(base).load(std::memory_order_acquire) == kMagic) {
        absl::StatusOr<SegmentHeader> h =
            ValidateHeader(absl::MakeConstSpan(base, region.get_size()), region.get_size(), nullptr);
        if (h.ok()) {
          auto* ctl = std::launder(reinterpret_cast<SegmentControl*>(base + h->control_offset));
          const PeerInfo holder = ReadProcess(ctl->process[static_cast<int>(Role::kResidency)],
                                              Role::kResidency);
          if (holder.AliveWithin(options.liveness_timeout) && !options.take_over_live &&
              holder.pid != static_cast<uint32_t>(getpid())) {
            return absl::FailedPreconditionError(absl::StrCat(
                "shm segment '", name, "' is held by a live mer-residency (pid ", holder.pid,
                ", incarnation ", holder.incarnation, ")"));
          }
          ctl->superseded.store(1, std::memory_order_release);
          WakeEverything(base, *h);
        }
      }
    }
  } catch (const bip::interprocess_exception& e) {
    if (e.get_native_error() != ENOENT) return FromBoost(e, absl::StrCat("shm: opening old '", name, "'"));
  }
  bip::shared_memory_object::remove(name.c_str());

  std::unique_ptr<ShmSegment> seg(new ShmSegment(name, Role::kResidency));
  seg->creator_ = true;
  seg->unlink_on_close_ = options.unlink_on_close;
  try {
    seg->impl_->shm = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write,
                                                bip::permissions(options.permissions));
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, absl::StrCat("shm: creating '", name, "'"));
  }
  // From here on, failures remove the half-made object again.
  auto fail = [&](absl::Status s) {
    seg->creator_ = false;
    bip::shared_memory_object::remove(name.c_str());
    return s;
  };
  try {
    seg->impl_->shm.truncate(static_cast<bip::offset_t>(header.segment_bytes));
  } catch (const bip::interprocess_exception& e) {
    return fail(FromBoost(e, absl::StrCat("shm: sizing '", name, "' to ", header.segment_bytes)));
  }
  if (options.reserve_memory) {
    const int err = posix_fallocate(seg->impl_->shm.get_mapping_handle().handle, 0,
                                    static_cast<off_t>(header.segment_bytes));
    if (err != 0) {
      return fail(absl::ResourceExhaustedError(
          absl::StrCat("shm: reserving ", header.segment_bytes, " bytes for '", name,
                       "' in /dev/shm: ", std::strerror(err))));
    }
  }
  try {
    seg->impl_->region = bip::mapped_region(seg->impl_->shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return fail(FromBoost(e, absl::StrCat("shm: mapping '", name, "'")));
  }
  uint8_t* base = static_cast<uint8_t*>(seg->impl_->region.get_address());
  seg->base_ = base;
  seg->header_ = header;

  // The object is fresh and zero-filled; construct every shared object in place (magic still 0,
  // so nobody attaches before this is done).
  SegmentHeader unpublished = header;
  unpublished.magic = 0;
  std::memcpy(base, &unpublished, sizeof(unpublished));
  new (base + header.control_offset) SegmentControl();
  for (uint64_t off : {header.demand_ring_offset, header.hint_ring_offset, header.completion_ring_offset}) {
    new (base + off) RingControl();
  }
  const uint64_t entries = uint64_t{header.n_layer} * header.n_expert;
  for (uint64_t i = 0; i < entries; ++i) {
    auto* e = new (base + header.table_offset + i * sizeof(ResidencyEntry)) ResidencyEntry();
    e->ram_slot.store(kNoSlot, std::memory_order_relaxed);
    e->vram_slot.store(kNoSlot, std::memory_order_relaxed);
  }
  for (uint32_t i = 0; i < header.ram_slot_count; ++i) {
    new (base + header.ram_pins_offset + i * sizeof(SlotPin)) SlotPin();
  }
  for (uint32_t i = 0; i < header.vram_slot_count; ++i) {
    new (base + header.vram_pins_offset + i * sizeof(SlotPin)) SlotPin();
  }
  seg->Register(Role::kResidency);
  MagicRef(base).store(kMagic, std::memory_order_release);  // publish
  return seg;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Attach(const std::string& name,
                                                               const ExpectedIdentity& expected,
                                                               const AttachOptions& options) {
  RETURN_IF_ERROR(ValidateName(name));
  std::unique_ptr<ShmSegment> seg(new ShmSegment(name, options.role));
  bip::offset_t size = 0;
  try {
    seg->impl_->shm = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
    if (!seg->impl_->shm.get_size(size)) {
      return absl::UnavailableError(absl::StrCat("shm: cannot read the size of '", name, "'"));
    }
  } catch (const bip::interprocess_exception& e) {
    absl::Status s = FromBoost(e, absl::StrCat("shm: opening '", name, "'"));
    if (absl::IsNotFound(s)) {
      return absl::NotFoundError(
          absl::StrCat("shm: no segment named '", name, "' (is mer-residency running?)"));
    }
    return s;
  }
  if (size < static_cast<bip::offset_t>(sizeof(SegmentHeader))) {
    return absl::UnavailableError(absl::StrCat("shm: segment '", name, "' is ", size,
                                               " bytes, still being created"));
  }
  try {
    seg->impl_->region = bip::mapped_region(seg->impl_->shm, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return FromBoost(e, absl::StrCat("shm: mapping '", name, "'"));
  }
  uint8_t* base = static_cast<uint8_t*>(seg->impl_->region.get_address());
  const uint64_t mapped = seg->impl_->region.get_size();
  // Acquire: pairs with the creator's release store of the magic, so the copy below sees the
  // header it wrote. ValidateHeader then treats the copy as untrusted bytes.
  if (MagicRef(base).load(std::memory_order_acquire) == 0) {
    return absl::UnavailableError(absl::StrCat("shm: segment '", name, "' is still being created"));
  }
  ASSIGN_OR_RETURN(seg->header_, ValidateHeader(absl::MakeConstSpan(base, mapped), mapped, &expected));
  seg->base_ = base;
  if (seg->superseded()) {
    seg->base_ = nullptr;
    return absl::UnavailableError(
        absl::StrCat("shm: segment '", name, "' was superseded; retry to attach the new one"));
  }
  const Role role = options.role;
  const PeerInfo holder = ReadProcess(seg->control().process[static_cast<int>(role)], role);
  // The holder may be this very process re-attaching (its old ShmSegment still open).
  if (holder.AliveWithin(options.liveness_timeout) && !options.take_over_live &&
      holder.pid != static_cast<uint32_t>(getpid())) {
    seg->base_ = nullptr;
    return absl::FailedPreconditionError(absl::StrCat(
        "shm segment '", name, "': the ", RoleName(role), " role is held by a live process (pid ",
        holder.pid, ", incarnation ", holder.incarnation, ")"));
  }
  seg->Register(role);
  return seg;
}

SegmentControl& ShmSegment::control() const {
  return *std::launder(reinterpret_cast<SegmentControl*>(base_ + header_.control_offset));
}

template <typename T>
static RingRegion<T> RegionAt(uint8_t* base, uint64_t offset, uint32_t capacity) {
  RingRegion<T> r;
  r.control = RingAt(base, offset);
  r.slots = reinterpret_cast<T*>(base + offset + sizeof(RingControl));
  r.capacity = capacity;
  return r;
}

RingRegion<DemandRequest> ShmSegment::demand_ring() const {
  return RegionAt<DemandRequest>(base_, header_.demand_ring_offset, header_.demand_capacity);
}
RingRegion<Hint> ShmSegment::hint_ring() const {
  return RegionAt<Hint>(base_, header_.hint_ring_offset, header_.hint_capacity);
}
RingRegion<Completion> ShmSegment::completion_ring() const {
  return RegionAt<Completion>(base_, header_.completion_ring_offset, header_.completion_capacity);
}

ResidencyTable ShmSegment::table() const {
  return ResidencyTable(std::launder(reinterpret_cast<ResidencyEntry*>(base_ + header_.table_offset)),
                        header_.n_layer, header_.n_expert);
}

SlotPins ShmSegment::pins(Pool pool) const {
  if (pool == Pool::kRam) {
    return SlotPins(std::launder(reinterpret_cast<SlotPin*>(base_ + header_.ram_pins_offset)),
                    header_.ram_slot_count);
  }
  return SlotPins(std::launder(reinterpret_cast<SlotPin*>(base_ + header_.vram_pins_offset)),
                  header_.vram_slot_count);
}

absl::Span<uint8_t> ShmSegment::ram_slot(uint32_t k) const {
  if (k >= header_.ram_slot_count) return {};
  return absl::MakeSpan(base_ + header_.ram_pool_offset + uint64_t{k} * header_.ram_slot_bytes,
                        header_.ram_slot_bytes);
}

void ShmSegment::Beat() {
  control().process[static_cast<int>(role_)].heartbeat_ns.store(MonotonicNanos(),
                                                                std::memory_order_release);
}

void ShmSegment::StartHeartbeat(absl::Duration interval) {
  StopHeartbeat();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = false;
  }
  Beat();
  impl_->heartbeat = std::thread([this, interval] {
    std::unique_lock<std::mutex> lock(impl_->mu);
    while (!impl_->stop) {
      impl_->cv.wait_for(lock, absl::ToChronoNanoseconds(interval), [this] { return impl_->stop; });
      if (!impl_->stop) Beat();
    }
  });
}

void ShmSegment::StopHeartbeat() {
  if (!impl_->heartbeat.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->heartbeat.join();
}

PeerInfo ShmSegment::Peer() const {
  const Role other = role_ == Role::kCompute ? Role::kResidency : Role::kCompute;
  return ReadProcess(control().process[static_cast<int>(other)], other);
}

bool ShmSegment::superseded() const {
  return control().superseded.load(std::memory_order_acquire) != 0;
}

absl::Status ShmSegment::CheckPeer(uint64_t expected_incarnation, absl::Duration timeout) const {
  if (superseded()) {
    return absl::UnavailableError(absl::StrCat(
        "shm segment '", name_, "' was superseded by a newer mer-residency; re-attach"));
  }
  const PeerInfo p = Peer();
  const char* who = RoleName(p.role);
  if (p.incarnation != expected_incarnation) {
    return absl::UnavailableError(absl::StrCat("mer-", who, " restarted: incarnation ",
                                               expected_incarnation, " -> ", p.incarnation));
  }
  if (p.state != ProcessState::kAttached) {
    return absl::UnavailableError(absl::StrCat("mer-", who, " is not attached (state ",
                                               static_cast<uint32_t>(p.state), ")"));
  }
  if (p.gone) {
    return absl::UnavailableError(absl::StrCat("mer-", who, " (pid ", p.pid, ") is gone"));
  }
  if (p.heartbeat_age > timeout) {
    return absl::UnavailableError(absl::StrCat("mer-", who, " (pid ", p.pid,
                                               ") heartbeat stopped: last beat ",
                                               absl::FormatDuration(p.heartbeat_age), " ago"));
  }
  return absl::OkStatus();
}

}  // namespace mer::shm
