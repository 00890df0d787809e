/*
 * schema.c — every configuration key strata knows: type, default, allowed
 * range or values, one-line doc; the cross-field rules; the documented
 * environment variables. `strata config --schema` and docs/config.md are
 * generated from these tables.
 *
 * To add a key: add one row to kKeys, keeping rows of one section together
 * (the YAML writer nests by section and a test checks they are contiguous),
 * add the key with its default to configs/base.yml (a test checks base.yml
 * covers every key with the schema default, but for kernels.<op>: those rows
 * come from the kernel contract, docs/kernels.md, "How to add a kernel op"),
 * then regenerate docs/config.md:
 *   ./build/strata config --schema > docs/config.md
 * A model.* key enters the model JSON and the model description from its
 * row (.bundle: new keys take ST_CONFIG_BUNDLE_IF_SET, so that existing
 * bundle keys hold); the model JSON takes the rows in their order here, so
 * moving a model.* row changes bundle keys. docs/architecture.md, "Where to
 * add a config key".
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/internal.h"
#include "config/kernel_keys.h" /* generated: ST__KERNEL_KEYS */

/* Rows: key, type, default (as text), then range/choices and doc. */
static const st__cfg_key kKeys[] = {
    {"seed", ST__CFG_INT, "0", .lo = 0, .hi = 2147483647, .doc = "Seeds parameter init and the data sampler."},

    {"model.vocab_size", ST__CFG_INT, "256", .lo = 2, .hi = 1048576,
     .doc = "Vocabulary size of the model; at least 256 (unless data.synthetic), and at least the tokenizer's "
            "(data.vocab_size) with data.tokenizer=bpe."},
    {"model.d_model", ST__CFG_INT, "128", .lo = 8, .hi = 65536, .doc = "Residual stream width."},
    {"model.n_layers", ST__CFG_INT, "2", .lo = 1, .hi = 1024, .doc = "Number of transformer blocks."},
    {"model.n_heads", ST__CFG_INT, "4", .lo = 1, .hi = 1024,
     .doc = "Attention heads; must divide model.d_model with an even head size (RoPE)."},
    {"model.n_kv_heads", ST__CFG_INT, "0", .lo = 0, .hi = 1024,
     .doc = "Key/value heads (grouped-query attention): query heads share them in groups of model.n_heads / "
            "model.n_kv_heads; must divide model.n_heads; 0: model.n_heads (plain multi-head attention).",
     .bundle = ST_CONFIG_BUNDLE_IF_SET, .zero_means = "model.n_heads"},
    {"model.block", ST__CFG_STRING, "llama",
     .doc = "Block kind of every layer, a name the front-end registers (docs/model.md, \"Block kinds\": llama, "
            "parallel, moe, gpt2); an unknown one is refused when the bundle is exported (exit 2).",
     .bundle = ST_CONFIG_BUNDLE_IF_SET},
    {"model.layers", ST__CFG_LIST, "[]",
     .doc = "A block kind per layer for a heterogeneous stack, e.g. [llama, parallel]: exactly model.n_layers "
            "names; empty: model.block for every layer.",
     .bundle = ST_CONFIG_BUNDLE_IF_SET},
    {"model.n_experts", ST__CFG_INT, "8", .lo = 1, .hi = 1024,
     .doc = "Experts of a moe layer (docs/model.md, \"Block kinds\", moe): each token goes to model.moe_top_k of them.",
     .bundle = ST_CONFIG_BUNDLE_IF_SET},
    {"model.moe_top_k", ST__CFG_INT, "2", .lo = 1, .hi = 1024,
     .doc = "Experts per token in a moe layer, at most model.n_experts.",
     .bundle = ST_CONFIG_BUNDLE_IF_SET},
    {"model.moe_aux_weight", ST__CFG_FLOAT, "0.01", .lo = 0, .hi = 1e3,
     .doc = "Weight of a moe layer's load-balancing loss (Switch: n_experts x sum of load x mean router "
            "probability) in the training loss, per moe layer.",
     .bundle = ST_CONFIG_BUNDLE_IF_SET},
    {"model.moe_z_weight", ST__CFG_FLOAT, "0.001", .lo = 0, .hi = 1e3,
     .doc = "Weight of a moe layer's router z-loss (mean squared log-sum-exp of the router logits) in the training "
            "loss, per moe layer.",
     .bundle = ST_CONFIG_BUNDLE_IF_SET},
    {"model.d_ff", ST__CFG_INT, "512", .lo = 1, .hi = 1048576, .doc = "Hidden width of the MLP."},
    {"model.seq_len", ST__CFG_INT, "128", .lo = 2, .hi = 8192, .doc = "Tokens per training sequence."},
    {"model.tie_embeddings", ST__CFG_BOOL, "true", .doc = "Share the input embedding with the output projection."},
    {"model.compute_dtype", ST__CFG_ENUM, "f32", .choices = "f32|bf16",
     .doc = "Dtype of the matmuls, forward and backward, and of the residuals they save (parameters, optimizer "
            "state, gradients, loss and the activations between layers stay f32)."},
    {"model.rope_theta", ST__CFG_FLOAT, "10000", .lo = 0, .lo_open = true, .hi = 1e9, .doc = "RoPE base frequency."},
    {"model.init_std", ST__CFG_FLOAT, "0.02", .lo = 0, .lo_open = true, .hi = 10,
     .doc = "Standard deviation of the normal parameter init."},
    {"model.vocab_padded", ST__CFG_INT, "0", .lo = 0, .hi = 1048576,
     .doc = "Rows of the embedding (and of an untied output projection): model.vocab_size padded up, e.g. to a "
            "multiple of 64 (GPT-2: 50257 -> 50304); the padding ids' logits are masked out of the loss and never "
            "sampled; 0: no padding. At least model.vocab_size when set.",
     .bundle = ST_CONFIG_BUNDLE_IF_SET_AFTER_KERNELS},

    {"train.steps", ST__CFG_INT, "100", .lo = 1, .hi = 100000000, .doc = "Optimizer steps to run."},
    {"train.batch_size", ST__CFG_INT, "8", .lo = 1, .hi = 1048576,
     .doc = "Sequences per optimizer step; must be divisible by train.microbatches."},
    {"train.microbatches", ST__CFG_INT, "1", .lo = 1, .hi = 65536,
     .doc = "Gradient-accumulation microbatches per step."},
    {"train.lr", ST__CFG_FLOAT, "0.003", .lo = 0, .hi = 10, .doc = "Peak learning rate."},
    {"train.lr_schedule", ST__CFG_ENUM, "cosine", .choices = "constant|linear|cosine|wsd",
     .doc = "Learning rate after the warmup: constant at train.lr; linear or cosine decay from train.lr at the end "
            "of the warmup to train.lr * train.min_lr_ratio at train.steps; wsd (warmup-stable-decay): train.lr, "
            "then a linear decay to train.lr * train.min_lr_ratio over the last train.decay_fraction of the steps "
            "after the warmup (docs/model.md)."},
    {"train.min_lr_ratio", ST__CFG_FLOAT, "0.1", .lo = 0, .hi = 1,
     .doc = "Final learning rate of the linear, cosine and wsd schedules, as a fraction of train.lr (unused by "
            "constant)."},
    {"train.decay_fraction", ST__CFG_FLOAT, "0.1", .lo = 0, .lo_open = true, .hi = 1,
     .doc = "train.lr_schedule=wsd: the fraction of the steps after the warmup that decay, at the end of the run "
            "(rounded to the nearest step, at least 1); 1 is the linear schedule."},
    {"train.warmup_steps", ST__CFG_INT, "10", .lo = 0, .hi = 100000000,
     .doc = "Linear warmup steps: step t <= train.warmup_steps trains at train.lr * t / train.warmup_steps."},
    {"train.weight_decay", ST__CFG_FLOAT, "0.1", .lo = 0, .hi = 10,
     .doc = "Decoupled weight decay of the parameters of rank >= 2 (every optimizer)."},
    {"train.beta1", ST__CFG_FLOAT, "0.9", .lo = 0, .hi = 1, .hi_open = true, .doc = "Adam first-moment decay (lion: its beta1)."},
    {"train.beta2", ST__CFG_FLOAT, "0.95", .lo = 0, .hi = 1, .hi_open = true, .doc = "Adam second-moment decay (lion: its beta2)."},
    {"train.eps", ST__CFG_FLOAT, "1e-8", .lo = 0, .lo_open = true, .hi = 1, .doc = "Adam epsilon."},
    {"train.optimizer", ST__CFG_ENUM, "adamw", .choices = "adamw|sgd|lion|adafactor|muon",
     .doc = "The update rule of every parameter (docs/scheduling.md, \"Optimizer state\"); muon: muon for the parameters of "
            "rank >= 2 outside the embedding and the head (matrices), adamw for the rest. adafactor and muon gather "
            "whole tensors on a mesh (docs/model.md, \"Optimizers\"); not with fsdp across processes."},
    {"train.optimizer_groups", ST__CFG_LIST, "[]",
     .doc = "Per-parameter overrides of train.optimizer, \"SELECTOR=OPTIMIZER\", applied in order; SELECTOR: embed, "
            "head, vectors (every 1-D parameter), matrices (rank >= 2 outside embed and head) or a block group's name "
            "(block, moe_block, ...; one the model lacks is refused when the bundle is exported, exit 2), e.g. "
            "[matrices=muon]. muon only on matrices or a block group's matrices."},
    {"train.momentum", ST__CFG_FLOAT, "0.9", .lo = 0, .hi = 1, .hi_open = true,
     .doc = "Momentum of sgd and muon (muon's beta)."},
    {"train.nesterov", ST__CFG_BOOL, "false", .doc = "sgd: Nesterov momentum (muon is always Nesterov)."},
    {"train.grad_clip", ST__CFG_FLOAT, "1.0", .lo = 0, .hi = 1e9,
     .doc = "Global gradient-norm clip; 0 disables clipping."},
    {"train.eval_every", ST__CFG_INT, "50", .lo = 0, .hi = 100000000,
     .doc = "Evaluate every N steps; 0 evaluates only at the end."},
    {"train.eval_batches", ST__CFG_INT, "4", .lo = 1, .hi = 100000, .doc = "Validation batches per evaluation."},

    {"data.path", ST__CFG_STRING, "",
     .doc = "Text corpus (file or folder); empty: Debian's fortunes corpus /usr/share/games/fortunes."},
    {"data.synthetic", ST__CFG_BOOL, "false", .doc = "Train on generated tokens instead of a corpus."},
    {"data.tokenizer", ST__CFG_ENUM, "byte", .choices = "byte|bpe",
     .doc = "byte: one token per byte (256); bpe: a byte-level BPE vocabulary of data.vocab_size trained on the corpus "
            "with Hugging Face tokenizers (docs/data.md)."},
    {"data.vocab_size", ST__CFG_INT, "0", .lo = 0, .hi = 65536,
     .doc = "data.tokenizer=bpe: the tokenizer's vocabulary, 256 (the bytes) to 65536 and at most model.vocab_size; "
            "0: model.vocab_size. The byte tokenizer takes 0 or 256.",
     .zero_means = "model.vocab_size"},
    {"data.val_fraction", ST__CFG_FLOAT, "0.05", .lo = 0, .lo_open = true, .hi = 0.5,
     .doc = "Fraction of the corpus held out for validation (packing none/pack: of each source's documents)."},
    {"data.packing", ST__CFG_ENUM, "concat", .choices = "concat|none|pack",
     .doc = "concat: random windows over the concatenated corpus; none: one document per sequence, padded; pack: "
            "whole documents packed into sequences, padded, positions restarting at each (docs/data.md)."},
    {"data.separator", ST__CFG_STRING, "",
     .doc = "packing none/pack: a line consisting exactly of this separates documents inside a text file (fortunes: "
            "%); empty: each file is one document."},
    {"data.jsonl_field", ST__CFG_STRING, "text",
     .doc = "packing none/pack: a *.jsonl corpus file holds one JSON object per line, one document each: this "
            "string field."},
    {"data.prompt_marker", ST__CFG_STRING, "",
     .doc = "packing none/pack: a document with a line consisting exactly of this is a prompt (the tokens before "
            "it: their targets weigh 0 in the loss) and a completion (after it); the line is dropped. Empty: off."},
    {"data.allow_changed", ST__CFG_BOOL, "false",
     .doc = "Resume even though a data source changed since the checkpoint (its content hash or documents): the change "
            "is said and recorded in the resumed event; false refuses (exit 3, docs/data.md \"Data contract\")."},
    {"data.sources", ST__CFG_LIST, "[]",
     .doc = "packing none/pack: corpora (text files, folders or token files) mixed by data.weights; replaces "
            "data.path when not empty."},
    {"data.weights", ST__CFG_LIST, "[]",
     .doc = "One number > 0 per data.sources entry: the share of documents drawn from it (normalised)."},

    {"run.dir", ST__CFG_STRING, "", .doc = "Run directory; empty: runs/<run.id>."},
    {"run.id", ST__CFG_STRING, "",
     .doc = "Run name, the folder under runs/: letters, digits, '.', '_', '-' (at most 128); empty: generated from the date and time."},
    {"run.progress", ST__CFG_ENUM, "auto", .choices = "auto|on|off",
     .doc = "Console progress line; auto: only when stderr is a terminal."},
    {"run.progress_min_bytes", ST__CFG_INT, "67108864", .lo = 0, .hi = 1099511627776.0,
     .doc = "With run.progress, checkpoint writing and corpus tokenizing show their progress from this many bytes on (export and compile always)."},
    {"run.resume", ST__CFG_BOOL, "false",
     .doc = "Continue the run in run.dir from its newest valid checkpoint instead of refusing an existing run directory."},

    {"runtime.plugin", ST__CFG_STRING, "",
     .doc = "PJRT plugin (.so); empty: $STRATA_PJRT_PLUGIN, then the .venv CPU plugin."},
    {"runtime.cpu_devices", ST__CFG_INT, "2", .lo = 1, .hi = 256, .doc = "Devices the CPU plugin exposes."},
    {"runtime.deterministic", ST__CFG_BOOL, "false", .doc = "Ask XLA for deterministic (slower) kernels."},
    {"runtime.keep_optimized_hlo", ST__CFG_BOOL, "false",
     .doc = "Keep XLA's optimized program of every compiled program beside its executable cache entry "
            "(<cache>/executables/<key>.hlo) for strata analyze's fusion counts (docs/analysis.md)."},
    {"runtime.compile_threads", ST__CFG_INT, "0", .lo = 0, .hi = 1024,
     .doc = "Programs compiled at once on a cold start; 0: one per two online CPUs on a CPU plugin, 1 on a GPU plugin "
            "(docs/performance.md, \"GPU\")."},
    {"runtime.xla_options", ST__CFG_LIST, "[]", .doc = "Extra compile options, strings \"name=value\"."},
    {"runtime.cache_dir", ST__CFG_STRING, "",
     .doc = "Compile and bundle cache; empty: $STRATA_CACHE_DIR, else ~/.cache/strata."},
    {"runtime.device_memory_bytes", ST__CFG_INT, "0", .lo = 0, .hi = 1125899906842624.0,
     .doc = "Bytes each device holds, where the PJRT plugin does not report it (the CPU plugin); strata plan --fit and "
            "strata train check the predicted peak per device against it (docs/scheduling.md, \"Will it fit\"). 0: the "
            "plugin's, else on the CPU plugin (device memory is host memory) the host's available memory less "
            "max(10 % of the host, 1 GiB), against every device's peak plus strata's host bytes."},
    {"runtime.shared_client", ST__CFG_ENUM, "auto", .choices = "auto|on|off",
     .doc = "In a job of several processes: one PJRT client across them, bootstrapped through the job's key-value "
            "store (on; a GPU plugin's collectives can then span processes), or one client per process (off; the CPU "
            "plugin refuses to share); auto: on when the plugin's file name says cuda, rocm, gpu or tpu "
            "(docs/multiprocess.md). One process: unused."},

    {"parallel.data", ST__CFG_INT, "1", .lo = 1, .hi = 4096,
     .doc = "Data-parallel mesh axis: devices that each train on their own share of every microbatch "
            "(docs/parallelism.md)."},
    {"parallel.fsdp", ST__CFG_INT, "1", .lo = 1, .hi = 4096,
     .doc = "Fully-sharded mesh axis: parameters, gradients and optimizer state split over these devices."},
    {"parallel.tensor", ST__CFG_INT, "1", .lo = 1, .hi = 4096,
     .doc = "Tensor-parallel mesh axis: attention heads and the MLP hidden dimension split over these devices."},
    {"parallel.pipeline", ST__CFG_INT, "1", .lo = 1, .hi = 16,
     .doc = "Pipeline stages (docs/parallelism.md, \"Pipeline\"): each stage owns a contiguous range of layers (the "
            "embedding on the first, the head and loss on the last) on data x fsdp x tensor devices of its own; "
            "activations and their gradients are sent between neighbouring stages."},
    {"parallel.pipeline_layers", ST__CFG_LIST, "[]",
     .doc = "Layers of each pipeline stage in order (of each model chunk, parallel.pipeline x "
            "sched.pipeline_virtual of them, with sched.pipeline_schedule=interleaved), e.g. [3, 5]; empty: split "
            "to balance each stage's predicted cost (its programs' FLOPs, the embedding's and head's included)."},
    {"parallel.processes", ST__CFG_INT, "1", .lo = 1, .hi = 65536,
     .doc = "Processes of the job (docs/multiprocess.md): set by strata train from the launcher (mpirun, srun); "
            "they span the outermost mesh axis above 1 (data, else fsdp), which must be divisible by it."},

    {"sched.remat", ST__CFG_STRING, "auto",
     .doc = "Layers that recompute their forward in the backward: auto (the fewest that keep the predicted peak "
            "within sched.memory_budget), none, full, every:K (layers 0, K, 2K, ...) or a list such as \"0,2\"; the "
            "others keep their residuals."},
    {"sched.memory_budget", ST__CFG_STRING, "0",
     .doc = "sched.remat=auto: predicted peak live bytes allowed per device, as bytes (0: no limit, so auto keeps "
            "every layer's residuals) or a fraction of the device's memory such as 0.9 (only where the PJRT plugin "
            "reports it; the CPU plugin does not)."},
    {"sched.offload", ST__CFG_ENUM, "none", .choices = "none|optimizer|params|both",
     .doc = "What lives in host memory between uses: optimizer state (AdamW's m, v), block parameters, or both."},
    {"sched.prefetch_depth", ST__CFG_INT, "1", .lo = 0, .hi = 64,
     .doc = "How many launches ahead offloaded buffers are brought back to the device."},
    {"sched.wait", ST__CFG_ENUM, "deferred", .choices = "deferred|eager",
     .doc = "deferred: block only where the host consumes a value; eager: block after every launch and transfer."},
    {"sched.optimizer", ST__CFG_ENUM, "after_backward", .choices = "after_backward|per_layer",
     .doc = "Update after the whole backward (global clipping), or each layer as soon as its gradient is final "
            "(needs train.grad_clip=0)."},
    {"sched.grad_reduce", ST__CFG_ENUM, "per_layer", .choices = "per_layer|bucketed",
     .doc = "With parallel.data > 1: all-reduce each layer's gradients as soon as they are final (overlapping the "
            "next layer's backward), or after the backward, in buckets of sched.grad_bucket_bytes."},
    {"sched.grad_bucket_bytes", ST__CFG_INT, "0", .lo = 0, .hi = 1099511627776.0,
     .doc = "sched.grad_reduce=bucketed: gradient bytes per bucket; a bucket's all-reduces are issued together once "
            "it is full (0: one bucket, all after the backward)."},
    {"sched.gather_prefetch", ST__CFG_INT, "1", .lo = 0, .hi = 64,
     .doc = "With parallel.fsdp > 1: how many layers ahead each layer's parameter all-gather is issued (0: just "
            "before the layer runs)."},
    {"sched.reshard_after_forward", ST__CFG_BOOL, "true",
     .doc = "With parallel.fsdp > 1: free a layer's gathered parameters after its forward and gather them again for "
            "its backward (true), or keep them from the forward until the backward (false: more memory, fewer "
            "all-gathers)."},
    {"sched.pipeline_schedule", ST__CFG_ENUM, "1f1b", .choices = "gpipe|1f1b|interleaved",
     .doc = "With parallel.pipeline > 1: gpipe (every microbatch's forward, then every backward: holds all "
            "microbatches' activations), 1f1b (one forward, one backward in the steady state: the first stage holds "
            "at most parallel.pipeline microbatches' activations) or interleaved (1f1b over "
            "sched.pipeline_virtual model chunks per stage: a smaller bubble, more sends)."},
    {"sched.pipeline_virtual", ST__CFG_INT, "1", .lo = 1, .hi = 16,
     .doc = "sched.pipeline_schedule=interleaved: model chunks per pipeline stage (at least 2; chunk c of "
            "parallel.pipeline x this many lies on stage c mod parallel.pipeline)."},
    {"sched.allow_overcommit", ST__CFG_BOOL, "false",
     .doc = "Train even when the predicted peak (live buffers and XLA's temporaries) exceeds the device's memory (on "
            "the CPU plugin the host's); false: strata train and strata plan --fit stop with exit 4 (out of memory, "
            "not restarted by strata run) and the policies that would fit."},

    {"trace.steps", ST__CFG_LIST, "[]",
     .doc = "Steps (1-based) written as Chrome trace-event JSON to <run>/trace/step_<N>.json (Perfetto)."},

    {"obs.metrics_port", ST__CFG_INT, "0", .lo = 0, .hi = 65535,
     .doc = "Serve the latest metrics (Prometheus text format) at http://127.0.0.1:<port>/metrics while training; 0: off."},
    {"obs.peak_flops", ST__CFG_FLOAT, "0", .lo = 0, .hi = 1e20,
     .doc = "Peak FLOP/s of one device for MFU (metrics.jsonl mfu, context.json peak), e.g. a datasheet figure; "
            "0: a known accelerator's datasheet figure, else strata doctor's measured matmul peak (docs/analysis.md)."},
    {"obs.tensorboard", ST__CFG_BOOL, "true",
     .doc = "Also write every metrics.jsonl line as TensorBoard scalars, to event files under <run>/tb/ "
            "(`tensorboard --logdir runs/`; docs/using.md)."},
    {"obs.author", ST__CFG_STRING, "",
     .doc = "Who runs the experiment, recorded as context.json author (author_source \"config\"); empty: git's "
            "user.name <user.email> of the folder strata runs in, else $USER (docs/using.md, \"strata note\")."},

    {"bundle.dir", ST__CFG_STRING, "", .doc = "Program bundle folder; empty: <cache>/bundles/<bundle key>."},

    {"ckpt.every", ST__CFG_INT, "50", .lo = 0, .hi = 100000000,
     .doc = "Save a checkpoint every N steps (and always after the last step); 0: only after the last step."},
    {"ckpt.keep", ST__CFG_INT, "3", .lo = 1, .hi = 1000000, .doc = "Keep the newest N checkpoints; older ones are deleted."},
    {"ckpt.keep_every", ST__CFG_INT, "0", .lo = 0, .hi = 100000000,
     .doc = "Also keep every checkpoint whose step is a multiple of K; 0: off."},
    {"ckpt.on_error", ST__CFG_ENUM, "stop", .choices = "stop|continue",
     .doc = "A failed save stops training (exit 7) or is logged and training continues."},
    {"ckpt.async", ST__CFG_BOOL, "true",
     .doc = "With ckpt.staging=full, write checkpoints on a writer thread while training goes on (it waits only for "
            "the device-to-host copy); chunked staging (auto's choice on a CPU plugin) saves synchronously whatever "
            "this says."},
    {"ckpt.staging", ST__CFG_ENUM, "auto", .choices = "auto|full|chunked",
     .doc = "Host memory of a save: full (a host copy of the whole state, written on the writer thread while training "
            "goes on) or chunked (one tensor at a time, the run waits for the save); auto: chunked on a CPU plugin "
            "(its device memory is host memory) or when the copy would exceed a quarter of the host's memory."},
    {"ckpt.allow_bundle_change", ST__CFG_BOOL, "false",
     .doc = "Resume from checkpoints written with another bundle key (same model config, tensors, shapes, dtypes), e.g. after an exporter update."},

    {"recovery.max_restarts", ST__CFG_INT, "3", .lo = 0, .hi = 1000,
     .doc = "strata run: restarts after crashes before giving up."},
    {"recovery.backoff_s", ST__CFG_FLOAT, "1", .lo = 0, .hi = 3600,
     .doc = "strata run: wait before the first restart; doubles with each restart."},
    {"recovery.backoff_max_s", ST__CFG_FLOAT, "60", .lo = 0, .hi = 86400,
     .doc = "strata run: upper bound of the restart wait."},
    {"recovery.hang_timeout_s", ST__CFG_FLOAT, "0", .lo = 0, .hi = 604800,
     .doc = "strata run: kill and restart a child that wrote no event or metrics line for this long; 0: off."},

    {"faults.crash_at_step", ST__CFG_INT, "0", .lo = 0, .hi = 100000000,
     .doc = "Drill: SIGKILL the trainer during step N (after the device ran it, before it is recorded); 0: off."},
    {"faults.crash_in_save", ST__CFG_INT, "0", .lo = 0, .hi = 1000000,
     .doc = "Drill: SIGKILL the trainer halfway through writing its N-th checkpoint; 0: off."},
    {"faults.corrupt_latest", ST__CFG_INT, "0", .lo = 0, .hi = 1000000,
     .doc = "Drill: flip one byte of tensor data in the N-th checkpoint right after it is committed; 0: off."},
    {"faults.io_error_at_save", ST__CFG_INT, "0", .lo = 0, .hi = 1000000,
     .doc = "Drill: make the N-th checkpoint save fail halfway with faults.io_error; 0: off."},
    {"faults.io_error", ST__CFG_ENUM, "ENOSPC", .choices = "ENOSPC|EIO", .doc = "Drill: the errno of faults.io_error_at_save."},
    {"faults.hang_at_step", ST__CFG_INT, "0", .lo = 0, .hi = 100000000,
     .doc = "Drill: stop making progress during step N (until a stop signal: SIGTERM, SIGINT, SIGHUP); 0: off."},
    {"faults.hang_in_save", ST__CFG_INT, "0", .lo = 0, .hi = 1000000,
     .doc = "Drill: the N-th checkpoint save stops halfway through its first file, forever; 0: off."},
    {"faults.repeat", ST__CFG_BOOL, "false",
     .doc = "Drill: fire faults in every attempt; default: each fires once per run directory (diag/faults.fired)."},
    {"faults.hang_in", ST__CFG_STRING, "",
     .doc = "Drill: PROGRAM or PROGRAM:STEP: the first launch of that program (at step STEP) blocks forever inside the "
            "launch (until a stop signal); a program no plan runs is refused (exit 2); empty: off."},    {"faults.nan_at", ST__CFG_STRING, "",
     .doc = "Drill: STEP:LAYER[:TENSOR] puts a NaN into the first element of layer LAYER's forward output TENSOR "
            "(default: y) in step STEP, microbatch faults.nan_micro (docs/diagnostics.md); empty: off."},
    {"faults.nan_micro", ST__CFG_INT, "0", .lo = 0, .hi = 1000000,
     .doc = "Drill: the microbatch (from 0) faults.nan_at poisons."},
    {"faults.nan_value", ST__CFG_ENUM, "nan", .choices = "nan|inf|max",
     .doc = "Drill: what faults.nan_at puts there: NaN, +inf, or the largest finite f32 (3.4e38), which a later "
            "program turns into a non-finite value itself."},
    {"faults.wrong_kernel", ST__CFG_ENUM, "off", .choices = "off|attention",
     .doc = "Test-only drill: attention makes the ffi attention kernel's forward output o slightly wrong (scaled by "
            "1 + 2^-10), for tests of strata compare (docs/diagnostics.md, \"Dump and compare\"); needs the "
            "attention op's kernel to be ffi (exit 2 otherwise)."},
    {"faults.slow_program", ST__CFG_STRING, "",
     .doc = "Drill (performance): PROGRAM:FRACTION makes every training launch of PROGRAM take FRACTION x its own "
            "measured duration longer (the trainer waits that long after it completes), e.g. block_fwd_res:0.3; "
            "`make bench-check` must then fail naming it (docs/performance.md, \"Baselines\"); a program no step "
            "plan launches is refused (exit 2); empty: off."},

    {"diag.hang_timeout_s", ST__CFG_FLOAT, "0", .lo = 0, .hi = 604800,
     .doc = "Hang watchdog in the trainer: an op, compile, checkpoint write or step running longer than max(floor, "
            "diag.hang_factor x its slowest seen) plus this writes diag/hang-<time>/ and exits 6; 0: off "
            "(docs/diagnostics.md)."},
    {"diag.hang_factor", ST__CFG_FLOAT, "10", .lo = 1, .hi = 1e6,
     .doc = "Hang watchdog: K of the learned part of a deadline, K x the slowest completed duration of the same op "
            "(compile, checkpoint write, step)."},
    {"diag.hang_floor_s", ST__CFG_FLOAT, "10", .lo = 0, .hi = 604800,
     .doc = "Hang watchdog: the least learned part of the deadline of an op, a checkpoint write or a step."},
    {"diag.hang_compile_s", ST__CFG_FLOAT, "1800", .lo = 0, .hi = 604800,
     .doc = "Hang watchdog: the least learned part of the deadline of a compile (seen once a process, so rarely learned)."},
    {"diag.spike_z", ST__CFG_FLOAT, "6", .lo = 0, .hi = 1e6,
     .doc = "A step loss more than this many standard deviations above the mean of the last diag.spike_window "
            "losses is a loss_spike event with the batch's sample indices; 0: off."},
    {"diag.spike_window", ST__CFG_INT, "50", .lo = 2, .hi = 1000000,
     .doc = "Loss spikes: how many recent losses the z-score is taken over (a verdict needs at least min(10, window))."},
    {"diag.on_nonfinite", ST__CFG_ENUM, "stop", .choices = "stop|skip|rollback",
     .doc = "A non-finite loss or gradient norm: stop (exit 5, not restarted by strata run), skip (drop the step's "
            "update and go on) or rollback (restore the newest checkpoint and skip the data since; "
            "docs/diagnostics.md)."},
    {"diag.max_skipped", ST__CFG_INT, "10", .lo = 0, .hi = 100000000,
     .doc = "diag.on_nonfinite=skip: steps a run may skip; one more stops it with exit 5."},
    {"diag.max_rollbacks", ST__CFG_INT, "3", .lo = 0, .hi = 1000000,
     .doc = "diag.on_nonfinite=rollback: rollbacks a run may make; one more stops it with exit 5."},
    {"diag.numerics", ST__CFG_ENUM, "off", .choices = "off|step|layer",
     .doc = "Numerics health in metrics.jsonl: step (parameter and update norms, their ratio), layer (also per layer "
            "the RMS, largest |x| and non-finite count of block outputs, input gradients, parameter gradients and "
            "updates; docs/diagnostics.md). Needs parallel.fsdp=1 and parallel.tensor=1."},
    {"diag.dump", ST__CFG_STRING, "",
     .doc = "step:N writes every program's inputs and outputs of step N, as logical tensors, with the plan op that "
            "ran each, to <run>/dump/step_N/ (index.json, tensors.safetensors); step:N,layers:A-B only the launches "
            "of block layers A to B; strata compare RUN_A RUN_B finds the first tensor that differs "
            "(docs/diagnostics.md, \"Dump and compare\"); empty: off."},

    /* kernels.<op>, one row per op of the kernel contract, in its order:
     * generated from python/strata_jax/kernel_contract.json (each row's
     * implementations and config_doc; cmake/KernelContract.cmake). */
#define ST__KERNEL_KEY(name, impls, text) {"kernels." name, ST__CFG_ENUM, "auto", .choices = impls, .doc = text},
    ST__KERNEL_KEYS(ST__KERNEL_KEY)
#undef ST__KERNEL_KEY
};

