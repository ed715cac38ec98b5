/* The application device allocator of cad_host_options_v1_t (device_allocate / device_free), from strict
 * C99: a fake allocator (malloc'd blocks, counted) serves the CUDA allocations of the host's services
 * table, so it runs on a machine without a GPU. Checks the arguments both ways, the leak freed at
 * cad_host_destroy, the misaligned block and the OUT_OF_MEMORY refused, and one callback alone refused
 * at create. Prints "N passed, M failed". argv[1]: path of cad_reference.so. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"
#include "cad/cad_host.h"

/* ---- The fake allocator ------------------------------------------------------------------------ */
enum { MAX_LIVE = 16 };
enum { MODE_GOOD, MODE_MISALIGNED, MODE_OUT_OF_MEMORY, MODE_OK_WITHOUT_MEMORY };

typedef struct fake_allocator {
  int mode;
  int allocs, frees, live;
  int32_t alloc_device, free_device;
  size_t alloc_bytes, free_bytes, freed_total;
  void *alloc_stream, *free_stream, *alloc_user, *free_user;
  void *returned, *freed;
  void* raw[MAX_LIVE];  /* what malloc gave */
  void* given[MAX_LIVE]; /* what the host got (inside raw) */
} fake_allocator_t;

static cad_status_t fake_allocate(void* user, int32_t device_id, size_t bytes, void* stream, void** out) {
  fake_allocator_t* fake = (fake_allocator_t*)user;
  unsigned char* raw;
  uintptr_t aligned;
  int slot;
  fake->allocs++;
  fake->alloc_user = user;
  fake->alloc_device = device_id;
  fake->alloc_bytes = bytes;
  fake->alloc_stream = stream;
  if (fake->mode == MODE_OUT_OF_MEMORY) return CAD_STATUS_OUT_OF_MEMORY;
  if (fake->mode == MODE_OK_WITHOUT_MEMORY) {
    *out = NULL;
    return CAD_STATUS_OK;
  }
  for (slot = 0; slot < MAX_LIVE && fake->raw[slot] != NULL; ++slot) {
  }
  if (slot == MAX_LIVE || (raw = (unsigned char*)malloc(bytes + 512)) == NULL) return CAD_STATUS_OUT_OF_MEMORY;
  aligned = ((uintptr_t)raw + 255) / 256 * 256;
  if (fake->mode == MODE_MISALIGNED) aligned += 16;
  fake->raw[slot] = raw;
  fake->given[slot] = (void*)aligned;
  fake->live++;
  fake->returned = (void*)aligned;
  *out = (void*)aligned;
  return CAD_STATUS_OK;
}

static void fake_free(void* user, int32_t device_id, void* ptr, size_t bytes, void* stream) {
  fake_allocator_t* fake = (fake_allocator_t*)user;
  int slot;
  fake->frees++;
  fake->free_user = user;
  fake->free_device = device_id;
  fake->free_bytes = bytes;
  fake->freed_total += bytes;
  fake->free_stream = stream;
  fake->freed = ptr;
  for (slot = 0; slot < MAX_LIVE; ++slot) {
    if (fake->given[slot] == ptr && fake->raw[slot] != NULL) {
      free(fake->raw[slot]);
      fake->raw[slot] = NULL;
      fake->given[slot] = NULL;
      fake->live--;
      return;
    }
  }
  printf("FAIL fake_free: %p was not allocated by the fake\n", ptr);
  failed++;
}

/* The host's last warning or error, to check what its messages name. */
static char last_log[2048];
static void capture_log(void* user, cad_log_level_t level, const char* source, const char* message) {
  (void)user;
  (void)source;
  if (level >= CAD_LOG_WARN) snprintf(last_log, sizeof last_log, "%s", message);
}

static int contains_all(const char* text, const char* a, const char* b, const char* c) {
  return strstr(text, a) != NULL && strstr(text, b) != NULL && strstr(text, c) != NULL;
}

