/* A host written in strict C99 against cad_host.h: loads the reference plugin by path, checks what the
 * loader reports, builds a one-instance stack from JSON, runs one causal forward through the ABI and
 * compares O with a direct computation; then checks that a missing plugin is refused with a message.
 * Prints "N passed, M failed". argv[1]: path of cad_reference.so. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"
#include "cad/cad_host.h"

enum { T = 5, H = 2, D = 4 };

/* Causal attention of one segment covering all T rows, one head, done directly (the oracle here). */
static void direct_forward(const float* q, const float* k, const float* v, float scale, float* o) {
  int h, i, j, d;
  for (h = 0; h < H; ++h) {
    for (i = 0; i < T; ++i) {
      double scores[T], max_score = -1e300, sum = 0.0;
      for (j = 0; j <= i; ++j) {
        double s = 0.0;
        for (d = 0; d < D; ++d) s += (double)q[(i * H + h) * D + d] * k[(j * H + h) * D + d];
        scores[j] = s * scale;
        if (scores[j] > max_score) max_score = scores[j];
      }
      for (j = 0; j <= i; ++j) sum += exp(scores[j] - max_score);
      for (d = 0; d < D; ++d) {
        double acc = 0.0;
        for (j = 0; j <= i; ++j) acc += exp(scores[j] - max_score) / sum * v[(j * H + h) * D + d];
        o[(i * H + h) * D + d] = (float)acc;
      }
    }
  }
}

static cad_tensor_v1_t tensor(float* data, int64_t* shape, int ndim) {
  cad_tensor_v1_t t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = CAD_DEVICE_CPU;
  t.ndim = ndim;
  t.dtype.code = CAD_DTYPE_CODE_FLOAT;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

int main(int argc, char** argv) {
  char error[1024] = "";
  cad_library_t* library = NULL;
  cad_host_t* host = NULL;
  cad_host_options_v1_t options;
  char config[2048];
  const cad_attention_v1_t* attention = NULL;
  void* instance = NULL;
  float q[T * H * D], k[T * H * D], v[T * H * D], o[T * H * D], expect[T * H * D], lse[H * T];
  int64_t qkv_shape[3] = {T, H, D}, lse_shape[2] = {H, T};
  cad_tensor_v1_t tq, tk, tv, to, tlse;
  cad_segment_v1_t segment = {0, T, 0, T};
  cad_attention_forward_args_v1_t args;
  cad_status_t status;
  double max_err = 0.0;
  int i;

  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH/cad_reference.so\n", argv[0]);
    return 2;
  }

  /* 1. The loader, on a good plugin. */
  status = cad_library_open(argv[1], NULL, &library, error, sizeof error);
  check(status == CAD_STATUS_OK, "cad_library_open(reference)", error);
  if (status == CAD_STATUS_OK) {
    const cad_plugin_v1_t* plugin = cad_library_plugin(library);
    check(plugin->abi_major == 1 && plugin->kind == CAD_PLUGIN_KIND_ATTENTION, "plugin table", "kind/major");
    check(strcmp(plugin->name, "reference") == 0, "plugin name", plugin->name);
    cad_library_close(library);
  }

  /* 2. A missing plugin: refused, with the name in the message. */
  error[0] = '\0';
  library = NULL;
  status = cad_library_open("/nonexistent/cad_nothing.so", NULL, &library, error, sizeof error);
  check(status != CAD_STATUS_OK && library == NULL, "missing plugin refused", "status OK");
  check(strstr(error, "cad_nothing.so") != NULL, "missing plugin message names the file", error);

  /* 3. A stack from JSON text, and one forward through it. */
  snprintf(config, sizeof config,
           "{\"instances\": [{\"name\": \"att\", \"plugin\": \"%s\", \"config\": {\"num_threads\": 1}}],"
           " \"attention\": \"att\", \"log_level\": \"warn\"}",
           argv[1]);
  memset(&options, 0, sizeof options);
  options.struct_size = sizeof options;
  options.config_json = config;
  error[0] = '\0';
  status = cad_host_create(&options, &host, error, sizeof error);
  check(status == CAD_STATUS_OK, "cad_host_create", error);
  if (status != CAD_STATUS_OK) goto done;
  status = cad_host_attention(host, &attention, &instance);
  check(status == CAD_STATUS_OK && attention != NULL && instance != NULL, "cad_host_attention", "not found");
  if (status != CAD_STATUS_OK) goto done;

  for (i = 0; i < T * H * D; ++i) {
    q[i] = (float)sin(0.37 * i);
    k[i] = (float)cos(0.23 * i + 1.0);
    v[i] = (float)sin(0.11 * i + 2.0);
    o[i] = NAN;
  }
  tq = tensor(q, qkv_shape, 3);
  tk = tensor(k, qkv_shape, 3);
  tv = tensor(v, qkv_shape, 3);
  to = tensor(o, qkv_shape, 3);
  tlse = tensor(lse, lse_shape, 2);
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.segments = &segment;
  args.num_segments = 1;
  args.softmax_scale = 0.5f;
  args.causal = 1;
  args.q = &tq;
  args.k = &tk;
  args.v = &tv;
  args.o = &to;
  args.lse = &tlse;
  status = attention->forward(instance, &args);
  check(status == CAD_STATUS_OK, "forward", attention->last_error(instance));
  direct_forward(q, k, v, 0.5f, expect);
  for (i = 0; i < T * H * D; ++i) {
    double e = fabs((double)o[i] - expect[i]);
    if (!(e <= max_err)) max_err = e; /* NaN (an unwritten row) counts as the worst error */
  }
  check(max_err < 1e-5, "forward matches the direct computation", "max abs error >= 1e-5 or NaN");

  /* 4. An argument error through the C API: message from last_error, naming the tensor. */
  args.q = NULL;
  status = attention->forward(instance, &args);
  check(status == CAD_STATUS_INVALID_ARGUMENT, "NULL q refused", attention->last_error(instance));
  check(strstr(attention->last_error(instance), "'q'") != NULL, "message names q", attention->last_error(instance));

done:
  cad_host_destroy(host);
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
