// Layout checks that compile-time asserts cannot express: a DLPack DLTensor declared here with
// DLPack's own field types must alias cad_tensor_v1_t, and appended-field growth rules hold.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "cad_abi_v1_layout.h"

namespace {
// DLPack v0.8's DLTensor, declared with its documented field types (not included: not a dependency).
struct DLDeviceMirror { int32_t device_type; int32_t device_id; };
struct DLDataTypeMirror { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensorMirror {
  void* data; DLDeviceMirror device; int32_t ndim; DLDataTypeMirror dtype;
  int64_t* shape; int64_t* strides; uint64_t byte_offset;
};
}  // namespace

TEST(AbiLayout, TensorMatchesDLPack) {
  EXPECT_EQ(sizeof(DLTensorMirror), sizeof(cad_tensor_v1_t));
  EXPECT_EQ(offsetof(DLTensorMirror, device), offsetof(cad_tensor_v1_t, device));
  EXPECT_EQ(offsetof(DLTensorMirror, ndim), offsetof(cad_tensor_v1_t, ndim));
  EXPECT_EQ(offsetof(DLTensorMirror, dtype), offsetof(cad_tensor_v1_t, dtype));
  EXPECT_EQ(offsetof(DLTensorMirror, shape), offsetof(cad_tensor_v1_t, shape));
  EXPECT_EQ(offsetof(DLTensorMirror, strides), offsetof(cad_tensor_v1_t, strides));
  EXPECT_EQ(offsetof(DLTensorMirror, byte_offset), offsetof(cad_tensor_v1_t, byte_offset));
}

TEST(AbiLayout, EveryGrowableStructStartsWithItsSize) {
  EXPECT_EQ(offsetof(cad_plugin_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_host_services_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_attention_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_communicator_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_balancer_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_attention_forward_args_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_attention_backward_args_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_attention_capabilities_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_cost_params_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_balance_input_v1_t, struct_size), 0u);
  EXPECT_EQ(offsetof(cad_plan_v1_t, struct_size), 0u);
}
