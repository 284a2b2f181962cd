"""Memory: the levers and the planner that chooses among them.

    levers.py    activation checkpointing of a model's blocks, OOM recovery (the core's: the loop uses them)
    selective.py what a checkpointed block keeps: the per-op policies of selective recompute (core)
    offload.py   activation offload: saved tensors to pinned host memory (CUDA) or a file (CPU) (core)
    chunked_loss.py  the LM head + cross-entropy over token chunks, Liger's fused kernel on CUDA (core)
    optim_offload.py the optimizer state out of memory between steps (core)
    estimate.py  `ecotrain plan`: parameters, gradients, optimizer state and measured activations
    planner.py   `memory.budget`: the plans, the choice among measured peaks, the record a run keeps
    measure.py   one plan measured: a few real steps in a fresh process (worker.py is that process)

Nothing is imported here: the core imports `memory.levers` (and through it `selective` and
`offload`) without pulling in the planner.
"""