static const st__cfg_section kSections[] = {
    {"", "Keys outside any section."},
    {"model", "The transformer: shapes, dtype, init."},
    {"train", "Optimizer, schedule, batch and evaluation."},
    {"data", "Corpus, tokenization, split."},
    {"run", "Run directory and console output."},
    {"runtime", "PJRT plugin, devices, compilation."},
    {"parallel", "The device mesh: data, fsdp and tensor axis sizes (docs/parallelism.md)."},
    {"bundle", "Exported programs."},
    {"sched", "The step plan's policies: remat, offload, prefetch, waits, optimizer placement (docs/scheduling.md)."},
    {"trace", "Chrome traces of chosen steps (docs/scheduling.md)."},
    {"obs", "Watching a run: the live metrics endpoint and the TensorBoard files (docs/using.md)."},
    {"ckpt", "Checkpoints: cadence, retention, failure policy (docs/checkpoints.md)."},
    {"recovery", "The supervisor (strata run): restarts, backoff, hang timeout."},
    {"faults", "Fault injection for recovery drills; all off by default."},
    {"diag", "Diagnostics: what a non-finite loss or gradient does, numerics health, the hang watchdog, loss spikes (docs/diagnostics.md)."},
    {"kernels", "Which implementation serves each kernel op: auto, xla, ffi or pallas (docs/kernels.md)."},
};

