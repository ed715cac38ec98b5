// cpu_path.h -- CAD's CPU data path (DESIGN.md steps 3-5 on host memory: a CPU server backend over a communicator
// on host memory). Each exchange is pack -> all_to_all_v over a HostWire -> unpack (exchange.h, wire.h); the parts
// run in schedule.h's order without overlap: the inbound exchange, the tasks run in place, the server batch, the
// outbound exchange. Called by the call path (call.h: run_call's dispatch) with a plan that has no device tables.
#pragma once

#include "context.h"

namespace cad::cad_plugin {

// One forward: Q/K/V to the servers, the server batch (and the tasks run in place), O and LSE back into the host's
// token order. `keep`: where the server batch goes for the backward, or NULL.
void cpu_forward(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_forward_args_v1_t* args,
                 Saved* keep, CallStats& stats);

// One backward: dO (and, unless `saved` kept them, Q/K/V/O/LSE) to the servers, the server batch's backward, dQ back
// to the query owners and partial dK/dV back to the key/value owners, summed in server order.
void cpu_backward(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_backward_args_v1_t* args,
                  const Saved* saved, CallStats& stats);

}  // namespace cad::cad_plugin
