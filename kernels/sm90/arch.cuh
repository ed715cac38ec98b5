// sm90/arch.cuh -- which compilation pass may hold sm_90a code. Every sm90 kernel wraps its body in
// `#ifdef CAD_SM90_KERNEL_BODY`: with CAD_CUDA_ARCHITECTURES "90a;80" the same .cu is also compiled for
// sm_80, where wgmma/TMA/setmaxnreg do not exist, and the kernel is an empty stub there (the launchers
// only pick the sm90 kernels where the sm_90a binary is the one loaded).
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CAD_SM90_KERNEL_BODY 1
#endif