static const st__cfg_env kEnvs[] = {
    {"STRATA_PJRT_PLUGIN", "PJRT plugin used when runtime.plugin is empty."},
    {"STRATA_CACHE_DIR", "Cache folder used when runtime.cache_dir is empty."},
    {"STRATA_PYTHON", "Interpreter that runs the exporter; default: ./.venv/bin/python, then the repository's. Its venv is searched for the CPU plugin too (docs/install.md)."},
    {"STRATA_SOURCE_DIR",
     "The strata repository (python/, configs/, .venv/) when the binary runs outside the tree it was built in."},
};

/* ---- cross-field rules -------------------------------------------------- */

/* Messages name both keys with their values and sources, so the user knows
 * which of the two to change and where it was set. */

static st_status st__rule_heads(const st_config* c) {
  int64_t d = st_config_int(c, "model.d_model"), h = st_config_int(c, "model.n_heads");
  if (d % h != 0)
    return st_status_make(ST_CODE_CONFIG, "model.d_model (%lld, %s) is not divisible by model.n_heads (%lld, %s)",
                          (long long)d, st_config_source(c, "model.d_model"), (long long)h,
                          st_config_source(c, "model.n_heads"));
  if ((d / h) % 2 != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "head size model.d_model / model.n_heads = %lld / %lld = %lld must be even for RoPE "
                          "(model.d_model: %s, model.n_heads: %s)",
                          (long long)d, (long long)h, (long long)(d / h), st_config_source(c, "model.d_model"),
                          st_config_source(c, "model.n_heads"));
  int64_t kv = st_config_int(c, "model.n_kv_heads");
  if (kv > 0 && h % kv != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "model.n_heads (%lld, %s) is not divisible by model.n_kv_heads (%lld, %s): grouped-query "
                          "attention shares each key/value head among model.n_heads / model.n_kv_heads query heads",
                          (long long)h, st_config_source(c, "model.n_heads"), (long long)kv,
                          st_config_source(c, "model.n_kv_heads"));
  return ST_OK;
}

