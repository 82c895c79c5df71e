/* A minimal NVTX tool for the tests: records the ranges a process emits, as nsys would see them.
 *
 * NVTX (v3) loads the library named by NVTX_INJECTION64_PATH at a process's first NVTX call and
 * calls its InitializeInjectionNvtx2, which fills NVTX's function table with the tool's entry
 * points. This one implements the domain functions of the CORE2 module (what the `nvtx` Python
 * package calls) and appends one line per call to NVTX_RECORDER_OUTPUT.<pid>:
 *
 *   <thread id> \t push  \t <domain> \t <message>
 *   <thread id> \t pop   \t <domain>
 *   <thread id> \t start \t <range id> \t <message>
 *   <thread id> \t end   \t <range id>
 *   <thread id> \t mark  \t <domain> \t <message>
 *
 * The few NVTX types it needs are declared below, by the layout of NVTX's public headers
 * (nvToolsExt.h, nvtxDetail/nvtxTypes.h), so it builds with a C compiler alone:
 *   cc -shared -fPIC -O1 -o libnvtx_recorder.so nvtx_recorder.c -lpthread
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef void (*FunctionPointer)(void);
typedef FunctionPointer** FunctionTable;

typedef struct {
  size_t struct_size;
  int (*GetModuleFunctionTable)(int module, FunctionTable* out_table, unsigned int* out_size);
} ExportTableCallbacks;

typedef const void* (*GetExportTable)(uint32_t export_table_id);

enum { kExportTableCallbacks = 1, kModuleCore2 = 5 };
enum {
  kDomainMarkEx = 1,
  kDomainRangeStartEx = 2,
  kDomainRangeEnd = 3,
  kDomainRangePushEx = 4,
  kDomainRangePop = 5,
  kDomainRegisterStringA = 10,
  kDomainCreateA = 12,
};
enum { kMessageAscii = 1, kMessageRegistered = 3 };

typedef struct {
  uint16_t version;
  uint16_t size;
  uint32_t category;
  int32_t color_type;
  uint32_t color;
  int32_t payload_type;
  int32_t reserved0;
  uint64_t payload;
  int32_t message_type;
  const void* message; /* ASCII text, or a registered string's handle */
} EventAttributes;

/* Domains and registered strings are handed out as pointers to their own text. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE* out = NULL;
static uint64_t next_range = 1;

static void record(const char* what, const void* domain, const char* text, uint64_t id, int with_id) {
  pthread_mutex_lock(&lock);
  if (out == NULL) {
    const char* base = getenv("NVTX_RECORDER_OUTPUT");
    char path[4096];
    snprintf(path, sizeof(path), "%s.%d", base ? base : "nvtx_record", (int)getpid());
    out = fopen(path, "a");
  }
  if (out != NULL) {
    long tid = (long)syscall(SYS_gettid);
    if (with_id) {
      fprintf(out, "%ld\t%s\t%llu\t%s\n", tid, what, (unsigned long long)id, text ? text : "");
    } else {
      fprintf(out, "%ld\t%s\t%s\t%s\n", tid, what, domain ? (const char*)domain : "", text ? text : "");
    }
    fflush(out);
  }
  pthread_mutex_unlock(&lock);
}

static const char* message_of(const EventAttributes* attributes) {
  if (attributes == NULL) return "";
  if (attributes->message_type == kMessageAscii || attributes->message_type == kMessageRegistered) {
    return (const char*)attributes->message;
  }
  return "?";
}

static void* domain_create(const char* name) { return strdup(name ? name : ""); }

static void* register_string(void* domain, const char* text) {
  (void)domain;
  return strdup(text ? text : "");
}

static int range_push(void* domain, const EventAttributes* attributes) {
  record("push", domain, message_of(attributes), 0, 0);
  return 0;
}

static int range_pop(void* domain) {
  record("pop", domain, NULL, 0, 0);
  return 0;
}

static uint64_t range_start(void* domain, const EventAttributes* attributes) {
  (void)domain;
  pthread_mutex_lock(&lock);
  uint64_t id = next_range++;
  pthread_mutex_unlock(&lock);
  record("start", NULL, message_of(attributes), id, 1);
  return id;
}

static void range_end(void* domain, uint64_t id) {
  (void)domain;
  record("end", NULL, NULL, id, 1);
}

static void mark(void* domain, const EventAttributes* attributes) { record("mark", domain, message_of(attributes), 0, 0); }

int InitializeInjectionNvtx2(GetExportTable get_export_table) {
  const ExportTableCallbacks* callbacks = (const ExportTableCallbacks*)get_export_table(kExportTableCallbacks);
  FunctionTable table = NULL;
  unsigned int size = 0;
  if (callbacks == NULL || !callbacks->GetModuleFunctionTable(kModuleCore2, &table, &size) || table == NULL) {
    return 0;
  }
  if (size <= kDomainCreateA) return 0;
  *table[kDomainMarkEx] = (FunctionPointer)mark;
  *table[kDomainRangeStartEx] = (FunctionPointer)range_start;
  *table[kDomainRangeEnd] = (FunctionPointer)range_end;
  *table[kDomainRangePushEx] = (FunctionPointer)range_push;
  *table[kDomainRangePop] = (FunctionPointer)range_pop;
  *table[kDomainRegisterStringA] = (FunctionPointer)register_string;
  *table[kDomainCreateA] = (FunctionPointer)domain_create;
  return 1;
}
