// Lock rules in the types: Clang's thread-safety analysis
// (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), as leveldb's
// port/thread_annotations.h and Abseil's base/thread_annotations.h use it.
//
// A member guarded by a mutex is declared `T member_ GUARDED_BY(mutex_);`, a
// function that must be called with the mutex held `REQUIRES(mutex_)`, one
// that takes it itself `EXCLUDES(mutex_)`. Clang checks these at compile time
// (-Wthread-safety; the clang trees build with -Werror=thread-safety); under
// GCC the macros expand to nothing.
//
// libstdc++'s std::mutex carries no annotations, so guarded state uses
// vipsd::Mutex, a std::mutex declared as a capability, and vipsd::MutexLock,
// its scoped lock. A condition variable waits through MutexLock::Wait /
// WaitFor, which the analysis sees as holding the mutex throughout (the
// condition variable releases and re-takes it inside). Predicates are
// written as loops around Wait, not as lambdas: the analysis cannot see that
// a lambda runs with the mutex held.
//
// SharedMutex (std::shared_mutex) has a shared side: ReaderMutexLock takes
// it shared, WriterMutexLock alone; state read under either and written
// only under the writer's is GUARDED_BY it.
//
// Thread-safety: Mutex and MutexLock are what they wrap: a Mutex may be used
// from any thread; a MutexLock belongs to the thread that made it. The same
// for SharedMutex and its locks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define VIPSD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define VIPSD_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) VIPSD_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY VIPSD_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) VIPSD_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) VIPSD_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) VIPSD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) VIPSD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) VIPSD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) VIPSD_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) VIPSD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) VIPSD_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) VIPSD_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) VIPSD_THREAD_ANNOTATION(assert_capability(x))
#define NO_THREAD_SAFETY_ANALYSIS VIPSD_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace vipsd {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mutex_.lock(); }
  void Unlock() RELEASE() { mutex_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mutex) ACQUIRE(mutex) : lock_(mutex->mutex_) {}
  ~MutexLock() RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Gives the mutex up for a while (to call out without holding it) and
  // takes it back.
  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

  // Waits for a notification on `wake` (spurious wake-ups included: callers
  // loop on their condition).
  void Wait(std::condition_variable& wake) { wake.wait(lock_); }
  // As Wait, for at most `timeout`; false when the time ran out.
  template <typename Rep, typename Period>
  bool WaitFor(std::condition_variable& wake, std::chrono::duration<Rep, Period> timeout) {
    return wake.wait_for(lock_, timeout) == std::cv_status::no_timeout;
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// A reader-writer mutex as a capability: readers share it
// (ReaderMutexLock), a writer holds it alone (WriterMutexLock).
class CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mutex_.lock(); }
  void Unlock() RELEASE() { mutex_.unlock(); }
  void LockShared() ACQUIRE_SHARED() { mutex_.lock_shared(); }
  void UnlockShared() RELEASE_GENERIC() { mutex_.unlock_shared(); }

 private:
  std::shared_mutex mutex_;
};

class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mutex) ACQUIRE_SHARED(mutex) : mutex_(mutex) {
    mutex_->LockShared();
  }
  ~ReaderMutexLock() RELEASE_GENERIC() { mutex_->UnlockShared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* mutex_;
};

class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_->Lock(); }
  ~WriterMutexLock() RELEASE() { mutex_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* mutex_;
};

}  // namespace vipsd