/* The moe kind's routing: each token picks model.moe_top_k experts of
 * model.n_experts. Checked whatever the kinds (the C side knows none). */
static st_status st__rule_moe(const st_config* c) {
  int64_t k = st_config_int(c, "model.moe_top_k"), e = st_config_int(c, "model.n_experts");
  if (k > e)
    return st_status_make(ST_CODE_CONFIG,
                          "model.moe_top_k (%lld, %s) is larger than model.n_experts (%lld, %s): a token is routed to "
                          "model.moe_top_k of the model.n_experts experts",
                          (long long)k, st_config_source(c, "model.moe_top_k"), (long long)e,
                          st_config_source(c, "model.n_experts"));
  return ST_OK;
}

/* A per-layer list of block kinds names one kind per layer. The names
 * themselves are the front-end's (its registry refuses an unknown one when
 * it exports, exit 2): the C side knows no block kind. */
static st_status st__rule_layers(const st_config* c) {
  int n = st_config_list_count(c, "model.layers");
  int64_t layers = st_config_int(c, "model.n_layers");
  if (n > 0 && n != layers)
    return st_status_make(ST_CODE_CONFIG, "model.layers (%s) names %d block kinds, but model.n_layers is %lld (%s): give "
                          "one kind per layer, or leave model.layers empty to use model.block for every layer",
                          st_config_source(c, "model.layers"), n, (long long)layers, st_config_source(c, "model.n_layers"));
  for (int i = 0; i < n; ++i) {
    const char* k = st_config_list_item(c, "model.layers", i);
    if (!k || !*k)
      return st_status_make(ST_CODE_CONFIG, "model.layers[%d] (%s) is empty: name a block kind (docs/model.md)", i,
                            st_config_source(c, "model.layers"));
  }
  if (!*st_config_string(c, "model.block"))
    return st_status_make(ST_CODE_CONFIG, "model.block (%s) is empty: name a block kind (docs/model.md)",
                          st_config_source(c, "model.block"));
  return ST_OK;
}

