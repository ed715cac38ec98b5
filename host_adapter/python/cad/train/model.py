"""The trainers' model pieces: the transformers Llama built from the command line's shape (the same weights
for every configuration), activation checkpointing, the data-parallel wrapper (DDP or FSDP2), the gradient norm,
and MicroBatchLoss, one micro-batch's chunked loss as the module the wrapper wraps (with ping-pong's two
nano-batches through cad.ping_pong_layers)."""
import torch

from .attention import IMPLEMENTATIONS, register_attention
from .flops import layer_windows


def build_model(args, device, dtype):
    """The transformers Llama, the same weights for every configuration (seeded, initialised on `device`)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    register_attention()
    windows = {}
    if getattr(args, "window", -1) >= 0:  # transformers' way (Gemma-3, gpt-oss): sliding_window and layer_types
        windows = dict(sliding_window=args.window + 1, layer_types=[
            "full_attention" if left < 0 else "sliding_attention" for left in layer_windows(args)])
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads,
                         max_position_embeddings=max(args.context, getattr(args, "max_doc_len", None) or 0, 2048),
                         attention_dropout=0.0, use_cache=False, **windows)  # no KV cache: it keeps every K/V
    torch.manual_seed(args.seed)  # the same weights on every rank (every GPU's generator is seeded alike)
    with device:  # initialised where it runs: a CPU init of billions of weights took most of a GPU run's start
        model = AutoModelForCausalLM.from_config(config, attn_implementation=IMPLEMENTATIONS[args.attention],
                                                 dtype=dtype)
    return model.to(device)


def _checkpointed(forward):
    def run(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


def apply_checkpointing(lm, mode, reentrant):
    """--checkpointing: full = transformers' own (every decoder layer recomputed in the backward); attention /
    mlp = only each decoder layer's self_attn / mlp module recomputed (its forward wrapped in a non-reentrant
    torch.utils.checkpoint), the rest of the layer keeps its activations."""
    if mode == "full":
        kwargs = {"use_reentrant": bool(reentrant)}
        if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name warns there
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif mode in ("attention", "mlp"):
        for layer in lm.model.layers:
            part = layer.self_attn if mode == "attention" else layer.mlp
            part.forward = _checkpointed(part.forward)


def wrap_data_parallel(module, args, device, world, dtype):
    """DDP or FSDP2 around the step module (cad.train.llama's documentation says how); one process: as is."""
    if world == 1:
        return module
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (world,))
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else \
        MixedPrecisionPolicy()
    # With ping-pong each layer is a cad.PingPongLayer, one call for both nano-batches: FSDP2 gathers its weights
    # once before both and reduces their gradients once after both. They stay gathered from the forward to the
    # backward instead of being gathered again for the recomputation (with --ping-pong-when worthwhile: set per
    # step, set_reshard_after_forward).
    for layer in module.lm.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy,
                    reshard_after_forward=not (args.ping_pong and args.ping_pong_when == "always"))
    fully_shard(module, mesh=mesh, mp_policy=policy)  # the root: embeddings, final norm, head
    return module


def grad_norm(parameters):
    """The L2 norm of the (averaged) gradients, FSDP2's shards included; a 0-d tensor (not read back yet)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2: the shards' norms combined
        norm = norm.full_tensor()
    return norm


class MicroBatchLoss(torch.nn.Module):
    """A transformers causal LM (`lm`) whose forward is one micro-batch's loss, so that DDP's and FSDP2's hooks
    see the whole forward, including ping-pong's nano-batch schedule and the chunked loss.

    forward(input_ids, position_ids, labels, nanos): nanos = [(tokens, cu_seqlens, plan)], one entry (the whole
    buffer) or two (ping-pong: two halves of the buffer, or two micro-batches' buffers one after the other), each
    a slice of the buffer in order; plan None for local attention, a tuple of
    plans (one per mask, cad.hf picks each layer's) for a model with windowed and global layers. The loss is
    the token-weighted mean over the micro-batch: every nano-batch's summed token losses over the micro-batch's
    count of predicted tokens. A nano-batch's last token predicts nothing, as a document's last token does
    (its next label is the next document's first token, which is -100)."""

    def __init__(self, lm, loss_chunk):
        super().__init__()
        self.lm = lm
        self.loss_chunk = loss_chunk

    def forward(self, input_ids, position_ids, labels=None, nanos=None, paired=False, targets=None, predicted=None):
        """paired: the two nano-batches are two micro-batches (--ping-pong-nanos micro-batches): the sum of their
        own token-weighted means, as two separate calls would add up. targets (instead of labels): token t's label
        itself, already shifted (documents cut across ranks, cad.train.long_docs: a buffer's last token predicts
        the next rank's first); predicted: what the summed token losses are divided by (default: this buffer's
        predicted tokens)."""
        shifted = targets is not None
        if shifted:
            labels = targets
        if len(nanos) == 1:
            _, cu, plan = nanos[0]
            # The transformers call: the keywords reach every layer's attention function (cad.hf).
            hidden = self.lm.model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                                   cad_cu_seqlens=cu, cad_plan=plan).last_hidden_state
            states, label_parts = [hidden], [labels]
        else:
            states, label_parts = self._ping_pong(input_ids, position_ids, labels, nanos)
        if paired:
            return sum(self._summed_token_losses(h, y) / (y[:, 1:] != -100).sum() for h, y in zip(states, label_parts))
        if predicted is None:
            predicted = ((labels if shifted else labels[:, 1:]) != -100).sum()  # a tensor: reading it would sync CUDA
        total = sum(self._summed_token_losses(h, y, shifted) for h, y in zip(states, label_parts))
        return total / predicted

    def _ping_pong(self, input_ids, position_ids, labels, nanos):
        """Two nano-batches: each embedded on its own, the decoder layers (cad.PingPongLayer) through
        cad.ping_pong_layers (each layer once, for both nano-batches, each on its own CUDA stream), then the final
        norm."""
        import cad
        inner = self.lm.model
        states, extras, label_parts, at = [], [], [], 0
        for tokens, cu, plan in nanos:
            part = slice(at, at + tokens)
            at += tokens
            positions = position_ids[:, part]
            hidden = inner.embed_tokens(input_ids[:, part])
            states.append(hidden)
            extras.append(dict(position_ids=positions, position_embeddings=inner.rotary_emb(hidden, positions),
                               cad_cu_seqlens=cu, cad_plan=plan))
            label_parts.append(labels[:, part])

        for kw in extras:
            kw["attention_mask"] = None
        states = cad.ping_pong_layers(inner.layers[:inner.config.num_hidden_layers], states, extras)
        return [inner.norm(h) for h in states], label_parts

    def _summed_token_losses(self, hidden, labels, shifted=False):
        """Sum of the token cross-entropies (token t predicts label t + 1; shifted: label t), --loss-chunk tokens at
        a time; each chunk's logits are recomputed in the backward instead of kept."""
        if shifted:
            targets = labels.reshape(-1)
        else:
            targets = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
        hidden = hidden.reshape(-1, hidden.shape[-1])
        total = 0
        for at in range(0, hidden.shape[0], self.loss_chunk):
            part = slice(at, at + self.loss_chunk)
            total = total + torch.utils.checkpoint.checkpoint(self._chunk_loss, hidden[part], targets[part],
                                                              use_reentrant=False)
        return total

    def _chunk_loss(self, hidden, targets):
        logits = self.lm.lm_head(hidden).float()
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
