/* An env plugin for NCCL's C env ABI, written for rustccl's loader tests and compiled by them at
 * test time (cc -shared -fPIC). One source, one ABI version per build:
 *
 *   -DENV_VERSION=1 or 2   which ncclEnvPlugin_vN table to export (default 1); v2's init gets
 *                          NCCL's logger and logs one line through it
 *   -DENV_INIT_FAILS       init returns ncclInternalError (the host must keep the environment)
 *
 * Answers, whatever the process environment says:
 *   NCCL_DEBUG -> "INFO"      NCCL_PROTO -> "Simple"
 * Every other name is answered from getenv: a copy the plugin keeps until the next getEnv of
 * the same name (then frees it), as NCCL's rule lets a plugin do, so a host that held on to an
 * older answer would read freed memory. finalize frees the rest and prints
 * "c-env: finalize after N lookups" on stderr; a lookup of NCCL_ENV_PLUGIN (which the host must
 * never ask for) prints "c-env: asked for NCCL_ENV_PLUGIN". The declarations below are this
 * file's own, laid out as NCCL's plugin headers define them. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ENV_VERSION
#define ENV_VERSION 1
#endif

typedef int result_t; /* ncclResult_t */
enum { OK = 0, INTERNAL = 3 };
enum { LOG_INFO = 3 };
#define SUBSYS_ENV 0x80UL

typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

/* The copies handed out, one per name. */
struct kept {
  char* name;
  char* value;
  struct kept* next;
};
static struct kept* kept;
static unsigned long lookups;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static result_t start(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix, logger_t log) {
#ifdef ENV_INIT_FAILS
  (void)major; (void)minor; (void)patch; (void)suffix; (void)log;
  return INTERNAL;
#else
  if (log) log(LOG_INFO, SUBSYS_ENV, __FILE__, __LINE__, "c-env: v2 init for NCCL %d.%d.%d%s", major, minor, patch, suffix ? suffix : "(null)");
  return OK;
#endif
}

static result_t finish(void) {
  pthread_mutex_lock(&lock);
  while (kept) {
    struct kept* k = kept;
    kept = k->next;
    free(k->name);
    free(k->value);
    free(k);
  }
  fprintf(stderr, "c-env: finalize after %lu lookups\n", lookups);
  pthread_mutex_unlock(&lock);
  return OK;
}

static const char* answer(const char* name) {
  if (strcmp(name, "NCCL_DEBUG") == 0) return "INFO";
  if (strcmp(name, "NCCL_PROTO") == 0) return "Simple";
  if (strcmp(name, "NCCL_ENV_PLUGIN") == 0) fprintf(stderr, "c-env: asked for NCCL_ENV_PLUGIN\n");
  const char* v = getenv(name);
  if (v == NULL) return NULL;
  pthread_mutex_lock(&lock);
  lookups++;
  struct kept* k = kept;
  while (k && strcmp(k->name, name) != 0) k = k->next;
  if (k == NULL) {
    k = calloc(1, sizeof *k);
    if (k == NULL || (k->name = strdup(name)) == NULL) {
      free(k);
      pthread_mutex_unlock(&lock);
      return NULL;
    }
    k->next = kept;
    kept = k;
  }
  /* The previous answer for this name is freed now: the host must have copied it. */
  if (k->value) memset(k->value, 'X', strlen(k->value));
  free(k->value);
  k->value = strdup(v);
  const char* out = k->value;
  pthread_mutex_unlock(&lock);
  return out;
}

#if ENV_VERSION == 2
typedef struct {
  const char* name;
  result_t (*init)(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix, logger_t log);
  result_t (*finalize)(void);
  const char* (*getEnv)(const char* name);
} env_v2_t;

const env_v2_t ncclEnvPlugin_v2 = {"c-env", start, finish, answer};
#else
typedef struct {
  const char* name;
  result_t (*init)(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix);
  result_t (*finalize)(void);
  const char* (*getEnv)(const char* name);
} env_v1_t;

static result_t start_v1(uint8_t major, uint8_t minor, uint8_t patch, const char* suffix) {
  return start(major, minor, patch, suffix, NULL);
}

const env_v1_t ncclEnvPlugin_v1 = {"c-env", start_v1, finish, answer};
#endif