static st_status st__rule_microbatches(const st_config* c) {
  int64_t b = st_config_int(c, "train.batch_size"), m = st_config_int(c, "train.microbatches");
  if (b % m != 0)
    return st_status_make(
        ST_CODE_CONFIG, "train.batch_size (%lld, %s) is not divisible by train.microbatches (%lld, %s)", (long long)b,
        st_config_source(c, "train.batch_size"), (long long)m, st_config_source(c, "train.microbatches"));
  return ST_OK;
}

static st_status st__rule_vocab_padded(const st_config* c) {
  int64_t p = st_config_int(c, "model.vocab_padded"), v = st_config_int(c, "model.vocab_size");
  if (p != 0 && p < v)
    return st_status_make(ST_CODE_CONFIG,
                          "model.vocab_padded (%lld, %s) is smaller than model.vocab_size (%lld, %s): it pads the "
                          "vocabulary up; set it to 0 (no padding) or at least %lld",
                          (long long)p, st_config_source(c, "model.vocab_padded"), (long long)v,
                          st_config_source(c, "model.vocab_size"), (long long)v);
  return ST_OK;
}

static st_status st__rule_vocab(const st_config* c) {
  int64_t v = st_config_int(c, "model.vocab_size");
  /* bpe: st__rule_tokenizer names data.vocab_size, the key that sets it. */
  if (v < 256 && !st_config_bool(c, "data.synthetic") && strcmp(st_config_string(c, "data.tokenizer"), "bpe") != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "model.vocab_size (%lld, %s) must be at least 256 for the byte tokenizer when "
                          "data.synthetic is false (%s)",
                          (long long)v, st_config_source(c, "model.vocab_size"), st_config_source(c, "data.synthetic"));
  return ST_OK;
}

/* The BPE vocabulary holds the 256 byte symbols (so every byte can be
 * encoded) and must fit the model's embedding; the byte tokenizer has 256. */
static st_status st__rule_tokenizer(const st_config* c) {
  const char* kind = st_config_string(c, "data.tokenizer");
  int64_t v = st_config_int(c, "data.vocab_size"), m = st_config_int(c, "model.vocab_size");
  if (strcmp(kind, "bpe") != 0) {
    if (v != 0 && v != 256)
      return st_status_make(ST_CODE_CONFIG,
                            "data.vocab_size (%lld, %s) is the BPE vocabulary; data.tokenizer=byte (%s) has 256 tokens: "
                            "set data.vocab_size to 0 (or 256), or data.tokenizer=bpe",
                            (long long)v, st_config_source(c, "data.vocab_size"), st_config_source(c, "data.tokenizer"));
    return ST_OK;
  }
  if (st_config_bool(c, "data.synthetic"))
    return st_status_make(ST_CODE_CONFIG,
                          "data.tokenizer=bpe (%s) trains on the corpus, but data.synthetic is true (%s): generated "
                          "tokens have no text; use one or the other",
                          st_config_source(c, "data.tokenizer"), st_config_source(c, "data.synthetic"));
  int64_t eff = v ? v : m;
  if (eff < 256)
    return st_status_make(ST_CODE_CONFIG,
                          "data.vocab_size (%lld%s, %s) is too small for data.tokenizer=bpe: the vocabulary holds the "
                          "256 byte symbols (the byte fallback) and then the merges; set data.vocab_size to at least 256",
                          (long long)eff, v ? "" : ", from model.vocab_size since data.vocab_size is 0",
                          st_config_source(c, v ? "data.vocab_size" : "model.vocab_size"));
  if (eff > 65536)
    return st_status_make(ST_CODE_CONFIG,
                          "data.vocab_size (0, %s) takes model.vocab_size (%lld, %s), above the 65536 tokens strata keeps "
                          "(u16); set data.vocab_size",
                          st_config_source(c, "data.vocab_size"), (long long)m, st_config_source(c, "model.vocab_size"));
  if (eff > m)
    return st_status_make(ST_CODE_CONFIG,
                          "data.vocab_size (%lld, %s) is larger than model.vocab_size (%lld, %s): the model must embed "
                          "every token id; raise model.vocab_size or lower data.vocab_size",
                          (long long)eff, st_config_source(c, "data.vocab_size"), (long long)m,
                          st_config_source(c, "model.vocab_size"));
  return ST_OK;
}

/* Documents and mixing (docs/data.md, "Packing" and "Mixing"). */
static st_status st__rule_packing(const st_config* c) {
  const bool concat = !strcmp(st_config_string(c, "data.packing"), "concat");
  const int n = st_config_list_count(c, "data.sources"), nw = st_config_list_count(c, "data.weights");
  const char* marker = st_config_string(c, "data.prompt_marker");
  if (marker[0] && concat)
    return st_status_make(ST_CODE_CONFIG,
                          "data.prompt_marker (%s) weighs a document's prompt, but data.packing is concat (%s), which "
                          "has no documents: set data.packing to none or pack",
                          st_config_source(c, "data.prompt_marker"), st_config_source(c, "data.packing"));
  if (strchr(marker, '\n') || (marker[0] && !strcmp(marker, st_config_string(c, "data.separator"))))
    return st_status_make(ST_CODE_CONFIG,
                          "data.prompt_marker (%s) must be one line, other than data.separator (%s): it is matched "
                          "against a document's lines",
                          st_config_source(c, "data.prompt_marker"), st_config_source(c, "data.separator"));
  if (n > 0 && concat)
    return st_status_make(ST_CODE_CONFIG,
                          "data.sources (%s) mixes documents, but data.packing is concat (%s): set data.packing to none "
                          "or pack",
                          st_config_source(c, "data.sources"), st_config_source(c, "data.packing"));
  if (n > 0 && st_config_bool(c, "data.synthetic"))
    return st_status_make(ST_CODE_CONFIG, "data.sources (%s) and data.synthetic (%s) both choose the corpus: set one",
                          st_config_source(c, "data.sources"), st_config_source(c, "data.synthetic"));
  if (n > 64)
    return st_status_make(ST_CODE_CONFIG, "data.sources (%s) has %d entries, at most 64", st_config_source(c, "data.sources"), n);
  if (nw != n)
    return st_status_make(ST_CODE_CONFIG, "data.weights (%s) has %d entries, data.sources (%s) %d: one weight per source",
                          st_config_source(c, "data.weights"), nw, st_config_source(c, "data.sources"), n);
  for (int i = 0; i < nw; ++i) {
    const char* w = st_config_list_item(c, "data.weights", i);
    char* end = NULL;
    double v = strtod(w, &end);
    if (end == w || *end || !(v > 0) || !(v < 1e300))
      return st_status_make(ST_CODE_CONFIG, "data.weights (%s): entry %d '%s' is not a number > 0",
                            st_config_source(c, "data.weights"), i, w);
  }
  return ST_OK;
}

static st_status st__rule_remat(const st_config* c) {
  st_status s = st_config_remat_parse(st_config_string(c, "sched.remat"), (int)st_config_int(c, "model.n_layers"), NULL);
  if (s) s = st_status_annotate(s, "sched.remat (%s), model.n_layers (%s)", st_config_source(c, "sched.remat"),
                                st_config_source(c, "model.n_layers"));
  return s;
}

static st_status st__rule_memory_budget(const st_config* c) {
  st_status s = st_config_memory_budget_parse(st_config_string(c, "sched.memory_budget"), NULL, NULL);
  if (s) s = st_status_annotate(s, "sched.memory_budget (%s)", st_config_source(c, "sched.memory_budget"));
  return s;
}

static st_status st__rule_per_layer(const st_config* c) {
  st_status s = st_config_check_per_layer_clip(!strcmp(st_config_string(c, "sched.optimizer"), "per_layer"),
                                               st_config_float(c, "train.grad_clip"));
  if (s) s = st_status_annotate(s, "sched.optimizer (%s), train.grad_clip (%s)", st_config_source(c, "sched.optimizer"),
                                st_config_source(c, "train.grad_clip"));
  return s;
}

static st_status st__rule_nan_at(const st_config* c) {
  int64_t step = 0;
  int layer = 0;
  st_status s = st_config_nan_at_parse(st_config_string(c, "faults.nan_at"), &step, &layer, NULL, 0);
  if (!s && step > st_config_int(c, "train.steps"))
    s = st_status_make(ST_CODE_CONFIG, "faults.nan_at names step %lld, but train.steps is %lld (%s)", (long long)step,
                       (long long)st_config_int(c, "train.steps"), st_config_source(c, "train.steps"));
  if (!s && step > 0 && layer >= st_config_int(c, "model.n_layers"))
    s = st_status_make(ST_CODE_CONFIG, "faults.nan_at names layer %d, but model.n_layers is %lld (%s); layers count from 0",
                       layer, (long long)st_config_int(c, "model.n_layers"), st_config_source(c, "model.n_layers"));
  if (!s && step > 0 && st_config_int(c, "faults.nan_micro") >= st_config_int(c, "train.microbatches"))
    s = st_status_make(ST_CODE_CONFIG, "faults.nan_micro (%s) is %lld, but train.microbatches is %lld; microbatches count from 0",
                       st_config_source(c, "faults.nan_micro"), (long long)st_config_int(c, "faults.nan_micro"),
                       (long long)st_config_int(c, "train.microbatches"));
  if (s) s = st_status_annotate(s, "faults.nan_at (%s)", st_config_source(c, "faults.nan_at"));
  return s;
}

/* The step drills name a step the run has: one beyond train.steps never
 * fires, and a drill that does not fire reads as a pass. */
