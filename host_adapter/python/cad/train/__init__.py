"""The parts of the project's trainers (examples/train_llama.py, examples/train_pipeline.py, the Megatron and
TorchTitan integrations), one concern per module; import the module you need (nothing is imported here, so
that `cad.train.recipe` does not pull in transformers):

    recipe           the DistCA batch recipe and document packing (equal to host_adapter/workload's, tested)
    flops            documents' attention pairs (causal, windowed), the layers' masks, the model FLOPs of a step
    nano             ping-pong's nano-batch split policy (whole documents, heavier half first)
    schedule         the pipeline's tick schedule (GPipe, 1F1B), beside cad.CallOrder
    attention        the trainers' transformers attention functions (torch_varlen, fa4) and the attention clock
    model            the Llama model, checkpointing, DDP/FSDP2, MicroBatchLoss (one micro-batch's loss)
    batches          a micro-batch's tensors and its nano-batches with their CAD plans
    profiling        kernel time by family, garbage-collector pauses, allocator retries, stray CUDA contexts
    launch           running under torchrun: failing fast, gathering every rank's floats
    share            the realised share: speedup, ideal, (speedup - 1) / (ideal - 1)
    options          the trainers' shared options (model presets, --sync-attention-timing)
    llama_args, llama                      the Llama trainer: its command line, one configuration's training
    pipeline_args, pipeline_stage, pipeline_report, pipeline
                                           the pipeline trainer: command line, stage, records, training
"""