int main(int argc, char** argv) {
  char error[1024] = "";
  char config[2048];
  cad_host_t* host = NULL;
  cad_host_options_v1_t options;
  const cad_host_services_v1_t* services;
  fake_allocator_t fake;
  cad_device_v1_t gpu1, gpu0, cpu;
  void* stream = (void*)(uintptr_t)0x5150;
  void *ptr = NULL, *leak_a = NULL, *leak_b = NULL, *cpu_ptr = NULL;
  cad_status_t status;

  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH/cad_reference.so\n", argv[0]);
    return 2;
  }
  snprintf(config, sizeof config,
           "{\"instances\": [{\"name\": \"att\", \"plugin\": \"%s\", \"config\": {\"num_threads\": 1}}],"
           " \"attention\": \"att\", \"log_level\": \"warn\"}",
           argv[1]);
  memset(&fake, 0, sizeof fake);
  gpu1.device_type = CAD_DEVICE_CUDA;
  gpu1.device_id = 1;
  gpu0.device_type = CAD_DEVICE_CUDA;
  gpu0.device_id = 0;
  cpu.device_type = CAD_DEVICE_CPU;
  cpu.device_id = 0;

  /* 1. One callback alone is refused, naming both fields. */
  memset(&options, 0, sizeof options);
  options.struct_size = sizeof options;
  options.config_json = config;
  options.device_allocate = &fake_allocate;
  options.allocator_user = &fake;
  status = cad_host_create(&options, &host, error, sizeof error);
  check(status == CAD_STATUS_INVALID_ARGUMENT && host == NULL, "device_allocate alone refused", error);
  check(strstr(error, "device_allocate") != NULL && strstr(error, "device_free") != NULL,
        "the message names both fields", error);
  options.device_allocate = NULL;
  options.device_free = &fake_free;
  error[0] = '\0';
  status = cad_host_create(&options, &host, error, sizeof error);
  check(status == CAD_STATUS_INVALID_ARGUMENT && host == NULL, "device_free alone refused", error);

  /* 2. Both: the host's CUDA allocations go to the fake, with the device, bytes and stream. */
  options.device_allocate = &fake_allocate;
  options.log_callback = &capture_log;
  error[0] = '\0';
  status = cad_host_create(&options, &host, error, sizeof error);
  check(status == CAD_STATUS_OK, "cad_host_create with an allocator", error);
  if (status != CAD_STATUS_OK) goto done;
  services = cad_host_services(host);
  check(fake.allocs == 0, "nothing allocated at create (reference plugin)", "allocs != 0");

  status = services->allocate(services->host_ctx, gpu1, 1000, stream, &ptr);
  check(status == CAD_STATUS_OK, "CUDA allocate", cad_status_name(status));
  check(fake.allocs == 1 && fake.alloc_device == 1 && fake.alloc_bytes == 1000 && fake.alloc_stream == stream &&
            fake.alloc_user == &fake,
        "the fake got the user, device 1, 1000 bytes and the stream", "wrong arguments");
  check(ptr != NULL && ptr == fake.returned, "allocate returns the fake's block", "other pointer");
  services->free(services->host_ctx, gpu1, ptr, stream);
  check(fake.frees == 1 && fake.freed == ptr && fake.free_bytes == 1000 && fake.free_device == 1 &&
            fake.free_stream == stream && fake.free_user == &fake,
        "free hands back the pointer, device 1, 1000 bytes and the stream", "wrong arguments");

  /* Not the fake's business: CPU memory, 0 bytes, a free of a block the host does not know. */
  status = services->allocate(services->host_ctx, cpu, 64, NULL, &cpu_ptr);
  check(status == CAD_STATUS_OK && cpu_ptr != NULL, "CPU allocate", cad_status_name(status));
  services->free(services->host_ctx, cpu, cpu_ptr, NULL);
  ptr = (void*)&fake;
  status = services->allocate(services->host_ctx, gpu1, 0, stream, &ptr);
  check(status == CAD_STATUS_OK && ptr == NULL, "0 bytes: NULL and OK", cad_status_name(status));
  services->free(services->host_ctx, gpu0, (void*)&fake, stream);
  check(fake.allocs == 1 && fake.frees == 1, "the fake is not called for CPU, 0 bytes or unknown blocks",
        "called");

  /* 3. The fake's refusals. */
  fake.mode = MODE_OUT_OF_MEMORY;
  ptr = NULL;
  last_log[0] = '\0';
  status = services->allocate(services->host_ctx, gpu1, 4096, stream, &ptr);
  check(status == CAD_STATUS_OUT_OF_MEMORY && ptr == NULL, "the fake's OUT_OF_MEMORY is passed on",
        cad_status_name(status));
  check(contains_all(last_log, "application's allocator", "4096 bytes", "device 1"),
        "the OUT_OF_MEMORY message names the allocator, bytes and device", last_log);

  fake.mode = MODE_OK_WITHOUT_MEMORY;
  status = services->allocate(services->host_ctx, gpu1, 4096, stream, &ptr);
  check(status == CAD_STATUS_DEVICE_ERROR && ptr == NULL, "OK with a NULL block is a DEVICE_ERROR",
        cad_status_name(status));

  fake.mode = MODE_MISALIGNED;
  last_log[0] = '\0';
  status = services->allocate(services->host_ctx, gpu0, 512, stream, &ptr);
  check(status == CAD_STATUS_DEVICE_ERROR && ptr == NULL, "a misaligned block is refused", cad_status_name(status));
  check(fake.frees == 2 && fake.freed == fake.returned && fake.free_bytes == 512 && fake.free_device == 0 &&
            fake.live == 0,
        "the misaligned block is handed back to the fake", "not freed");
  check(contains_all(last_log, "aligned to 256", "512 bytes", "device 0"),
        "the misalignment message names the alignment, bytes and device", last_log);

  /* 4. Leaks go back to the fake at cad_host_destroy. */
  fake.mode = MODE_GOOD;
  status = services->allocate(services->host_ctx, gpu1, 300, stream, &leak_a);
  check(status == CAD_STATUS_OK, "leak a", cad_status_name(status));
  status = services->allocate(services->host_ctx, gpu0, 700, NULL, &leak_b);
  check(status == CAD_STATUS_OK, "leak b", cad_status_name(status));
  check(fake.live == 2, "two blocks live before destroy", "live != 2");
  cad_host_destroy(host);
  host = NULL;
  check(fake.frees == 4 && fake.live == 0, "the leaked blocks are freed through the fake at destroy",
        "blocks left");
  check(fake.freed_total == 1000 + 512 + 300 + 700, "each free got its block's byte count", "wrong bytes");
  check(strstr(last_log, "2 allocation(s) of 1000 bytes") != NULL, "the leak is logged", last_log);

done:
  cad_host_destroy(host);
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