static st_status st__rule_fault_steps(const st_config* c) {
  const int64_t steps = st_config_int(c, "train.steps");
  const char* const keys[] = {"faults.crash_at_step", "faults.hang_at_step"};
  for (int i = 0; i < 2; ++i) {
    int64_t n = st_config_int(c, keys[i]);
    if (n > steps)
      return st_status_make(ST_CODE_CONFIG, "%s (%s) names step %lld, but train.steps is %lld (%s): the drill would never fire",
                            keys[i], st_config_source(c, keys[i]), (long long)n, (long long)steps, st_config_source(c, "train.steps"));
  }
  const char* v = st_config_string(c, "faults.hang_in");
  const char* colon = v ? strrchr(v, ':') : NULL;
  if (!colon) return ST_OK;
  char* end = NULL;
  errno = 0;
  long long step = isdigit((unsigned char)colon[1]) ? strtoll(colon + 1, &end, 10) : -1;
  st_status s = ST_OK;
  if (step < 1 || errno || !end || *end)
    s = st_status_make(ST_CODE_CONFIG, "faults.hang_in=%s: the part after ':' must be a step (1-based), e.g. %.*s:3", v,
                       (int)(colon - v), v);
  else if (step > steps)
    s = st_status_make(ST_CODE_CONFIG, "faults.hang_in=%s names step %lld, but train.steps is %lld (%s): the drill would never fire",
                       v, step, (long long)steps, st_config_source(c, "train.steps"));
  if (s) s = st_status_annotate(s, "faults.hang_in (%s)", st_config_source(c, "faults.hang_in"));
  return s;
}

static st_status st__rule_dump(const st_config* c) {
  int64_t step = 0;
  int lo = -1, hi = -1;
  st_status s = st_config_dump_parse(st_config_string(c, "diag.dump"), &step, &lo, &hi);
  if (!s && step > st_config_int(c, "train.steps"))
    s = st_status_make(ST_CODE_CONFIG, "diag.dump names step %lld, but train.steps is %lld (%s): nothing would be dumped",
                       (long long)step, (long long)st_config_int(c, "train.steps"), st_config_source(c, "train.steps"));
  if (!s && step > 0 && hi >= st_config_int(c, "model.n_layers"))
    s = st_status_make(ST_CODE_CONFIG, "diag.dump names layers %d-%d, but model.n_layers is %lld (%s); layers count from 0", lo,
                       hi, (long long)st_config_int(c, "model.n_layers"), st_config_source(c, "model.n_layers"));
  if (s) s = st_status_annotate(s, "diag.dump (%s)", st_config_source(c, "diag.dump"));
  return s;
}

static st_status st__rule_numerics(const st_config* c) {
  if (!strcmp(st_config_string(c, "diag.numerics"), "off")) return ST_OK;
  if (st_config_int(c, "parallel.fsdp") <= 1 && st_config_int(c, "parallel.tensor") <= 1) return ST_OK;
  return st_status_make(ST_CODE_CONFIG,
                        "diag.numerics=%s (%s) has statistics programs for one device's whole tensors only; with "
                        "parallel.fsdp=%lld and parallel.tensor=%lld set diag.numerics=off",
                        st_config_string(c, "diag.numerics"), st_config_source(c, "diag.numerics"),
                        (long long)st_config_int(c, "parallel.fsdp"), (long long)st_config_int(c, "parallel.tensor"));
}

/* train.optimizer_groups' entries (docs/scheduling.md, "Optimizer state"): SELECTOR=OPTIMIZER
 * with a known optimizer; the selector embed, head, vectors, matrices or a
 * block group's name, which only the exporter knows (it refuses an unknown
 * one, exit 2): here only its spelling is checked. */
static const char* const kOptimizers[] = {"adamw", "sgd", "lion", "adafactor", "muon"};

static bool st__optimizer_known(const char* name, size_t n) {
  for (size_t i = 0; i < sizeof(kOptimizers) / sizeof(kOptimizers[0]); ++i)
    if (strlen(kOptimizers[i]) == n && !strncmp(kOptimizers[i], name, n)) return true;
  return false;
}

static bool st__selector_spelled(const char* sel, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!islower((unsigned char)sel[i]) && !isdigit((unsigned char)sel[i]) && sel[i] != '_') return false;
  return n > 0 && islower((unsigned char)sel[0]);
}

static st_status st__optimizer_entry(const st_config* c, int i, const char* e) {
  const char* src = st_config_source(c, "train.optimizer_groups");
  const char* eq = strchr(e, '=');
  if (!eq || eq == e || !eq[1] || strchr(eq + 1, '='))
    return st_status_make(ST_CODE_CONFIG,
                          "train.optimizer_groups (%s): entry %d '%s' is not SELECTOR=OPTIMIZER (e.g. matrices=muon)", src,
                          i + 1, e);
  const size_t ns = (size_t)(eq - e);
  if (!st__selector_spelled(e, ns))
    return st_status_make(ST_CODE_CONFIG,
                          "train.optimizer_groups (%s): entry %d '%s': unknown selector '%.*s'; one of embed, head, "
                          "vectors, matrices or a block group's name (lowercase letters, digits and '_', e.g. block)",
                          src, i + 1, e, (int)ns, e);
  if (!st__optimizer_known(eq + 1, strlen(eq + 1)))
    return st_status_make(ST_CODE_CONFIG,
                          "train.optimizer_groups (%s): entry %d '%s': unknown optimizer '%s'; one of adamw, sgd, lion, "
                          "adafactor, muon",
                          src, i + 1, e, eq + 1);
  const bool not_matrix = (ns == 5 && !strncmp(e, "embed", 5)) || (ns == 4 && !strncmp(e, "head", 4)) ||
                          (ns == 7 && !strncmp(e, "vectors", 7));
  if (not_matrix && !strcmp(eq + 1, "muon"))
    return st_status_make(ST_CODE_CONFIG,
                          "train.optimizer_groups (%s): entry %d '%s': muon updates hidden matrices only (rank 2, outside "
                          "the embedding and the head), and %.*s has none; give %.*s another optimizer, and muon to "
                          "matrices or a block group",
                          src, i + 1, e, (int)ns, e, (int)ns, e);
  return ST_OK;
}

/* adafactor's factored moments and muon's orthogonalisation need each
 * parameter whole: on a device mesh of one process their update is an SPMD
 * program that all-gathers the blocks (docs/model.md, "Optimizers"); an
 * fsdp axis across processes would need those gathers between processes,
 * around one-device programs, which is not built (elementwise adamw, sgd
 * and lion update their blocks alone). "Used": train.optimizer or any entry
 * names it. */
static st_status st__optimizer_sharded(const st_config* c) {
  const int64_t f = st_config_int(c, "parallel.fsdp"), d = st_config_int(c, "parallel.data");
  const int64_t procs = st_config_int(c, "parallel.processes");
  if (procs <= 1 || f <= 1 || d > 1) return ST_OK; /* fsdp spans the processes only when data is 1 */
  const char* def = st_config_string(c, "train.optimizer");
  const char* hit = NULL;
  const char* key = "train.optimizer";
  if (!strcmp(def, "adafactor") || !strcmp(def, "muon")) hit = def;
  for (int i = 0; !hit && i < st_config_list_count(c, "train.optimizer_groups"); ++i) {
    const char* eq = strchr(st_config_list_item(c, "train.optimizer_groups", i), '=');
    if (!strcmp(eq + 1, "adafactor") || !strcmp(eq + 1, "muon")) {
      hit = eq + 1;
      key = "train.optimizer_groups";
    }
  }
  if (!hit) return ST_OK;
  return st_status_make(ST_CODE_CONFIG,
                        "%s (%s) uses %s with parallel.fsdp=%lld (%s) across parallel.processes=%lld (%s): %s's update "
                        "needs each parameter whole, gathered across processes, which is not built; use adamw, sgd or "
                        "lion there, or put parallel.data across the processes (fsdp inside each)",
                        key, st_config_source(c, key), hit, (long long)f, st_config_source(c, "parallel.fsdp"),
                        (long long)procs, st_config_source(c, "parallel.processes"), hit);
}

static st_status st__rule_optimizer(const st_config* c) {
  const int n = st_config_list_count(c, "train.optimizer_groups");
  for (int i = 0; i < n; ++i) ST_RETURN(st__optimizer_entry(c, i, st_config_list_item(c, "train.optimizer_groups", i)));
  return st__optimizer_sharded(c);
}

static st_status st__rule_skip(const st_config* c) {
  st_status s = st_config_check_skip_per_layer(!strcmp(st_config_string(c, "diag.on_nonfinite"), "skip"),
                                               !strcmp(st_config_string(c, "sched.optimizer"), "per_layer"));
  if (s) s = st_status_annotate(s, "diag.on_nonfinite (%s), sched.optimizer (%s)", st_config_source(c, "diag.on_nonfinite"),
                                st_config_source(c, "sched.optimizer"));
  return s;
}

/* Per-layer updates need each layer's reduced gradient the moment it is
 * final, which bucketed reduction postpones. */
