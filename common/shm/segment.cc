#include "common/shm/segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"

namespace mer::shm {

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
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("shm name '", name, "' may hold only [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

// Where glibc's shm_open keeps the objects (a tmpfs).
constexpr char kShmDir[] = "/dev/shm";
// Attempts at creating a fresh object before giving up on a name that keeps being recreated.
constexpr int kCreateAttempts = 4;

std::string ObjectName(const std::string& name) { return "/" + name; }

absl::Status ErrnoError(int err, const std::string& what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case ENOMEM:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

// The owner and mode a segment must have to be trusted: owned by this user (or root, whom no
// other user can impersonate), a regular file, and closed to other users. A segment that fails
// this was not made by a mer-residency of this user: mapping it would let its owner feed
// compute arbitrary weights, so it is never mapped.
absl::Status CheckOwnership(const std::string& name, const struct stat& st) {
  const uid_t me = geteuid();
  if (!S_ISREG(st.st_mode))
    return absl::PermissionDeniedError(absl::StrCat("shm segment '", name, "' is not a regular file"));
  if (st.st_uid != me && st.st_uid != 0)
    return absl::PermissionDeniedError(
        absl::StrCat("shm segment '", name, "' belongs to uid ", st.st_uid, ", not to this user (uid ", me,
                     ") or root: it is not this user's mer-residency's, refusing to map it"));
  if ((st.st_mode & 0007) != 0)
    return absl::PermissionDeniedError(absl::StrFormat(
        "shm segment '%s' is open to other users (mode 0%o): refusing to map it", name, st.st_mode & 0777));
  return absl::OkStatus();
}

// Names of the segments a residency of `name` may have created because `name` itself belonged to
// another user: "NAME.<16 hex digits>", oldest first is not implied (directory order).
std::vector<std::string> FallbackNames(const std::string& name) {
  std::vector<std::string> out;
  DIR* d = ::opendir(kShmDir);
  if (d == nullptr) return out;
  const std::string prefix = name + ".";
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() == prefix.size() + 16 && n.rfind(prefix, 0) == 0 &&
        n.find_first_not_of("0123456789abcdef", prefix.size()) == std::string::npos)
      out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string FallbackName(const std::string& name) {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("%s.%016x", name, r);
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
  info.gone = info.state == ProcessState::kDetached || ProcessGone(info.pid, p.pid_ns.load(std::memory_order_relaxed));
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
  int fd = -1;
  void* mapping = nullptr;
  size_t mapped = 0;

  ~Impl() {
    if (mapping != nullptr) ::munmap(mapping, mapped);
    if (fd >= 0) ::close(fd);
  }
  // Maps the whole object (its size from fstat). `size` gets the size.
  absl::Status Map(const std::string& name, uint64_t* size) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return ErrnoError(errno, absl::StrCat("shm: stat of '", name, "'"));
    *size = static_cast<uint64_t>(st.st_size);
    if (st.st_size == 0) return absl::OkStatus();
    void* p = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return ErrnoError(errno, absl::StrCat("shm: mapping '", name, "'"));
    mapping = p;
    mapped = static_cast<size_t>(st.st_size);
    return absl::OkStatus();
  }

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread heartbeat;
};

ShmSegment::ShmSegment(std::string name, Role role)
    : name_(std::move(name)), role_(role), impl_(std::make_unique<Impl>()) {}

ShmSegment::~ShmSegment() {
  StopHeartbeat();
  if (base_ != nullptr && incarnation_ != 0) {
    ProcessInfo& me = control().process[static_cast<int>(role_)];
    // Only if nobody has taken the role over since.
    if (me.incarnation.load(std::memory_order_acquire) == incarnation_) {
      me.state.store(static_cast<uint32_t>(ProcessState::kDetached), std::memory_order_release);
    }
    if (creator_) WakeEverything(base_, header_);
    if (creator_ && unlink_on_close_ && SameObject(name_, impl_->fd)) ::shm_unlink(ObjectName(name_).c_str());
  }
}

absl::Status ShmSegment::Remove(const std::string& name) {
  RETURN_IF_ERROR(ValidateName(name));
  ::shm_unlink(ObjectName(name).c_str());
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

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, const CreateOptions& options) {
  RETURN_IF_ERROR(ValidateName(name));
  ASSIGN_OR_RETURN(SegmentHeader header, BuildHeader(options.geometry));
  header.created_unix_ns = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));

