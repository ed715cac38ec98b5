/* Compiled as strict C99 (-pedantic-errors): every plugin API header, plus the layout asserts. Running
 * it checks at run time what the preprocessor cannot: the DLPack-compatible enum values. */
#include <stdio.h>

#include "cad_abi_v1_layout.h"
#include "cad_attention_v1.h"
#include "cad_balancer_v1.h"
#include "cad_common_v1.h"
#include "cad_communicator_v1.h"
#include "cad_plugin_v1.h"

int main(void) {
  int failures = 0;
  /* DLPack: kDLCPU = 1, kDLCUDA = 2, kDLFloat = 2, kDLBfloat = 4. */
  if (CAD_DEVICE_CPU != 1 || CAD_DEVICE_CUDA != 2) failures++;
  if (CAD_DTYPE_CODE_FLOAT != 2 || CAD_DTYPE_CODE_BFLOAT != 4) failures++;
  if (CAD_STATUS_OK != 0 || CAD_STATUS_INTERNAL != 10) failures++;
  if (CAD_ABI_VERSION_MAJOR != 1) failures++;
  printf("%s\n", failures ? "C99 ABI check FAILED" : "C99 ABI check passed");
  return failures;
}