/* parallel.pipeline_layers: P x V whole numbers >= 1 summing to the layers. */
static st_status st__pipeline_layers(const st_config* c, int64_t chunks, int64_t layers) {
  const int n = st_config_list_count(c, "parallel.pipeline_layers");
  const char* src = st_config_source(c, "parallel.pipeline_layers");
  if (n == 0) return ST_OK;
  if (n != chunks)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.pipeline_layers (%s) has %d entries; it needs one per stage chunk, parallel.pipeline "
                          "x sched.pipeline_virtual = %lld (or leave it empty to balance the stages)",
                          src, n, (long long)chunks);
  int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    const char* v = st_config_list_item(c, "parallel.pipeline_layers", i);
    char* end = NULL;
    long long k = strtoll(v, &end, 10);
    if (!*v || *end || k < 1 || k > layers)
      return st_status_make(ST_CODE_CONFIG,
                            "parallel.pipeline_layers (%s): entry %d '%s' is not a layer count from 1 to model.n_layers "
                            "(%lld)",
                            src, i + 1, v, (long long)layers);
    sum += k;
  }
  if (sum != layers)
    return st_status_make(ST_CODE_CONFIG, "parallel.pipeline_layers (%s) sums to %lld layers, but model.n_layers is %lld (%s)",
                          src, (long long)sum, (long long)layers, st_config_source(c, "model.n_layers"));
  return ST_OK;
}

/* What a pipeline needs of the step (docs/parallelism.md, "Pipeline"). */
static st_status st__rule_pipeline(const st_config* c) {
  const int64_t P = st_config_int(c, "parallel.pipeline"), V = st_config_int(c, "sched.pipeline_virtual"),
                M = st_config_int(c, "train.microbatches"), L = st_config_int(c, "model.n_layers");
  const char* sched = st_config_string(c, "sched.pipeline_schedule");
  const bool inter = !strcmp(sched, "interleaved");
  const char *sp = st_config_source(c, "parallel.pipeline"), *sv = st_config_source(c, "sched.pipeline_virtual"),
             *ss = st_config_source(c, "sched.pipeline_schedule"), *sm = st_config_source(c, "train.microbatches");
  if (V > 1 && !inter)
    return st_status_make(ST_CODE_CONFIG,
                          "sched.pipeline_virtual=%lld (%s) with sched.pipeline_schedule=%s (%s): model chunks per stage "
                          "are for the interleaved schedule; set sched.pipeline_schedule=interleaved or "
                          "sched.pipeline_virtual=1",
                          (long long)V, sv, sched, ss);
  if (P <= 1 && st_config_list_count(c, "parallel.pipeline_layers") > 0)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.pipeline_layers (%s) splits the layers into stages, but parallel.pipeline is 1 (%s): "
                          "set parallel.pipeline to the stage count or leave parallel.pipeline_layers empty",
                          st_config_source(c, "parallel.pipeline_layers"), sp);
  if (P <= 1) return ST_OK;
  if (inter && V < 2)
    return st_status_make(ST_CODE_CONFIG,
                          "sched.pipeline_schedule=interleaved (%s) needs sched.pipeline_virtual of 2 or more (%lld, %s): "
                          "the model chunks each stage holds",
                          ss, (long long)V, sv);
  if (M < P)
    return st_status_make(ST_CODE_CONFIG,
                          "train.microbatches=%lld (%s) is less than parallel.pipeline=%lld (%s): every stage needs a "
                          "microbatch of its own in flight; set train.microbatches to %lld or more",
                          (long long)M, sm, (long long)P, sp, (long long)P);
  if (inter && M % P != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "sched.pipeline_schedule=interleaved (%s) needs train.microbatches (%lld, %s) divisible by "
                          "parallel.pipeline (%lld, %s): microbatches go through the chunks in groups of one per stage",
                          ss, (long long)M, sm, (long long)P, sp);
  if (L < P * V)
    return st_status_make(ST_CODE_CONFIG,
                          "model.n_layers=%lld (%s) is fewer than parallel.pipeline x sched.pipeline_virtual = %lld x "
                          "%lld = %lld: every stage chunk needs at least one layer",
                          (long long)L, st_config_source(c, "model.n_layers"), (long long)P, (long long)V,
                          (long long)(P * V));
  ST_RETURN(st__pipeline_layers(c, P * V, L));
  return ST_OK;
}

static st_status st__rule_grad_reduce(const st_config* c) {
  if (st_config_int(c, "parallel.data") < 2 || strcmp(st_config_string(c, "sched.optimizer"), "per_layer") != 0 ||
      strcmp(st_config_string(c, "sched.grad_reduce"), "bucketed") != 0)
    return ST_OK;
  return st_status_make(ST_CODE_CONFIG,
                        "sched.optimizer=per_layer (%s) updates each layer as soon as its gradient is reduced, so with "
                        "parallel.data=%lld (%s) it needs sched.grad_reduce=per_layer, not bucketed (%s)",
                        st_config_source(c, "sched.optimizer"), (long long)st_config_int(c, "parallel.data"),
                        st_config_source(c, "parallel.data"), st_config_source(c, "sched.grad_reduce"));
}

static st_status st__rule_trace_steps(const st_config* c) {
  int64_t steps = st_config_int(c, "train.steps");
  int n = st_config_list_count(c, "trace.steps");
  for (int i = 0; i < n; ++i) {
    const char* v = st_config_list_item(c, "trace.steps", i);
    char* end = NULL;
    long long k = strtoll(v, &end, 10);
    if (!v[0] || *end || k < 1)
      return st_status_make(ST_CODE_CONFIG, "trace.steps (%s): item %d is '%s', expected a step number >= 1",
                            st_config_source(c, "trace.steps"), i + 1, v);
    if (k > steps)
      return st_status_make(ST_CODE_CONFIG, "trace.steps (%s) lists step %lld, but train.steps is %lld (%s)",
                            st_config_source(c, "trace.steps"), k, (long long)steps, st_config_source(c, "train.steps"));
  }
  return ST_OK;
}

/* run.id becomes a folder name under runs/: a path separator would escape
 * runs/, a control character would break every line-based log, and a
 * long id would be cut by file systems. */
static st_status st__rule_run_id(const st_config* c) {
  const char* id = st_config_string(c, "run.id");
  size_t n = strlen(id);
  if (n == 0) return ST_OK;
  const char* why = NULL;
  if (n > ST_CONFIG_MAX_RUN_ID) {
    why = "is too long";
  } else if (id[0] == '.') {
    why = "starts with '.'";
  } else {
    for (size_t i = 0; i < n && !why; ++i) {
      char ch = id[i];
      bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                   ch == '_' || ch == '-';
      if (!plain) why = ch == '/' ? "contains '/'" : "contains a character other than letters, digits, '.', '_' and '-'";
    }
  }
  if (!why) return ST_OK;
  char shown[400];
  st__cfg_quote(id, n, shown, sizeof(shown));
  return st_status_make(ST_CODE_CONFIG,
                        "run.id: '%s' %s (%zu bytes); run.id names a folder under runs/: use letters, digits, '.', '_' "
                        "and '-', at most %d, not starting with '.' (or set run.dir) (%s)",
                        shown, why, n, ST_CONFIG_MAX_RUN_ID, st_config_source(c, "run.id"));
}

/* Pipeline stages (docs/parallelism.md, "Pipeline"): each stage has the
 * data x fsdp x tensor devices of its own, in one process. */
static st_status st__pipeline_devices(const st_config* c) {
  int64_t d = st_config_int(c, "parallel.data"), f = st_config_int(c, "parallel.fsdp"),
          t = st_config_int(c, "parallel.tensor"), p = st_config_int(c, "parallel.pipeline"),
          dev = st_config_int(c, "runtime.cpu_devices");
  if (st_config_int(c, "parallel.processes") > 1)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.pipeline=%lld (%s) in a job of %lld processes: pipeline stages across processes "
                          "are not built yet; run the pipeline in one process (docs/parallelism.md, \"Pipeline\")",
                          (long long)p, st_config_source(c, "parallel.pipeline"),
                          (long long)st_config_int(c, "parallel.processes"));
  if (d * f * t * p > dev)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.pipeline x parallel.data x parallel.fsdp x parallel.tensor = %lld x %lld x %lld x "
                          "%lld = %lld devices (%s, %s, %s, %s), but runtime.cpu_devices is %lld (%s)",
                          (long long)p, (long long)d, (long long)f, (long long)t, (long long)(p * d * f * t),
                          st_config_source(c, "parallel.pipeline"), st_config_source(c, "parallel.data"),
                          st_config_source(c, "parallel.fsdp"), st_config_source(c, "parallel.tensor"), (long long)dev,
                          st_config_source(c, "runtime.cpu_devices"));
  return ST_OK;
}

/* The mesh (docs/parallelism.md): it must fit the devices, and every split
 * it implies must come out even. */
