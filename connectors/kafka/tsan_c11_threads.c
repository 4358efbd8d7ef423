/* C11 <threads.h> functions forwarding to pthreads, linked ONLY into
 * ThreadSanitizer builds of executables that use librdkafka (see
 * connectors/CMakeLists.txt and scripts/tsan.supp).
 *
 * Why: Debian's librdkafka 2.0.2 is built on glibc's C11 threads. glibc's
 * thrd_create, mtx_lock, cnd_wait ... call its internal pthread functions
 * directly, so TSan never sees those threads start or those locks taken,
 * and a process that creates an rd_kafka_t crashes or reports nonsense.
 * Definitions in the executable interpose glibc's for librdkafka.so (the
 * executable comes first in symbol lookup) and call the public pthread
 * functions, which TSan intercepts.
 *
 * Covered: exactly what `nm -D --undefined-only librdkafka.so.1` lists from
 * <threads.h> (thrd_create, thrd_join, thrd_current via pthread_self is left
 * to glibc since it is a pure query, mtx_init/lock/unlock/destroy,
 * cnd_init/signal/broadcast/wait/timedwait/destroy, call_once), plus the
 * few siblings (thrd_detach, mtx_trylock, mtx_timedlock) so that a newer
 * librdkafka using them is covered too.
 *
 * glibc declares mtx_t, cnd_t and once_flag with the size and alignment of
 * pthread_mutex_t, pthread_cond_t and pthread_once_t, so the objects are used
 * as the pthread objects in place (the static asserts check this). */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

_Static_assert(sizeof(mtx_t) >= sizeof(pthread_mutex_t), "mtx_t too small");
_Static_assert(_Alignof(mtx_t) >= _Alignof(pthread_mutex_t), "mtx_t misaligned");
_Static_assert(sizeof(cnd_t) >= sizeof(pthread_cond_t), "cnd_t too small");
_Static_assert(_Alignof(cnd_t) >= _Alignof(pthread_cond_t), "cnd_t misaligned");
_Static_assert(sizeof(once_flag) >= sizeof(pthread_once_t), "once_flag too small");
_Static_assert(sizeof(thrd_t) == sizeof(pthread_t), "thrd_t differs from pthread_t");

static int to_thrd(int pthread_result) {
  switch (pthread_result) {
    case 0: return thrd_success;
    case ENOMEM: return thrd_nomem;
    case EBUSY: return thrd_busy;
    case ETIMEDOUT: return thrd_timedout;
    default: return thrd_error;
  }
}

struct vipsd_thrd_start {
  thrd_start_t func;
  void *arg;
};

static void *vipsd_thrd_trampoline(void *raw) {
  struct vipsd_thrd_start start = *(struct vipsd_thrd_start *)raw;
  free(raw);
  return (void *)(intptr_t)start.func(start.arg);
}

int thrd_create(thrd_t *thr, thrd_start_t func, void *arg) {
  struct vipsd_thrd_start *start = malloc(sizeof(*start));
  if (start == NULL) return thrd_nomem;
  start->func = func;
  start->arg = arg;
  pthread_t thread;
  const int rc = pthread_create(&thread, NULL, vipsd_thrd_trampoline, start);
  if (rc != 0) {
    free(start);
    return to_thrd(rc);
  }
  *thr = (thrd_t)thread;
  return thrd_success;
}

int thrd_join(thrd_t thr, int *res) {
  void *value = NULL;
  const int rc = pthread_join((pthread_t)thr, &value);
  if (rc != 0) return to_thrd(rc);
  if (res != NULL) *res = (int)(intptr_t)value;
  return thrd_success;
}

int thrd_detach(thrd_t thr) { return to_thrd(pthread_detach((pthread_t)thr)); }

int mtx_init(mtx_t *mtx, int type) {
  pthread_mutexattr_t attr;
  if (pthread_mutexattr_init(&attr) != 0) return thrd_error;
  if (type & mtx_recursive) pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  const int rc = pthread_mutex_init((pthread_mutex_t *)mtx, &attr);
  pthread_mutexattr_destroy(&attr);
  return to_thrd(rc);
}

int mtx_lock(mtx_t *mtx) { return to_thrd(pthread_mutex_lock((pthread_mutex_t *)mtx)); }

int mtx_trylock(mtx_t *mtx) { return to_thrd(pthread_mutex_trylock((pthread_mutex_t *)mtx)); }

int mtx_timedlock(mtx_t *restrict mtx, const struct timespec *restrict ts) {
  return to_thrd(pthread_mutex_timedlock((pthread_mutex_t *)mtx, ts));
}

int mtx_unlock(mtx_t *mtx) { return to_thrd(pthread_mutex_unlock((pthread_mutex_t *)mtx)); }

void mtx_destroy(mtx_t *mtx) { pthread_mutex_destroy((pthread_mutex_t *)mtx); }

int cnd_init(cnd_t *cond) { return to_thrd(pthread_cond_init((pthread_cond_t *)cond, NULL)); }

int cnd_signal(cnd_t *cond) { return to_thrd(pthread_cond_signal((pthread_cond_t *)cond)); }

int cnd_broadcast(cnd_t *cond) { return to_thrd(pthread_cond_broadcast((pthread_cond_t *)cond)); }

int cnd_wait(cnd_t *cond, mtx_t *mtx) {
  return to_thrd(pthread_cond_wait((pthread_cond_t *)cond, (pthread_mutex_t *)mtx));
}

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mtx, const struct timespec *restrict ts) {
  return to_thrd(pthread_cond_timedwait((pthread_cond_t *)cond, (pthread_mutex_t *)mtx, ts));
}

void cnd_destroy(cnd_t *cond) { pthread_cond_destroy((pthread_cond_t *)cond); }

void call_once(once_flag *flag, void (*func)(void)) { pthread_once((pthread_once_t *)flag, func); }