  // Segments left under this name, or under a fallback of it, by an earlier residency of this
  // user: supersede and unlink them (refused while their residency lives). One of another user
  // is never touched: this residency serves under a fallback name instead (FallbackNames).
  std::string chosen = name;
  for (const std::string& n : FallbackNames(name)) RETURN_IF_ERROR(ReclaimStale(n, options).status());
  std::unique_ptr<ShmSegment> seg;
  for (int attempt = 0;; ++attempt) {
    const int fd = ::shm_open(ObjectName(chosen).c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      seg.reset(new ShmSegment(chosen, Role::kResidency));
      seg->impl_->fd = fd;
      break;
    }
    if (errno != EEXIST || attempt + 1 == kCreateAttempts)
      return ErrnoError(errno, absl::StrCat("shm: creating '", chosen, "' in ", kShmDir));
    ASSIGN_OR_RETURN(const bool reclaimed, ReclaimStale(chosen, options));
    if (!reclaimed) chosen = FallbackName(name);  // another user's: leave it be
  }
  seg->creator_ = true;
  seg->unlink_on_close_ = options.unlink_on_close;
  // From here on, failures remove the half-made object again.
  auto fail = [&](absl::Status s) {
    seg->creator_ = false;
    ::shm_unlink(ObjectName(chosen).c_str());
    return s;
  };
  const int fd = seg->impl_->fd;
  // The mode asked for, whatever the umask; owner-only unless the options say otherwise.
  if (::fchmod(fd, options.permissions & 0770) != 0)
    return fail(ErrnoError(errno, absl::StrCat("shm: setting the mode of '", chosen, "'")));
  if (::ftruncate(fd, static_cast<off_t>(header.segment_bytes)) != 0)
    return fail(ErrnoError(errno, absl::StrCat("shm: sizing '", chosen, "' to ", header.segment_bytes)));
  if (options.reserve_memory) {
    const int err = posix_fallocate(fd, 0, static_cast<off_t>(header.segment_bytes));
    if (err != 0) {
      return fail(absl::ResourceExhaustedError(absl::StrCat("shm: reserving ", header.segment_bytes, " bytes for '",
                                                            chosen, "' in /dev/shm: ", std::strerror(err))));
    }
  }
  uint64_t size = 0;
  if (absl::Status s = seg->impl_->Map(chosen, &size); !s.ok()) return fail(s);
  uint8_t* base = static_cast<uint8_t*>(seg->impl_->mapping);
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

absl::Status ShmSegment::Probe(const std::string& name, const ExpectedIdentity& expected,
                               absl::Duration liveness_timeout) {
  RETURN_IF_ERROR(ValidateName(name));
  AttachOptions o;
  o.liveness_timeout = liveness_timeout;
  const absl::Status first = AttachOne(name, name, expected, o, Mode::kProbe).status();
  if (first.ok()) return first;
  for (const std::string& n : FallbackNames(name)) {
    if (AttachOne(name, n, expected, o, Mode::kProbe).ok()) return absl::OkStatus();
  }
  return first;
}

absl::StatusOr<bool> ShmSegment::ReclaimStale(const std::string& name, const CreateOptions& options) {
  const int fd = ::shm_open(ObjectName(name).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return true;   // gone meanwhile: free
    if (errno == EACCES) return false;  // another user's, closed to us
    return ErrnoError(errno, absl::StrCat("shm: opening old '", name, "'"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_uid != geteuid()) {
    ::close(fd);
    return false;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size >= sizeof(SegmentHeader)) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      uint8_t* base = static_cast<uint8_t*>(p);
      absl::Status refuse;
      if (MagicRef(base).load(std::memory_order_acquire) == kMagic) {
        absl::StatusOr<SegmentHeader> h = ValidateHeader(absl::MakeConstSpan(base, size), size, nullptr);
        if (h.ok()) {
          auto* ctl = std::launder(reinterpret_cast<SegmentControl*>(base + h->control_offset));
          const PeerInfo holder = ReadProcess(ctl->process[static_cast<int>(Role::kResidency)], Role::kResidency);
          if (holder.AliveWithin(options.liveness_timeout) && !options.take_over_live &&
              holder.pid != static_cast<uint32_t>(getpid())) {
            refuse = absl::FailedPreconditionError(absl::StrCat("shm segment '", name,
                                                                "' is held by a live mer-residency (pid ", holder.pid,
                                                                ", incarnation ", holder.incarnation, ")"));
          } else {
            ctl->superseded.store(1, std::memory_order_release);
            WakeEverything(base, *h);
          }
        }
      }
      ::munmap(p, size);
      if (!refuse.ok()) {
        ::close(fd);
        return refuse;
      }
    }
  }
  // Unlink only if the name still refers to the object inspected.
  if (SameObject(name, fd)) ::shm_unlink(ObjectName(name).c_str());
  ::close(fd);
  return true;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Attach(const std::string& name,
                                                               const ExpectedIdentity& expected,
                                                               const AttachOptions& options) {
  RETURN_IF_ERROR(ValidateName(name));
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = AttachOne(name, name, expected, options, Mode::kAttach);
  if (seg.ok() || (!absl::IsPermissionDenied(seg.status()) && !absl::IsNotFound(seg.status()))) return seg;
  // The name is another user's (or absent): a residency of this user may serve under a fallback
  // of it. Only one whose residency lives will do; otherwise the first error stands.
  const absl::Status first = seg.status();
  for (const std::string& n : FallbackNames(name)) {
    absl::StatusOr<std::unique_ptr<ShmSegment>> other = AttachOne(name, n, expected, options, Mode::kAttachLive);
    if (other.ok()) return other;
  }
  if (absl::IsPermissionDenied(first))  // retried: this user's residency may not be up yet
    return absl::UnavailableError(
        absl::StrCat(first.message(), "; no segment of this user under '", name, ".*' either"));
  return first;
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::AttachOne(const std::string& instance, const std::string& name,
                                                                  const ExpectedIdentity& expected,
                                                                  const AttachOptions& options, Mode mode) {
  std::unique_ptr<ShmSegment> seg(new ShmSegment(name, options.role));
  seg->impl_->fd = ::shm_open(ObjectName(name).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (seg->impl_->fd < 0) {
    const int err = errno;
    if (err == ENOENT)
      return absl::NotFoundError(absl::StrCat("shm: no segment named '", instance, "' (is mer-residency running?)"));
    if (err == EACCES)
      return absl::PermissionDeniedError(
          absl::StrCat("shm segment '", name, "' is not readable by this user: it is not this user's mer-residency's"));
    return ErrnoError(err, absl::StrCat("shm: opening '", name, "'"));
  }
  struct stat st;
  if (::fstat(seg->impl_->fd, &st) != 0) return ErrnoError(errno, absl::StrCat("shm: stat of '", name, "'"));
  RETURN_IF_ERROR(CheckOwnership(name, st));
  if (static_cast<uint64_t>(st.st_size) < sizeof(SegmentHeader)) {
    return absl::UnavailableError(
        absl::StrCat("shm: segment '", name, "' is ", st.st_size, " bytes, still being created"));
  }
  uint64_t size = 0;
  RETURN_IF_ERROR(seg->impl_->Map(name, &size));
  uint8_t* base = static_cast<uint8_t*>(seg->impl_->mapping);
  const uint64_t mapped = seg->impl_->mapped;
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
  if (mode != Mode::kAttach) {
    // Peer() of a compute-role segment is the residency.
    const absl::Status live = seg->CheckPeer(seg->Peer().incarnation, options.liveness_timeout);
    if (!live.ok() || mode == Mode::kProbe) {
      seg->base_ = nullptr;
      if (!live.ok()) return live;
      return seg;
    }
  }
  const Role role = options.role;
  const PeerInfo holder = ReadProcess(seg->control().process[static_cast<int>(role)], role);
  // The holder may be this very process re-attaching (its old ShmSegment still open).
  if (holder.AliveWithin(options.liveness_timeout) && !options.take_over_live &&
      holder.pid != static_cast<uint32_t>(getpid())) {
    seg->base_ = nullptr;
    return absl::FailedPreconditionError(absl::StrCat("shm segment '", name, "': the ", RoleName(role),
                                                      " role is held by a live process (pid ", holder.pid,
                                                      ", incarnation ", holder.incarnation, ")"));
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
  return ResidencyTable(std::launder(reinterpret_cast<ResidencyEntry*>(base_ + header_.table_offset)), header_.n_layer,
                        header_.n_expert);
}

SlotPins ShmSegment::pins(Pool pool) const {
  if (pool == Pool::kRam) {
    return SlotPins(std::launder(reinterpret_cast<SlotPin*>(base_ + header_.ram_pins_offset)), header_.ram_slot_count);
  }
  return SlotPins(std::launder(reinterpret_cast<SlotPin*>(base_ + header_.vram_pins_offset)), header_.vram_slot_count);
}

absl::Span<uint8_t> ShmSegment::ram_slot(uint32_t k) const {
  if (k >= header_.ram_slot_count) return {};
  return absl::MakeSpan(base_ + header_.ram_pool_offset + uint64_t{k} * header_.ram_slot_bytes, header_.ram_slot_bytes);
}

void ShmSegment::Beat() {
  control().process[static_cast<int>(role_)].heartbeat_ns.store(MonotonicNanos(), std::memory_order_release);
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

bool ShmSegment::superseded() const { return control().superseded.load(std::memory_order_acquire) != 0; }

absl::Status ShmSegment::CheckPeer(uint64_t expected_incarnation, absl::Duration timeout) const {
  if (superseded()) {
    return absl::UnavailableError(
        absl::StrCat("shm segment '", name_, "' was superseded by a newer mer-residency; re-attach"));
  }
  const PeerInfo p = Peer();
  const char* who = RoleName(p.role);
  if (p.incarnation != expected_incarnation) {
    return absl::UnavailableError(
        absl::StrCat("mer-", who, " restarted: incarnation ", expected_incarnation, " -> ", p.incarnation));
  }
  if (p.state != ProcessState::kAttached) {
    return absl::UnavailableError(
        absl::StrCat("mer-", who, " is not attached (state ", static_cast<uint32_t>(p.state), ")"));
  }
  if (p.gone) {
    return absl::UnavailableError(absl::StrCat("mer-", who, " (pid ", p.pid, ") is gone"));
  }
  if (p.heartbeat_age > timeout) {
    return absl::UnavailableError(absl::StrCat("mer-", who, " (pid ", p.pid, ") heartbeat stopped: last beat ",
                                               absl::FormatDuration(p.heartbeat_age), " ago"));
  }
  return absl::OkStatus();
}

}  // namespace mer::shm