static st_status st__rule_parallel(const st_config* c) {
  int64_t d = st_config_int(c, "parallel.data"), f = st_config_int(c, "parallel.fsdp"),
          t = st_config_int(c, "parallel.tensor"), dev = st_config_int(c, "runtime.cpu_devices");
  const char *sd = st_config_source(c, "parallel.data"), *sf = st_config_source(c, "parallel.fsdp"),
             *stt = st_config_source(c, "parallel.tensor");
  const int64_t procs = st_config_int(c, "parallel.processes");
  if (st_config_int(c, "parallel.pipeline") > 1) ST_RETURN(st__pipeline_devices(c));
  if (d * f * t > dev * procs && procs == 1)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.data x parallel.fsdp x parallel.tensor = %lld x %lld x %lld = %lld devices (%s, %s, "
                          "%s), but runtime.cpu_devices is %lld (%s)",
                          (long long)d, (long long)f, (long long)t, (long long)(d * f * t), sd, sf, stt, (long long)dev,
                          st_config_source(c, "runtime.cpu_devices"));
  if (d * f * t > dev * procs)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.data x parallel.fsdp x parallel.tensor = %lld x %lld x %lld = %lld devices (%s, %s, "
                          "%s), but %lld processes x runtime.cpu_devices %lld (%s) have %lld",
                          (long long)d, (long long)f, (long long)t, (long long)(d * f * t), sd, sf, stt, (long long)procs,
                          (long long)dev, st_config_source(c, "runtime.cpu_devices"), (long long)(dev * procs));
  int64_t h = st_config_int(c, "model.n_heads"), ff = st_config_int(c, "model.d_ff");
  if (h % t != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "model.n_heads (%lld, %s) is not divisible by parallel.tensor (%lld, %s): tensor parallelism "
                          "splits the attention heads",
                          (long long)h, st_config_source(c, "model.n_heads"), (long long)t, stt);
  int64_t kv = st_config_int(c, "model.n_kv_heads");
  if (kv > 0 && kv % t != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "model.n_kv_heads (%lld, %s) is not divisible by parallel.tensor (%lld, %s): tensor "
                          "parallelism splits the key/value heads",
                          (long long)kv, st_config_source(c, "model.n_kv_heads"), (long long)t, stt);
  if (ff % t != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "model.d_ff (%lld, %s) is not divisible by parallel.tensor (%lld, %s): tensor parallelism "
                          "splits the MLP hidden dimension",
                          (long long)ff, st_config_source(c, "model.d_ff"), (long long)t, stt);
  int64_t b = st_config_int(c, "train.batch_size"), m = st_config_int(c, "train.microbatches");
  if ((b / m) % (d * f) != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "the microbatch train.batch_size / train.microbatches = %lld / %lld = %lld (%s, %s) is not "
                          "divisible by parallel.data x parallel.fsdp = %lld x %lld = %lld (%s, %s): every device "
                          "takes an equal share of each microbatch",
                          (long long)b, (long long)m, (long long)(b / m), st_config_source(c, "train.batch_size"),
                          st_config_source(c, "train.microbatches"), (long long)d, (long long)f, (long long)(d * f), sd,
                          sf);
  return ST_OK;
}

static const st__cfg_rule kRules[] = {
    {"model.d_model is divisible by model.n_heads, and the head size model.d_model / model.n_heads is even (RoPE); "
     "model.n_kv_heads is 0 or divides model.n_heads.",
     st__rule_heads},
    {"model.layers is empty or names one block kind per layer (model.n_layers of them); model.block is not empty.",
     st__rule_layers},
    {"model.moe_top_k is at most model.n_experts.", st__rule_moe},
    {"train.batch_size is divisible by train.microbatches.", st__rule_microbatches},
    {"model.vocab_size is at least 256 (the byte tokenizer) unless data.synthetic is true.", st__rule_vocab},
    {"model.vocab_padded is 0 or at least model.vocab_size.", st__rule_vocab_padded},
    {"data.tokenizer=bpe: data.vocab_size (0: model.vocab_size) is from 256 to model.vocab_size, and data.synthetic "
     "is false; data.tokenizer=byte: data.vocab_size is 0 or 256.",
     st__rule_tokenizer},
    {"data.sources (at most 64) needs data.packing none or pack and data.synthetic false, with one data.weights "
     "number > 0 each; data.prompt_marker needs data.packing "
     "none or pack, one line other than data.separator.",
     st__rule_packing},
    {"sched.remat is auto, none, full, every:K (K >= 1) or a list of layers below model.n_layers.", st__rule_remat},
    {"sched.memory_budget is bytes (a whole number, 0: no limit) or a fraction in (0, 1] such as 0.9.",
     st__rule_memory_budget},
    {"sched.optimizer=per_layer needs train.grad_clip=0 (clipping needs the global norm before any update).",
     st__rule_per_layer},
    {"sched.optimizer=per_layer with parallel.data > 1 needs sched.grad_reduce=per_layer.", st__rule_grad_reduce},
    {"trace.steps are step numbers from 1 to train.steps.", st__rule_trace_steps},
    {"faults.nan_at is empty or STEP:LAYER[:TENSOR] with STEP at most train.steps, LAYER below model.n_layers and "
     "faults.nan_micro below train.microbatches.",
     st__rule_nan_at},
    {"faults.crash_at_step and faults.hang_at_step are at most train.steps; faults.hang_in is PROGRAM or PROGRAM:STEP "
     "with STEP from 1 to train.steps.",
     st__rule_fault_steps},
    {"train.optimizer_groups entries are SELECTOR=OPTIMIZER: SELECTOR embed, head, vectors, matrices or a block "
     "group's name, OPTIMIZER one of train.optimizer's; muon not on embed, head or vectors; adafactor and muon "
     "(in train.optimizer or an entry) not with parallel.fsdp across parallel.processes (parallel.data=1).",
     st__rule_optimizer},
    {"diag.on_nonfinite=skip needs sched.optimizer=after_backward.", st__rule_skip},
    {"diag.numerics other than off needs parallel.fsdp=1 and parallel.tensor=1.", st__rule_numerics},
    {"diag.dump is empty, step:N or step:N,layers:A-B with N from 1 to train.steps and A <= B below model.n_layers.",
     st__rule_dump},
    {"run.id is empty or a plain name: letters, digits, '.', '_' and '-', at most 128, not starting with '.'.",
     st__rule_run_id},
    {"parallel.pipeline x parallel.data x parallel.fsdp x parallel.tensor is at most runtime.cpu_devices x parallel.processes; model.n_heads, "
     "model.n_kv_heads (when set) and model.d_ff are divisible by parallel.tensor; train.batch_size / train.microbatches is divisible by parallel.data x "
     "parallel.fsdp.",
     st__rule_parallel},
    {"parallel.pipeline > 1: train.microbatches is at least parallel.pipeline (and, interleaved, divisible by it); "
     "model.n_layers is at least parallel.pipeline x sched.pipeline_virtual; parallel.pipeline_layers is empty or one "
     "layer count per stage chunk summing to model.n_layers, and empty without a pipeline; sched.pipeline_virtual > 1 exactly when "
     "sched.pipeline_schedule=interleaved; one process.",
     st__rule_pipeline},
};

/* ---- lookups ------------------------------------------------------------ */

#define ST__COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

const st__cfg_key* st__cfg_schema(int* count) {
  *count = ST__COUNT(kKeys);
  return kKeys;
}
const st__cfg_rule* st__cfg_rules(int* count) {
  *count = ST__COUNT(kRules);
  return kRules;
}
const st__cfg_env* st__cfg_envs(int* count) {
  *count = ST__COUNT(kEnvs);
  return kEnvs;
}
const st__cfg_section* st__cfg_sections(int* count) {
  *count = ST__COUNT(kSections);
  return kSections;
}

int st__cfg_find(const char* key, size_t len) {
  for (int i = 0; i < ST__COUNT(kKeys); ++i)
    if (strlen(kKeys[i].key) == len && memcmp(kKeys[i].key, key, len) == 0) return i;
  return -1;
}

bool st__cfg_is_section(const char* prefix, size_t len) {
  for (int i = 0; i < ST__COUNT(kKeys); ++i)
    if (strlen(kKeys[i].key) > len && memcmp(kKeys[i].key, prefix, len) == 0 && kKeys[i].key[len] == '.') return true;
  return false;
}

const char* st__cfg_type_name(st__cfg_type type) {
  switch (type) {
    case ST__CFG_INT: return "int";
    case ST__CFG_FLOAT: return "float";
    case ST__CFG_BOOL: return "bool";
    case ST__CFG_STRING: return "string";
    case ST__CFG_ENUM: return "enum";
    case ST__CFG_LIST: return "list";
  }
  return "?";
}

void st__cfg_range(const st__cfg_key* k, char* buf, size_t cap) {
  char lo[40], hi[40];
  if (k->type == ST__CFG_INT) {
    snprintf(lo, sizeof(lo), "%.0f", k->lo);
    snprintf(hi, sizeof(hi), "%.0f", k->hi);
  } else {
    st__cfg_fmt_bound(k->lo, lo);
    st__cfg_fmt_bound(k->hi, hi);
  }
  snprintf(buf, cap, "%c%s, %s%c", k->lo_open ? '(' : '[', lo, hi, k->hi_open ? ')' : ']');
}

void st__cfg_expected(const st__cfg_key* k, char* buf, size_t cap) {
  char range[96];
  switch (k->type) {
    case ST__CFG_INT:
    case ST__CFG_FLOAT:
      st__cfg_range(k, range, sizeof(range));
      snprintf(buf, cap, "expected %s in %s", st__cfg_type_name(k->type), range);
      return;
    case ST__CFG_BOOL: snprintf(buf, cap, "expected true or false"); return;
    case ST__CFG_STRING: snprintf(buf, cap, "expected a string"); return;
    case ST__CFG_ENUM: {
      /* "f32|bf16" -> "one of f32, bf16" */
      size_t n = (size_t)snprintf(buf, cap, "expected one of ");
      for (const char* p = k->choices; *p && n + 3 < cap; ++p) {
        if (*p == '|') {
          buf[n++] = ',';
          buf[n++] = ' ';
        } else {
          buf[n++] = *p;
        }
      }
      buf[n < cap ? n : cap - 1] = '\0';
      return;
    }
    case ST__CFG_LIST: snprintf(buf, cap, "expected a list of strings, written [a, b]"); return;
  }
  snprintf(buf, cap, "expected ?");
}
